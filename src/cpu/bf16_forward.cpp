#include "cpu/bf16_forward.hpp"

#include <algorithm>
#include <vector>

#include "cpu/block_products.hpp"
#include "cpu/block_rows.hpp"
#include "cpu/block_tasks.hpp"
#include "cpu/simd/bf16_products.hpp"
#include "cpu/simd/stream_rows.hpp"
#include "cpu/workspace.hpp"
#include "mhla/line_aligned.hpp"

namespace mhla::cpu {
namespace {
template <typename T>
using Tile = mhla::detail::LineAlignedVector<T>;
}  // namespace

Bf16Forward::Bf16Forward(const mhla::detail::Problem& problem, const Mixer<float>& mixer)
    : p_(problem),
      mixer_(mixer),
      x1_(problem.dv + 1),
      max_rows_(problem.table.max_block_size()),
      row_pairs_((max_rows_ + 1) / 2),
      dk_pairs_((problem.dk + 1) / 2) {}

bool Bf16Forward::forward(const bfloat16* q, const bfloat16* k, const bfloat16* v, bfloat16* o,
                          float* summaries_out, float* mixed_out) const {
  const size_t total = size_t(task_count(p_) * p_.dk * x1_);
  float* mixed = mixed_out ? mixed_out : scratch<float>(Scratch::mixed, total);
  if (!summaries_out && !mixed_out && mixer_.takes_summary_pairs()) {
    // Nothing kept: the summaries go straight to the mix's bfloat16 pairs (no
    // float array written and read, no packing in the mix).
    const int64_t slices = p_.batch * p_.heads;
    uint16_t* pairs = scratch<uint16_t>(
        KernelScratch::summary_pairs, size_t(slices * ((p_.blocks + 1) / 2) * p_.dk * x1_ * 2));
    compute_summaries(k, v, nullptr, pairs);
    mixer_.mix_summary_pairs(reinterpret_cast<const uint32_t*>(pairs), mixed);
    return compute_outputs(q, mixed, o);
  }
  float* summaries = summaries_out ? summaries_out : scratch<float>(Scratch::summaries, total);
  compute_summaries(k, v, summaries, nullptr);
  // Kept for backward too, the mixed summaries come from bfloat16 products:
  // backward reads S~ and never o (g . o = phi(q) . dy S~^T), so every
  // gradient is that of the same rounded S~ the read-out used. On the test
  // catalogue the largest grad_q error went from 0.0050 to 0.0083 and
  // grad_w's from 0.044 to 0.047 (the others unchanged), for a faster
  // forward in mhla_bench's bfloat16 table. (Mixed in float while
  // backward read the rounded o, the two terms of the read-out's gradient
  // cancelled unevenly: grad_q's error reached 0.30.)
  mixer_.mix_bf16(summaries, mixed);
  return compute_outputs(q, mixed, o);
}

void Bf16Forward::compute_summaries(const bfloat16* k, const bfloat16* v, float* summaries,
                                    uint16_t* pairs) const {
  const auto& d = p_;
  const int64_t tasks = task_count(p_), x = d.dk * x1_, pair_blocks = (p_.blocks + 1) / 2;
  // In pairs, block b of slice bh: the halves b % 2 of the words at pair
  // (bh, b / 2).
  const auto words = [&](const BlockTask& t) {
    return pairs + 2 * (t.bh * pair_blocks + t.block / 2) * x;
  };
#pragma omp parallel
  {
    Tile<float> z(d.dk);
    Tile<uint32_t> kap_pairs(row_pairs_ * d.dk), value_pairs(row_pairs_ * d.dv);
    RowLines next_rows;
#pragma omp for schedule(static)
    for (int64_t task = 0; task < tasks; ++task) {
      const BlockTask t = block_task(p_, task);
      // The rows two tasks ahead: the bfloat16 product is too short for the
      // next task's lines to arrive in time (mhla_bench's bfloat16 table; the
      // read-out gained nothing from it).
      next_rows.clear();
      if (task + 2 < tasks) {
        const BlockTask next = block_task(p_, task + 2);
        next_rows.add_read(p_.table, next.block, k, next.qk, d.dk);
        next_rows.add_read(p_.table, next.block, v, next.v, d.dv);
        if (pairs)
          next_rows.add_span_write(words(next), 2 * x);
        else
          next_rows.add_span_write(summaries + next.summary, x);
      }
      // phi(K_b) as pairs of tokens for S_b's product, which reads it as A^T
      // (word (a, p) = (phi(k_2p)[a], phi(k_2p+1)[a])), and z_b summed in
      // float as they are formed.
      gather_feature_row_pairs(p_.table, t.block, p_.phi, k, t.qk, d.dk, kap_pairs.data(), d.dk,
                               z.data());
      gather_row_pairs(p_.table, t.block, v, t.v, d.dv, value_pairs.data(), d.dv);
      const int64_t row_pairs = (t.rows + 1) / 2;
      const simd::PairStrided features{kap_pairs.data(), 1, d.dk};
      if (!pairs) {
        float* s = summaries + t.summary;
        simd::gemm_bf16(d.dk, d.dv, row_pairs, features, value_pairs.data(), d.dv, s, x1_,
                        next_rows.prefetch());
        for (int64_t a = 0; a < d.dk; ++a) s[a * x1_ + d.dv] = z[a];
        continue;
      }
      const int half = int(t.block % 2);
      // An odd M's last block has no partner: its high halves are zeros.
      const bool alone = half == 0 && t.block + 1 == p_.blocks;
      uint16_t* s = words(t);
      simd::gemm_bf16_halves(d.dk, d.dv, row_pairs, features, value_pairs.data(), d.dv,
                             reinterpret_cast<uint32_t*>(s), x1_, half, alone,
                             next_rows.prefetch());
      for (int64_t a = 0; a < d.dk; ++a) {
        uint16_t* word = s + 2 * (a * x1_ + d.dv);
        word[half] = to_bfloat16(z[a]).bits;
        if (alone) word[1] = 0;
      }
    }
  }
}

bool Bf16Forward::compute_outputs(const bfloat16* q, const float* mixed, bfloat16* o) const {
  const auto& d = p_;
  const int64_t tasks = task_count(p_);
  const float eps = float(p_.eps), scale = float(p_.scale);
  const RowWrite write_o = result_write(d, d.dv, o);
  bool finite = true;
#pragma omp parallel
  {
    Tile<float> u(max_rows_ * d.dk), y(max_rows_ * d.dv), den(max_rows_), factors(max_rows_);
    Tile<uint32_t> u_pairs(max_rows_ * dk_pairs_), s_pairs(dk_pairs_ * d.dv);
    std::vector<bfloat16*> o_rows(static_cast<size_t>(max_rows_));
    RowLines next_rows;
#pragma omp for schedule(static) reduction(&& : finite)
    for (int64_t task = 0; task < tasks; ++task) {
      const BlockTask t = block_task(p_, task);
      next_rows.clear();
      if (task + 1 < tasks) {
        const BlockTask next = block_task(p_, task + 1);
        next_rows.add_span_read(mixed + next.summary, d.dk * x1_);
        next_rows.add_read(p_.table, next.block, q, next.qk, d.dk);
        if (write_o != RowWrite::stream) next_rows.add_write(p_.table, next.block, o, next.v, d.dv);
      }
      // y = phi(Q_i) S~_i on pairs of key features: phi(Q_i)'s by row (rounded
      // as it is gathered), S~_i's rows in pairs (rounded per block: Dk Dv
      // values against the product's C Dk Dv multiply-adds).
      gather_rows(p_.table, t.block, p_.phi, q, t.qk, d.dk, u.data(), d.dk, u_pairs.data(),
                  dk_pairs_);
      const float* mixed_i = mixed + t.summary;
      simd::pack_row_pairs(mixed_i, x1_, d.dk, d.dv, s_pairs.data(), d.dv);
      simd::gemm_bf16(t.rows, d.dv, dk_pairs_, {u_pairs.data(), dk_pairs_, 1}, s_pairs.data(), d.dv,
                      y.data(), d.dv, next_rows.prefetch());
      if (p_.normalize) gemv(t.rows, d.dk, u.data(), d.dk, mixed_i + d.dv, x1_, den.data());
      // o's rows scaled and rounded in one pass over the block (row by row,
      // through a streaming row writer, this was a fifth of the phase).
      for_each_row(p_.table, t.block, t.v,
                   [&](int64_t row, int64_t offset) { o_rows[size_t(row)] = o + offset; });
      float probe = 0;
      if (p_.normalize) {
        // An overflowed denominator would turn the row into silent zeros.
#pragma omp simd reduction(+ : probe)
        for (int64_t r = 0; r < t.rows; ++r) {
          factors[r] = 1.0f / (den[r] + eps);
          probe += den[r] * 0.0f;
        }
      } else {
        std::fill(factors.begin(), factors.begin() + t.rows, scale);
      }
      probe += simd::narrow_rows(y.data(), d.dv, t.rows, d.dv, factors.data(), o_rows.data(),
                                 write_o == RowWrite::stream);
      finite = finite && probe == probe;
    }
    if (write_o == RowWrite::stream) simd::finish_streaming();
  }
  return finite;
}

}  // namespace mhla::cpu
