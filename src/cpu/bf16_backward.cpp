#include "cpu/bf16_backward.hpp"

#include <algorithm>
#include <bit>

#include "cpu/block_products.hpp"
#include "cpu/block_rows.hpp"
#include "cpu/block_tasks.hpp"
#include "cpu/key_value_rows.hpp"
#include "cpu/simd/bf16_products.hpp"
#include "cpu/workspace.hpp"
#include "mhla/line_aligned.hpp"

namespace mhla::cpu {
namespace {
template <typename T>
using Tile = mhla::detail::LineAlignedVector<T>;
}  // namespace

Bf16Backward::Bf16Backward(const mhla::detail::Problem& problem, const Mixer<float>& mixer,
                           const ChunkedAttention<float>& kernel)
    : p_(problem),
      mixer_(mixer),
      kernel_(kernel),
      x1_(problem.dv + 1),
      x_(problem.dk * (problem.dv + 1)),
      max_rows_(problem.table.max_block_size()) {}

bool Bf16Backward::backward(const bfloat16* q, const bfloat16* k, const bfloat16* v,
                            const bfloat16* grad_o, bfloat16* grad_q, bfloat16* grad_k,
                            bfloat16* grad_v, float* grad_w, const float* saved_summaries,
                            const float* saved_mixed) const {
  const size_t total = size_t(task_count(p_) * x_);
  const float* summaries = saved_summaries;
  if (!summaries) {
    float* recomputed = scratch<float>(Scratch::summaries, total);
    kernel_.compute_summaries(k, v, recomputed);
    summaries = recomputed;
  }
  float* mixed_grad = scratch<float>(Scratch::mixed, total);
  float* summaries_grad = scratch<float>(Scratch::summaries_grad, total);
  // Recomputed, the mixed summaries are overwritten by their gradient, block
  // by block, once read.
  const float* mixed = saved_mixed;
  if (!mixed) {
    mixer_.mix(summaries, mixed_grad);
    mixed = mixed_grad;
  }
  const bool finite_q = output_gradients(q, grad_o, mixed, mixed_grad, grad_q);
  mixer_.mix_backward_bf16(mixed_grad, summaries, nullptr, summaries_grad, grad_w);
  const bool finite_kv = key_value_gradients(k, v, summaries_grad, grad_k, grad_v);
  return finite_q && finite_kv;
}

bool Bf16Backward::output_gradients(const bfloat16* q, const bfloat16* grad_o, const float* mixed,
                                    float* mixed_grad, bfloat16* grad_q) const {
  const auto& d = p_;
  const float eps = float(p_.eps), scale = float(p_.scale);
  const RowWrite write_q = result_write(d, d.dk, grad_q);
  bool finite = true;
#pragma omp parallel
  {
    Tile<float> u(max_rows_ * d.dk), den(max_rows_), du(max_rows_ * d.dk), zt(d.dk), dz(d.dk),
        dy_z_rows(max_rows_);
    // phi(Q) as pairs of tokens (dmixed_i's A^T), dy as pairs of columns
    // (dphi(Q)'s A) and of tokens (dmixed_i's B), S~_i^T's pairs.
    const int64_t dv_pairs = (d.dv + 1) / 2, row_pairs = (max_rows_ + 1) / 2;
    Tile<uint32_t> u_pairs(row_pairs * d.dk), dy_columns(max_rows_ * dv_pairs),
        dy_rows(row_pairs * d.dv), mixed_columns(dv_pairs * d.dk);
    RowLines next_reads, next_writes;
    RowWriter<bfloat16> q_rows(write_q, d.dk);
#pragma omp for schedule(static) reduction(&& : finite)
    for (int64_t task = 0; task < task_count(p_); ++task) {
      const BlockTask t = block_task(p_, task);
      const int64_t rows = t.rows;
      // q and grad_o two tasks ahead, as the forward's summaries request
      // theirs: the product on bfloat16 operands is too short for the next
      // task's rows to arrive in time (mhla_bench's bfloat16 table); the
      // next task's mixed summary and what it writes during the last product.
      next_reads.clear();
      next_writes.clear();
      if (task + 2 < task_count(p_)) {
        const BlockTask far = block_task(p_, task + 2);
        next_reads.add_read(p_.table, far.block, q, far.qk, d.dk);
        next_reads.add_read(p_.table, far.block, grad_o, far.v, d.dv);
      }
      if (task + 1 < task_count(p_)) {
        const BlockTask next = block_task(p_, task + 1);
        next_writes.add_span_read(mixed + next.summary, x_);
        if (!q_rows.streaming()) next_writes.add_write(p_.table, next.block, grad_q, next.qk, d.dk);
        // (Recomputed, the mixed summaries and their gradient share an array.)
        if (mixed_grad != mixed) next_writes.add_span_write(mixed_grad + next.summary, x_);
      }
      const float* mixed_i = mixed + t.summary;
      // phi(Q)'s pairs of tokens formed with it (the float values feed den,
      // g . o and phi').
      gather_feature_row_pairs(p_.table, t.block, p_.phi, q, t.qk, d.dk, u_pairs.data(), d.dk,
                               nullptr, u.data(), d.dk);
      // den_t = phi(q_t) . z~_i; eps is added below.
      gemv(rows, d.dk, u.data(), d.dk, mixed_i + d.dv, x1_, den.data());
      // o = y[:Dv] / den:  dy[:Dv] = g / den,  dy[Dv] = -(g . o) / den.
      // o = scale y[:Dv]:  dy[:Dv] = scale g,  dy[Dv] = 0.
      // grad_o is read in place, row by row, and rounded straight into both
      // products' pair forms, as packing float rows would round them.
      for_each_row(p_.table, t.block, t.v, [&](int64_t r, int64_t offset) {
        const bfloat16* gr = grad_o + offset;
        // (Beside the line requests it helps the bfloat16 backward in mhla_bench.)
        prefetch_ahead(gr, t.v.stride, d.dv);
        const float factor = p_.normalize ? 1.0f / (den[r] + eps) : scale;
        simd::scaled_pairs(gr, d.dv, factor, dy_columns.data() + r * dv_pairs,
                           dy_rows.data() + (r / 2) * d.dv, int(r % 2), nullptr);
      });
      // y = phi(Q) mixed_i:  dphi(Q) = dy mixed_i^T = P + dy[Dv] z~_i^T with
      // P = dy[:, :Dv] S~_i^T on bfloat16 operands. Its two terms cancel when
      // normalised, but g . o below comes from the same P, so they cancel
      // consistently: on the test catalogue grad_q's largest error went from
      // 0.0083 (P in float) to 0.011, for a faster phase in mhla_bench.
      // (While backward read the rounded o, P on bfloat16 operands took that
      // error to 0.48.)
      simd::pack_transposed_pairs(mixed_i, x1_, d.dk, d.dv, mixed_columns.data(), d.dk);
      simd::gemm_bf16(rows, d.dk, dv_pairs, {dy_columns.data(), dv_pairs, 1}, mixed_columns.data(),
                      d.dk, du.data(), d.dk, next_reads.prefetch());
      // dphi(Q) += dy[Dv] z~^T is added by the scatter: z~_i scaled by each
      // row's dy[Dv], left in dy_z_rows. g . o = dy[:Dv] . y = phi(q) . P and
      // dz = phi(Q)^T dy[:, Dv], dmixed_i's z column, as SIMD passes over the block.
      if (p_.normalize)
        for (int64_t e = 0; e < d.dk; ++e) zt[e] = mixed_i[e * x1_ + d.dv];
      const RowBias<float> bias =
          p_.normalize ? RowBias<float>{zt.data(), dy_z_rows.data()} : RowBias<float>{};
      std::fill(dz.begin(), dz.end(), 0.0f);
      if (p_.normalize) {
        simd::row_dots(u.data(), du.data(), d.dk, rows, d.dk, dy_z_rows.data());
#pragma omp simd
        for (int64_t r = 0; r < rows; ++r) dy_z_rows[r] = -dy_z_rows[r] * (1.0f / (den[r] + eps));
        simd::weighted_column_sums(u.data(), d.dk, rows, d.dk, dy_z_rows.data(), dz.data());
      }
      finite = finite && scatter_through_feature(p_.table, t.block, p_.phi, u.data(), du.data(),
                                                 d.dk, t.qk, d.dk, q_rows, grad_q, bias);
      // dmixed_i = phi(Q)^T dy (mixed_i, if the same array, is no longer
      // read); its z column from above.
      float* dmixed_i = mixed_grad + t.summary;
      simd::gemm_bf16(d.dk, d.dv, (rows + 1) / 2, {u_pairs.data(), 1, d.dk}, dy_rows.data(), d.dv,
                      dmixed_i, x1_, next_writes.prefetch());
      for (int64_t e = 0; e < d.dk; ++e) dmixed_i[e * x1_ + d.dv] = dz[e];
    }
  }
  return finite;
}

bool Bf16Backward::key_value_gradients(const bfloat16* k, const bfloat16* v,
                                       const float* summaries_grad, bfloat16* grad_k,
                                       bfloat16* grad_v) const {
  const auto& d = p_;
  const RowWrite write_k = result_write(d, d.dk, grad_k);
  const RowWrite write_v = result_write(d, d.dv, grad_v);
  bool finite = true;
#pragma omp parallel
  {
    Tile<float> kap(max_rows_ * d.dk), dkap(max_rows_ * d.dk), dvalues(max_rows_ * d.dv), dz(d.dk);
    // phi(K) and V as pairs of columns, dS's two operand forms.
    const int64_t dk_pairs = (d.dk + 1) / 2, dv_pairs = (d.dv + 1) / 2;
    Tile<uint32_t> kap_pairs(max_rows_ * dk_pairs), value_pairs(max_rows_ * dv_pairs),
        ds_columns((x1_ + 1) / 2 * d.dk), ds_rows(dk_pairs * d.dv);
    RowLines next_reads, next_writes;
    RowWriter<bfloat16> k_rows(write_k, d.dk), v_rows(write_v, d.dv);
#pragma omp for schedule(static) reduction(&& : finite)
    for (int64_t task = 0; task < task_count(p_); ++task) {
      const BlockTask t = block_task(p_, task);
      request_key_value_rows(p_, task, k, v, summaries_grad, grad_k, grad_v, k_rows, v_rows,
                             next_reads, next_writes);
      const float* ds = summaries_grad + t.summary;
      // [S_b | z_b] = phi(K)^T [V | 1]:  dphi(K) = [V | 1] dS^T,  dV = phi(K) dS[:, :Dv]
      // (the ones' gradient is not needed). phi(K)'s pairs come rounded from
      // its gather, V's rows are copied as they are (not widened and packed
      // again), and dz, the ones' column, is added after the product, as the
      // scatter forms grad_k: dphi(K) = V dS[:, :Dv]^T + 1 dz^T (as fast as
      // widening and packing V in mhla_bench, with one copy fewer). dz is
      // rounded as dS is: added unrounded, it raised grad_k's largest error on
      // the test catalogue from 0.015 to 0.021 (and rounding it value by
      // value was slower).
      gather_rows(p_.table, t.block, p_.phi, k, t.qk, d.dk, kap.data(), d.dk, kap_pairs.data(),
                  dk_pairs);
      gather_column_pairs(p_.table, t.block, v, t.v, d.dv, value_pairs.data(), dv_pairs);
      // dS^T with its z column, which the product skips: rounded there, dz
      // is half Dv % 2 of pair Dv / 2 (for odd Dv beside V's zero pad).
      simd::pack_transposed_pairs(ds, x1_, d.dk, x1_, ds_columns.data(), d.dk);
      simd::gemm_bf16(t.rows, d.dk, dv_pairs, {value_pairs.data(), dv_pairs, 1}, ds_columns.data(),
                      d.dk, dkap.data(), d.dk, next_reads.prefetch());
      const uint32_t* dz_pairs = ds_columns.data() + (d.dv / 2) * d.dk;
      const int dz_shift = 16 * int(d.dv % 2);
#pragma omp simd
      for (int64_t a = 0; a < d.dk; ++a)
        dz[a] = std::bit_cast<float>((dz_pairs[a] >> dz_shift) << 16);
      simd::pack_row_pairs(ds, x1_, d.dk, d.dv, ds_rows.data(), d.dv);
      simd::gemm_bf16(t.rows, d.dv, dk_pairs, {kap_pairs.data(), dk_pairs, 1}, ds_rows.data(), d.dv,
                      dvalues.data(), d.dv, next_writes.prefetch());
      finite = scatter_key_value_gradients(p_, t, kap.data(), dkap.data(), dz.data(),
                                           dvalues.data(), k_rows, grad_k, v_rows, grad_v) &&
               finite;
    }
  }
  return finite;
}

}  // namespace mhla::cpu
