#pragma once
// Context-parallel MHLA over MPI: the ranks of a communicator hold consecutive
// shards of the same sequences (mhla/shards.hpp: whole blocks, in rank order)
// and compute exactly what mhla::forward / mhla::backward compute on the whole
// sequence, exchanging block summaries instead of tokens.
//
// Forward: each rank summarises its blocks (phase 1), receives the summaries
// it reads, mixes its rows of W over them (phase 2) and reads out (phase 3).
// Dense W: an all-to-all sends each rank's summaries to the ranks that read
// them (every rank without masking; only later ranks with causal or
// block-causal masking). Toeplitz w: an exclusive prefix sum over the ranks
// plus the L - 1 blocks before the rank's first (w weighs all blocks at least
// L back alike). Backward: the phases' backward; the summary gradients go
// back to their owners, which add them in rank order; grad_w is reduced over
// the ranks. What a rank sends never grows with N: with dense W it grows with
// M, with Toeplitz w it depends on L only.
//
// Every rank passes the same options (options.layout is the WHOLE sequence's
// layout), the same w, and its own shard of q, k, v, o, grad_o [B, N_r, H, D];
// grad_w is the full gradient on every rank. Results are deterministic for a
// fixed number of ranks (every sum runs in a fixed order).
//
// Errors: every rank checks its own inputs; the ranks then agree before each
// exchange, so that a problem on one rank (a shard that does not end at a
// block boundary, shapes or options or w that differ from rank 0's, a
// non-finite result) becomes the same mhla::Error on every rank, naming the
// rank, instead of a hang. A rank that dies is MPI's to report: mpirun ends
// the job. Supported T: float, double. Needs MPI_Init(_thread) first.
#include <mpi.h>

#include <cstdint>

#include "mhla/options.hpp"
#include "mhla/tensor.hpp"

namespace mhla {

// What one call of this rank handed to MPI, in bytes.
struct ContextParallelTraffic {
  int64_t summary_bytes_sent = 0;      // summaries and their gradients, to other ranks
  int64_t summary_bytes_received = 0;  // the same, from other ranks
  int64_t reduction_bytes = 0;         // grad_w: this rank's buffer in the reduction
  int64_t control_bytes = 0;           // call descriptors and error agreement (sent)
  ContextParallelTraffic& operator+=(const ContextParallelTraffic& other);
};

// o [B, N_r, H, Dv]: this rank's shard of mhla::forward's result.
template <typename T>
void context_parallel_forward(MPI_Comm comm, const Options& options, TensorView<const T> q,
                              TensorView<const T> k, TensorView<const T> v, TensorView<const T> w,
                              TensorView<T> o, ContextParallelTraffic* traffic = nullptr);

// The shards of mhla::backward's grad_q, grad_k, grad_v, and its whole grad_w
// (written, not added to). o must be context_parallel_forward's result.
template <typename T>
void context_parallel_backward(MPI_Comm comm, const Options& options, TensorView<const T> q,
                               TensorView<const T> k, TensorView<const T> v, TensorView<const T> w,
                               TensorView<const T> o, TensorView<const T> grad_o,
                               TensorView<T> grad_q, TensorView<T> grad_k, TensorView<T> grad_v,
                               TensorView<T> grad_w, ContextParallelTraffic* traffic = nullptr);

}  // namespace mhla
