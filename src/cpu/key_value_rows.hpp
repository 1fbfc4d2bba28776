#pragma once
// What the float and the bfloat16 kernels' key and value gradients
// (ChunkedAttention, Bf16Backward) do alike for a block: request the next
// block's rows while this one's products run, and scatter the block's
// gradients.
#include "core/validate.hpp"
#include "cpu/block_rows.hpp"
#include "cpu/block_tasks.hpp"

namespace mhla::cpu {

// The rows of the task after `task`, if any: its dS, k and (where grad_k is
// not streamed) v during the block's first product; v (where grad_k is
// streamed) and the rows of grad_k and grad_v that are not streamed during
// the second. Streamed gradients need no lines requested, which leaves the
// second product's steps to the values.
template <typename S, typename T>
void request_key_value_rows(const mhla::detail::Problem& p, int64_t task, const S* k, const S* v,
                            const T* summaries_grad, const S* grad_k, const S* grad_v,
                            const RowWriter<S>& k_rows, const RowWriter<S>& v_rows,
                            RowLines& next_reads, RowLines& next_writes) {
  next_reads.clear();
  next_writes.clear();
  if (task + 1 >= task_count(p)) return;
  const auto& d = p;
  const BlockTask next = block_task(p, task + 1);
  next_reads.add_span_read(summaries_grad + next.summary, d.dk * (d.dv + 1));
  next_reads.add_read(p.table, next.block, k, next.qk, d.dk);
  (k_rows.streaming() ? next_writes : next_reads).add_read(p.table, next.block, v, next.v, d.dv);
  if (!k_rows.streaming()) next_writes.add_write(p.table, next.block, grad_k, next.qk, d.dk);
  if (!v_rows.streaming()) next_writes.add_write(p.table, next.block, grad_v, next.v, d.dv);
}

// grad_k = phi'(k) (dphi(K) + 1 dz^T) and grad_v = dV for the block's rows;
// whether both are finite.
template <typename S, typename T>
bool scatter_key_value_gradients(const mhla::detail::Problem& p, const BlockTask& t, const T* kap,
                                 const T* dkap, const T* dz, const T* dvalues, RowWriter<S>& k_rows,
                                 S* grad_k, RowWriter<S>& v_rows, S* grad_v) {
  const auto& d = p;
  const bool finite_k = scatter_through_feature(p.table, t.block, p.phi, kap, dkap, d.dk, t.qk,
                                                d.dk, k_rows, grad_k, RowBias<T>{dz});
  const bool finite_v = scatter_rows(p.table, t.block, dvalues, d.dv, t.v, d.dv, v_rows, grad_v);
  return finite_k && finite_v;
}

}  // namespace mhla::cpu
