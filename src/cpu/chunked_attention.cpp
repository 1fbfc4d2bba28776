#include "cpu/chunked_attention.hpp"

#include <algorithm>
#include <vector>

#include "core/element.hpp"
#include "cpu/block_products.hpp"
#include "cpu/block_rows.hpp"
#include "cpu/key_value_rows.hpp"
#include "cpu/workspace.hpp"
#include "mhla/line_aligned.hpp"

namespace mhla::cpu {
namespace {

// Per-thread tiles start on cache lines, and tiles of Dv + 1 columns have
// rows of whole lines (ld_x1_): rows at a 16-byte offset made the products'
// vector loads straddle two lines (a slower forward and backward in mhla_bench).
template <typename T>
using Tile = mhla::detail::LineAlignedVector<T>;

// [V_b | 1]: the block's values with a column of ones appended, so one GEMM
// yields both S_b and z_b (and both num_t and den_t); rows ld apart.
template <typename T>
void gather_values_with_ones(const mhla::detail::BlockTableView& layout, int64_t block, const T* v,
                             HeadSlice s, int64_t dv, int64_t rows, T* dst, int64_t ld) {
  gather_rows(layout, block, FeatureMap::identity, v, s, dv, dst, ld);
  for (int64_t r = 0; r < rows; ++r) dst[r * ld + dv] = T(1);
}

// tile[a, 0:Dv] = S[a, 0:Dv]: the S part of a [Dk, Dv + 1] mixed summary as
// the read-out's B operand. In the summary's own layout every row starts off
// a cache line, so every vector load of the product straddles two; the copy
// makes mhla_bench's forward faster. (The same copy of dS for
// key_value_gradients' dV product gained nothing.)
template <typename T>
void summary_part(const T* summary, int64_t dk, int64_t dv, T* tile) {
  for (int64_t a = 0; a < dk; ++a)
    std::copy(summary + a * (dv + 1), summary + a * (dv + 1) + dv, tile + a * dv);
}

// The causal in-block terms work on [C, C] matrices whose entries above the
// diagonal are zero (query row r sees key columns c <= r). Their products run
// over row tiles of kTriangleTile rows, each reading only the columns up to
// the end of its own tile: 56% of the full products' work at C = 256. The
// skipped terms are exact zeros, so each sum is the full one, bit for bit.
// Entries right of a row's tile are never written nor read. 32 rows: the
// fastest of 16, 32 and 64 in mhla_bench's causal table (AVX-512).
constexpr int64_t kTriangleTile = 32;

// a = mask(x y^T), a [rows, rows]; x and y are [rows, width] with rows ld
// apart. y^T is formed once (the products read B by rows) rather than once per
// tile.
template <typename T>
void lower_scores(int64_t rows, int64_t width, const T* x, const T* y, int64_t ld, T* a) {
  thread_local Tile<T> transposed;
  transposed.resize(size_t(width * rows));
  transpose(y, ld, rows, width, transposed.data());
  for (int64_t r0 = 0; r0 < rows; r0 += kTriangleTile) {
    const int64_t r1 = std::min(rows, r0 + kTriangleTile);
    block_gemm(false, false, r1 - r0, r1, width, T(1), x + r0 * ld, ld, transposed.data(), rows,
               T(0), a + r0 * rows, rows);
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = r + 1; c < r1; ++c) a[r * rows + c] = T(0);
  }
}

// sum_{c <= r} l[r, c]: row r of l 1, apart from the products (a 65th column of
// ones in [V | 1] cost their tiles a pass of its own).
template <typename T>
T lower_row_sum(const T* l, int64_t rows, int64_t r) {
  T sum = 0;
  for (int64_t c = 0; c <= r; ++c) sum += l[r * rows + c];
  return sum;
}

// out = alpha l z (+ out when accumulating), l a masked [rows, rows] from
// lower_scores, z [rows, width].
template <typename T>
void lower_times(int64_t rows, int64_t width, T alpha, const T* l, const T* z, int64_t ldz,
                 bool accumulate, T* out, int64_t ldo) {
  for (int64_t r0 = 0; r0 < rows; r0 += kTriangleTile) {
    const int64_t r1 = std::min(rows, r0 + kTriangleTile);
    block_gemm(false, false, r1 - r0, width, r1, alpha, l + r0 * rows, rows, z, ldz,
               accumulate ? T(1) : T(0), out + r0 * ldo, ldo);
  }
}

// out = alpha l^T z: output row c sums over the rows r >= the start of c's tile.
template <typename T>
void lower_transposed_times(int64_t rows, int64_t width, T alpha, const T* l, const T* z,
                            int64_t ldz, T* out, int64_t ldo) {
  for (int64_t c0 = 0; c0 < rows; c0 += kTriangleTile) {
    const int64_t c1 = std::min(rows, c0 + kTriangleTile);
    block_gemm(true, false, c1 - c0, width, rows - c0, alpha, l + c0 * rows + c0, rows,
               z + c0 * ldz, ldz, T(0), out + c0 * ldo, ldo);
  }
}

}  // namespace

template <typename T>
ChunkedAttention<T>::ChunkedAttention(const mhla::detail::Problem& problem, const Mixer<T>& mixer)
    : p_(problem),
      mixer_(mixer),
      x1_(problem.dv + 1),
      ld_x1_(mhla::detail::round_up(problem.dv + 1,
                                    int64_t(mhla::detail::kCacheLine / sizeof(T)))),
      x_(problem.dk * (problem.dv + 1)),
      max_rows_(problem.table.max_block_size()) {}

template <typename T>
void ChunkedAttention<T>::in_block_scores(const BlockTask& t, const T* k, const T* v, const T* u,
                                          T* kap, T* vals, T* a) const {
  const auto& d = p_;
  gather_rows(p_.table, t.block, p_.phi, k, t.qk, d.dk, kap, d.dk);
  gather_values_with_ones(p_.table, t.block, v, t.v, d.dv, t.rows, vals, ld_x1_);
  lower_scores(t.rows, d.dk, u, kap, d.dk, a);
}

template <typename T>
bool ChunkedAttention<T>::forward(const T* q, const T* k, const T* v, T* o, T* summaries_out,
                                  T* mixed_out) const {
  const size_t total = size_t(task_count() * x_);
  T* summaries = summaries_out ? summaries_out : scratch<T>(Scratch::summaries, total);
  T* mixed = mixed_out ? mixed_out : scratch<T>(Scratch::mixed, total);
  compute_summaries(k, v, summaries);
  mixer_.mix(summaries, mixed);
  return compute_outputs(q, k, v, mixed, o);
}

template <typename T>
bool ChunkedAttention<T>::backward(const T* q, const T* k, const T* v, const T* grad_o, T* grad_q,
                                   T* grad_k, T* grad_v, T* grad_w, const T* saved_summaries,
                                   const T* saved_mixed) const {
  const size_t total = size_t(task_count() * x_);
  const T* summaries = saved_summaries;
  if (!summaries) {
    T* recomputed = scratch<T>(Scratch::summaries, total);
    compute_summaries(k, v, recomputed);
    summaries = recomputed;
  }
  T* mixed_grad = scratch<T>(Scratch::mixed, total);
  T* summaries_grad = scratch<T>(Scratch::summaries_grad, total);
  T* diagonal_grad = scratch<T>(KernelScratch::diagonal_grad, size_t(task_count()));
  // Recomputed, the mixed summaries are overwritten by their gradient, block
  // by block, once read.
  const T* mixed = saved_mixed;
  if (!mixed) {
    mixer_.mix(summaries, mixed_grad);
    mixed = mixed_grad;
  }
  const bool finite_q = output_gradients(q, k, v, grad_o, mixed, mixed_grad, diagonal_grad, grad_q,
                                         grad_k, grad_v, true);
  mixer_.mix_backward(mixed_grad, summaries, p_.causal ? diagonal_grad : nullptr, summaries_grad,
                      grad_w);
  const bool finite_kv = key_value_gradients(k, v, summaries_grad, grad_k, grad_v, p_.causal);
  return finite_q && finite_kv;
}

template <typename T>
template <typename S>
void ChunkedAttention<T>::compute_summaries(const S* k, const S* v, T* summaries) const {
  const auto& d = p_;
#pragma omp parallel
  {
    Tile<T> kap(max_rows_ * d.dk), vals(max_rows_ * d.dv);
    RowLines next_rows;
#pragma omp for schedule(static)
    for (int64_t task = 0; task < task_count(); ++task) {
      const BlockTask t = block_task(task);
      // The next task's keys and values arrive during this task's product.
      next_rows.clear();
      if (task + 1 < task_count()) {
        const BlockTask next = block_task(task + 1);
        next_rows.add_read(p_.table, next.block, k, next.qk, d.dk);
        next_rows.add_read(p_.table, next.block, v, next.v, d.dv);
        next_rows.add_span_write(summaries + next.summary, x_);
      }
      gather_rows(p_.table, t.block, p_.phi, k, t.qk, d.dk, kap.data(), d.dk);
      // V_b gathered into a tile even when it is one run of tokens: read in
      // place, its rows H * Dv floats apart fall into a few sets of L1 and
      // evict each other while the product re-reads them for every row tile.
      gather_rows(p_.table, t.block, FeatureMap::identity, v, t.v, d.dv, vals.data(), d.dv);
      // S_b = phi(K_b)^T V_b in the first Dv columns of [S_b | z_b] ...
      T* s = summaries + t.summary;
      block_gemm(true, false, d.dk, d.dv, t.rows, T(1), kap.data(), d.dk, vals.data(), d.dv, T(0),
                 s, x1_, next_rows.prefetch());
      // ... and z_b = phi(K_b)^T 1 in the last.
      column_sums(kap.data(), t.rows, d.dk, s + d.dv, x1_);
    }
  }
}

template <typename T>
bool ChunkedAttention<T>::compute_outputs(const T* q, const T* k, const T* v, const T* mixed,
                                          T* o) const {
  const auto& d = p_;
  const T eps = T(p_.eps), scale = T(p_.scale);
  const RowWrite write_o = result_write(d, d.dv, o);
  bool finite = true;
#pragma omp parallel
  {
    Tile<T> u(max_rows_ * d.dk), y(max_rows_ * d.dv), den(max_rows_), s_tile(d.dk * d.dv);
    Tile<T> kap, vals, a;
    RowLines next_rows;
    RowWriter<T> o_rows(write_o, d.dv);
    if (p_.causal) {
      kap.resize(max_rows_ * d.dk);
      vals.resize(max_rows_ * ld_x1_);
      a.resize(max_rows_ * max_rows_);
    }
#pragma omp for schedule(static) reduction(&& : finite)
    for (int64_t task = 0; task < task_count(); ++task) {
      const BlockTask t = block_task(task);
      // The next task's rows arrive during this task's product.
      next_rows.clear();
      if (task + 1 < task_count()) {
        const BlockTask next = block_task(task + 1);
        next_rows.add_span_read(mixed + next.summary, x_);
        next_rows.add_read(p_.table, next.block, q, next.qk, d.dk);
        if (p_.causal) {
          next_rows.add_read(p_.table, next.block, k, next.qk, d.dk);
          next_rows.add_read(p_.table, next.block, v, next.v, d.dv);
        }
        if (!o_rows.streaming()) next_rows.add_write(p_.table, next.block, o, next.v, d.dv);
      }
      gather_rows(p_.table, t.block, p_.phi, q, t.qk, d.dk, u.data(), d.dk);
      // y = phi(Q_i) S~_i by the GEMM, den = phi(Q_i) z~_i by a matrix-vector
      // product, as output_gradients forms it. (Dot products row by row spent
      // most of their time summing each row's vector of partial sums.)
      const T* mixed_i = mixed + t.summary;
      summary_part(mixed_i, d.dk, d.dv, s_tile.data());
      block_gemm(false, false, t.rows, d.dv, d.dk, T(1), u.data(), d.dk, s_tile.data(), d.dv, T(0),
                 y.data(), d.dv, next_rows.prefetch());
      if (p_.normalize) gemv(t.rows, d.dk, u.data(), d.dk, mixed_i + d.dv, x1_, den.data());
      if (p_.causal) {
        // [y | den] += W[i,i] mask(phi(Q_i) phi(K_i)^T) [V_i | 1]
        in_block_scores(t, k, v, u.data(), kap.data(), vals.data(), a.data());
        const T wii = mixer_.diagonal(t.bh, t.block);
        lower_times(t.rows, d.dv, wii, a.data(), vals.data(), ld_x1_, true, y.data(), d.dv);
        if (p_.normalize)
          for (int64_t r = 0; r < t.rows; ++r) den[r] += wii * lower_row_sum(a.data(), t.rows, r);
      }
      // x * 0 is NaN exactly when x is not finite (see scatter_rows).
      T probe = 0;
      for_each_row(p_.table, t.block, t.v, [&](int64_t row, int64_t offset) {
        const T* yr = y.data() + row * d.dv;
        T* out = o + offset;
        if (!o_rows.streaming()) prefetch_ahead(out, t.v.stride, d.dv);
        // An overflowed denominator would turn the row into silent zeros.
        T row_probe = p_.normalize ? den[row] * T(0) : T(0);
        const T factor = p_.normalize ? T(1) / (den[row] + eps) : scale;
        T* x = o_rows.target(out);
#pragma omp simd reduction(+ : row_probe)
        for (int64_t e = 0; e < d.dv; ++e) {
          const T value = yr[e] * factor;
          x[e] = value;
          row_probe += value * T(0);
        }
        probe += row_probe;
      });
      finite = finite && probe == probe;
    }
  }
  return finite;
}

namespace {

// One thread's tiles for output_gradients: the query rows phi(Q) (u), their
// denominators and gradients, dy [rows, Dv + 1], the z columns; and in causal
// mode the in-block ones (phi(K), [V | 1], A, B and the in-block gradients).
template <typename T>
struct OutputGradientTiles {
  Tile<T> u, den, dy, du, zt, dz, dy_z_rows;
  Tile<T> kap, vals, a, da, dkap, dvals;

  OutputGradientTiles(const mhla::detail::Problem& p, int64_t max_rows, int64_t ld_x1)
      : u(max_rows * p.dk), den(max_rows), dy(max_rows * ld_x1), du(max_rows * p.dk), zt(p.dk),
        dz(p.dk), dy_z_rows(max_rows) {
    if (!p.causal) return;
    kap.resize(max_rows * p.dk);
    vals.resize(max_rows * ld_x1);
    a.resize(max_rows * max_rows);
    da.resize(max_rows * max_rows);
    dkap.resize(max_rows * p.dk);
    dvals.resize(max_rows * p.dv);
  }
};

// The line requests for the next task's rows, issued during this task's
// products: q and grad_o (causal: k and v) during the first; the mixed
// summary and what the task writes during the last (a product requests one
// line per step: one alone has too few steps for all of them).
template <typename T>
void request_output_gradient_rows(const mhla::detail::Problem& p, const BlockTask& next,
                                  const T* q, const T* k, const T* v, const T* grad_o,
                                  const T* mixed, const T* mixed_grad, const T* grad_q,
                                  const T* grad_k, const T* grad_v, bool q_streaming,
                                  int64_t summary_elements, RowLines& next_reads,
                                  RowLines& next_writes) {
  next_reads.add_read(p.table, next.block, q, next.qk, p.dk);
  next_reads.add_read(p.table, next.block, grad_o, next.v, p.dv);
  if (p.causal) {
    next_reads.add_read(p.table, next.block, k, next.qk, p.dk);
    next_reads.add_read(p.table, next.block, v, next.v, p.dv);
  }
  next_writes.add_span_read(mixed + next.summary, summary_elements);
  if (!q_streaming) next_writes.add_write(p.table, next.block, grad_q, next.qk, p.dk);
  if (p.causal) {
    next_writes.add_write(p.table, next.block, grad_k, next.qk, p.dk);
    next_writes.add_write(p.table, next.block, grad_v, next.v, p.dv);
  }
  // (Recomputed, the mixed summaries and their gradient share an array.)
  if (mixed_grad != mixed) next_writes.add_span_write(mixed_grad + next.summary, summary_elements);
}

// Row by row: g . o = dy[:Dv] . y = phi(q) . P (+ W[i,i] sum_j A[., j]
// B[., j]) and dy[Dv] from it, left in dy_z_rows, with dmixed_i's z column
// phi(Q)^T dy[:, Dv] summed into dz; causal, then
//   dA = W[i,i] mask(dy [V|1]^T) = W[i,i] (B + dy[Dv] 1^T), written over B,
//   dW[i,i] = <mask(dy [V|1]^T), A>, returned,
// while the row of A and B is in L1 (a second pass over the triangle made
// mhla_bench's causal backward slower).
template <typename T>
T normaliser_terms(const mhla::detail::Problem& p, int64_t rows, T wii, T eps,
                   OutputGradientTiles<T>& s) {
  const int64_t dk = p.dk;
  std::fill(s.dz.begin(), s.dz.end(), T(0));
  T dw = 0;
  for (int64_t r = 0; r < rows; ++r) {
    // Row r of A and B (causal only: the other modes have no such tiles).
    T* a_r = p.causal ? s.a.data() + r * rows : nullptr;
    T* b_r = p.causal ? s.da.data() + r * rows : nullptr;
    T dy_z = 0;
    if (p.normalize) {
      const T* dur = s.du.data() + r * dk;
      const T* ur = s.u.data() + r * dk;
      T dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t e = 0; e < dk; ++e) dot += ur[e] * dur[e];
      if (p.causal) {
        T in_block = 0;
#pragma omp simd reduction(+ : in_block)
        for (int64_t c = 0; c <= r; ++c) in_block += a_r[c] * b_r[c];
        dot += wii * in_block;
      }
      dy_z = -dot * (T(1) / (s.den[r] + eps));
      s.dy_z_rows[r] = dy_z;
#pragma omp simd
      for (int64_t e = 0; e < dk; ++e) s.dz[e] += ur[e] * dy_z;
    }
    if (p.causal) {
      T dw_r = 0;
#pragma omp simd reduction(+ : dw_r)
      for (int64_t c = 0; c <= r; ++c) {
        const T x = b_r[c] + dy_z;
        dw_r += x * a_r[c];
        b_r[c] = x * wii;
      }
      dw += dw_r;
    }
  }
  return dw;
}

// The causal in-block gradients of a task from dA (in s.da):
// dphi(Q) += dA phi(K), dphi(K) = dA^T phi(Q), d[V|1] = W[i,i] A^T dy. They
// are parked in grad_k and grad_v, where key_value_gradients adds the
// inter-block part, applies phi' and checks the sums, or finished here.
// Returns whether what it finished is finite (parked: true).
template <typename T>
bool in_block_gradients(const mhla::detail::Problem& p, const BlockTask& t, T wii, int64_t ld_x1,
                        bool park, OutputGradientTiles<T>& s, RowWriter<T>& k_rows, T* grad_k,
                        RowWriter<T>& v_rows, T* grad_v) {
  const int64_t rows = t.rows, dk = p.dk, dv = p.dv;
  lower_times(rows, dk, T(1), s.da.data(), s.kap.data(), dk, true, s.du.data(), dk);
  lower_transposed_times(rows, dk, T(1), s.da.data(), s.u.data(), dk, s.dkap.data(), dk);
  // (The ones' column of [V | 1] has no gradient to keep.)
  lower_transposed_times(rows, dv, wii, s.a.data(), s.dy.data(), ld_x1, s.dvals.data(), dv);
  const bool finite_k =
      park ? scatter_rows(p.table, t.block, s.dkap.data(), dk, t.qk, dk, k_rows, grad_k)
           : scatter_through_feature(p.table, t.block, p.phi, s.kap.data(), s.dkap.data(), dk, t.qk,
                                     dk, k_rows, grad_k);
  const bool finite_v = scatter_rows(p.table, t.block, s.dvals.data(), dv, t.v, dv, v_rows, grad_v);
  return park || (finite_k && finite_v);
}

}  // namespace

template <typename T>
bool ChunkedAttention<T>::output_gradients(const T* q, const T* k, const T* v, const T* grad_o,
                                           const T* mixed, T* mixed_grad, T* diagonal_grad,
                                           T* grad_q, T* grad_k, T* grad_v, bool park) const {
  const auto& d = p_;
  const T eps = T(p_.eps), scale = T(p_.scale);
  // grad_q is final here; the causal in-block key/value parts are not.
  const RowWrite write_q = result_write(d, d.dk, grad_q);
  bool finite = true;
#pragma omp parallel
  {
    OutputGradientTiles<T> s(p_, max_rows_, ld_x1_);
    RowLines next_reads, next_writes;
    RowWriter<T> q_rows(write_q, d.dk), k_rows(RowWrite::overwrite, d.dk),
        v_rows(RowWrite::overwrite, d.dv);
#pragma omp for schedule(static) reduction(&& : finite)
    for (int64_t task = 0; task < task_count(); ++task) {
      const BlockTask t = block_task(task);
      const int64_t rows = t.rows;
      next_reads.clear();
      next_writes.clear();
      if (task + 1 < task_count())
        request_output_gradient_rows(p_, block_task(task + 1), q, k, v, grad_o, mixed, mixed_grad,
                                     grad_q, grad_k, grad_v, q_rows.streaming(), x_, next_reads,
                                     next_writes);
      const T* mixed_i = mixed + t.summary;
      gather_rows(p_.table, t.block, p_.phi, q, t.qk, d.dk, s.u.data(), d.dk);

      // den_t = phi(q_t) . z~_i (+ causal in-block key sums); eps is added below.
      gemv(rows, d.dk, s.u.data(), d.dk, mixed_i + d.dv, x1_, s.den.data());
      const T wii = p_.causal ? mixer_.diagonal(t.bh, t.block) : T(0);
      if (p_.causal) {
        in_block_scores(t, k, v, s.u.data(), s.kap.data(), s.vals.data(), s.a.data());
        for (int64_t r = 0; r < rows; ++r) s.den[r] += wii * lower_row_sum(s.a.data(), rows, r);
      }
      // o = y[:Dv] / den:  dy[:Dv] = g / den,  dy[Dv] = -(g . o) / den.
      // o = scale y[:Dv]:  dy[:Dv] = scale g,  dy[Dv] = 0.
      // g . o is formed from the products below rather than read: o is never
      // read (a pass over an array as large as v; mhla_bench's "f+b sav").
      // grad_o is read in place, row by row (the line requests have brought it
      // into cache): copying it into a tile first cost a memory-speed pass.
      for_each_row(p_.table, t.block, t.v, [&](int64_t r, int64_t offset) {
        const T* gr = grad_o + offset;
        prefetch_ahead(gr, t.v.stride, d.dv);
        T* dyr = s.dy.data() + r * ld_x1_;
        const T factor = p_.normalize ? T(1) / (s.den[r] + eps) : scale;
#pragma omp simd
        for (int64_t e = 0; e < d.dv; ++e) dyr[e] = gr[e] * factor;
      });
      // y = phi(Q) mixed_i:  dphi(Q) = dy mixed_i^T = P + dy[Dv] z~_i^T with
      // P = dy[:, :Dv] S~_i^T.
      block_gemm(false, true, rows, d.dk, d.dv, T(1), s.dy.data(), ld_x1_, mixed_i, x1_, T(0),
                 s.du.data(), d.dk, next_reads.prefetch());
      // Causal, y += W[i,i] A [V|1] with A = mask(phi(Q) phi(K)^T); first
      // B = mask(dy[:, :Dv] V^T).
      if (p_.causal) lower_scores(rows, d.dv, s.dy.data(), s.vals.data(), ld_x1_, s.da.data());
      // dphi(Q) += dy[Dv] z~^T is added by the scatter: z~_i scaled by each
      // row's dy[Dv], which normaliser_terms leaves in dy_z_rows.
      if (p_.normalize)
        for (int64_t e = 0; e < d.dk; ++e) s.zt[e] = mixed_i[e * x1_ + d.dv];
      const RowBias<T> bias =
          p_.normalize ? RowBias<T>{s.zt.data(), s.dy_z_rows.data()} : RowBias<T>{};
      const T dw = normaliser_terms(p_, rows, wii, eps, s);
      if (p_.causal) {
        diagonal_grad[t.bh * p_.blocks + t.block] = dw;
        finite = in_block_gradients(p_, t, wii, ld_x1_, park, s, k_rows, grad_k, v_rows, grad_v) &&
                 finite;
      }
      const bool finite_q = scatter_through_feature(p_.table, t.block, p_.phi, s.u.data(),
                                                    s.du.data(), d.dk, t.qk, d.dk, q_rows, grad_q,
                                                    bias);
      finite = finite && finite_q;
      // y = phi(Q) mixed_i:  dmixed_i = phi(Q)^T dy (mixed_i, if the same array, is no
      // longer read); its z column from the rows above.
      T* dmixed_i = mixed_grad + t.summary;
      block_gemm(true, false, d.dk, d.dv, rows, T(1), s.u.data(), d.dk, s.dy.data(), ld_x1_, T(0),
                 dmixed_i, x1_, next_writes.prefetch());
      for (int64_t e = 0; e < d.dk; ++e) dmixed_i[e * x1_ + d.dv] = s.dz[e];
    }
  }
  return finite;
}

template <typename T>
bool ChunkedAttention<T>::key_value_gradients(const T* k, const T* v, const T* summaries_grad,
                                              T* grad_k, T* grad_v, bool add_to_parked) const {
  const auto& d = p_;
  const RowWrite write_k = result_write(d, d.dk, grad_k, add_to_parked);
  const RowWrite write_v = result_write(d, d.dv, grad_v, add_to_parked);
  bool finite = true;
#pragma omp parallel
  {
    Tile<T> kap(max_rows_ * d.dk), vals(max_rows_ * d.dv), dkap(max_rows_ * d.dk),
        dvalues(max_rows_ * d.dv), dz(d.dk);
    RowLines next_reads, next_writes;
    RowWriter<T> k_rows(write_k, d.dk), v_rows(write_v, d.dv);
#pragma omp for schedule(static) reduction(&& : finite)
    for (int64_t task = 0; task < task_count(); ++task) {
      const BlockTask t = block_task(task);
      request_key_value_rows(p_, task, k, v, summaries_grad, grad_k, grad_v, k_rows, v_rows,
                             next_reads, next_writes);
      const T* ds = summaries_grad + t.summary;
      // [S_b | z_b] = phi(K)^T [V | 1]:  dphi(K) = [V | 1] dS^T,  dV = phi(K) dS[:, :Dv]
      // (the ones' gradient is not needed).
      gather_rows(p_.table, t.block, p_.phi, k, t.qk, d.dk, kap.data(), d.dk);
      // dphi(K) = V dS[:, :Dv]^T + 1 dz^T, the second term added by the
      // scatter (filling every row of dphi(K) with dz before the product
      // cost a copy of the tile per block). V is read in place when the
      // block is one run of tokens: the product reads each of its rows once
      // (dphi(K) is one column panel on AVX-512; narrower targets read them
      // once per panel), so a gather was mostly a copy.
      const T* values = vals.data();
      int64_t ld_values = d.dv;
      if (const mhla::detail::TokenRun* run = p_.table.single_run(t.block)) {
        values = v + t.v.offset + run->first * t.v.stride;
        ld_values = t.v.stride;
      } else {
        gather_rows(p_.table, t.block, FeatureMap::identity, v, t.v, d.dv, vals.data(), d.dv);
      }
      for (int64_t a = 0; a < d.dk; ++a) dz[a] = ds[a * x1_ + d.dv];
      block_gemm(false, true, t.rows, d.dk, d.dv, T(1), values, ld_values, ds, x1_, T(0),
                 dkap.data(), d.dk, next_reads.prefetch());
      block_gemm(false, false, t.rows, d.dv, d.dk, T(1), kap.data(), d.dk, ds, x1_, T(0),
                 dvalues.data(), d.dv, next_writes.prefetch());
      // Causal blocks add to the in-block part parked in grad_k / grad_v.
      finite = scatter_key_value_gradients(p_, t, kap.data(), dkap.data(), dz.data(),
                                           dvalues.data(), k_rows, grad_k, v_rows, grad_v) &&
               finite;
    }
  }
  return finite;
}

// The summaries for token tensors of the computing type, and for bfloat16
// ones (the bfloat16 backward's recomputed summaries, cpu/bf16_backward.hpp).
template class ChunkedAttention<float>;
template class ChunkedAttention<double>;
template void ChunkedAttention<float>::compute_summaries<float>(const float*, const float*,
                                                                float*) const;
template void ChunkedAttention<double>::compute_summaries<double>(const double*, const double*,
                                                                  double*) const;
template void ChunkedAttention<float>::compute_summaries<bfloat16>(const bfloat16*, const bfloat16*,
                                                                   float*) const;

}  // namespace mhla::cpu
