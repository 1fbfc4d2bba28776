// The tiling of the bfloat16-state backward (src/cuda/bf16_state_backward.cu,
// bf16_state_mix.cu) emulated on the CPU (bf16_state_emulation.hpp): the
// query side, the mix's transpose, the weight gradient's partial sums and
// their sum, and the key and value side, each CTA by CTA with the plan's
// staging, from the emulated forward's bfloat16 state; the four gradients are
// held to the float64 operator's on the same bfloat16 inputs.
#include <algorithm>
#include <utility>

#include "cuda/bf16_state_cases.hpp"
#include "cuda/bf16_state_emulation.hpp"

namespace mhla::test {
namespace {

using namespace mhla::cuda::state;
using cuda::KernelProblem;

struct EmulatedBackward {
  std::vector<float> grad_q, grad_k, grad_v, grad_w;
};

class BackwardEmulation {
 public:
  BackwardEmulation(const KernelProblem& p, const std::vector<float>& q, const std::vector<float>& k,
                    const std::vector<float>& v, const std::vector<float>& w,
                    const std::vector<float>& grad_o, const EmulatedForward& state)
      : p_(p), q_(q), k_(k), v_(v), w_(w), grad_o_(grad_o), state_(state) {}

  EmulatedBackward run() {
    const StateSizes sizes = state_sizes(p_);
    const int64_t tokens = p_.batch * p_.tokens * p_.heads;
    Written grad_q(tokens * p_.dk), grad_k(tokens * p_.dk), grad_v(tokens * p_.dv),
        grad_mixed(sizes.summaries), grad_mixed_z(sizes.normalisers), grad_s(sizes.summaries),
        grad_z(sizes.normalisers);
    // Token-level causal: the tokens' terms and W's diagonal part between the two sides.
    Written terms(p_.causal ? 2 * tokens : 0), diagonal(p_.causal ? p_.batch * p_.heads * p_.blocks : 0);
    const bool wide = column_fragments(p_.dv) == 8;
    for (int64_t bh = 0; bh < p_.batch * p_.heads; ++bh)
      for (int64_t b = 0; b < p_.blocks; ++b)
        wide ? query_side<8>(b, bh, grad_q, grad_mixed, grad_mixed_z, terms)
             : query_side<4>(b, bh, grad_q, grad_mixed, grad_mixed_z, terms);
    emulate_mixes(p_, w_, true, grad_mixed.x, grad_mixed_z.x, grad_s, grad_z);
    for (int64_t bh = 0; bh < p_.batch * p_.heads; ++bh)
      for (int64_t b = 0; b < p_.blocks; ++b)
        wide ? key_value_side<8>(b, bh, grad_s.x, grad_z.x, terms.x, grad_k, grad_v, diagonal)
             : key_value_side<4>(b, bh, grad_s.x, grad_z.x, terms.x, grad_k, grad_v, diagonal);
    std::vector<float> grad_w(w_.size(), 0.0f);
    weight_gradient(grad_mixed.x, grad_mixed_z.x, diagonal.x, grad_w);
    return {grad_q.x, grad_k.x, grad_v.x, grad_w};
  }

 private:
  int count(int64_t block) const { return int(p_.block_start[block + 1] - p_.block_start[block]); }
  float phi(float x) const { return cuda::feature(p_.phi, x); }
  float diagonal_weight(const Slice& slice, int64_t block) const {
    return cuda::weight(p_, w_.data(), slice.head, block, block);
  }

  // A block's state rows [Dk, Dv] of `source`, staged (rows past Dk zero).
  template <int kSegments>
  void stage_state(SharedTile& tile, int threads, int rows, int64_t offset,
                   const std::vector<float>& source) const {
    for_each_staged<kSegments>(threads, rows, [&](const Segment& sg) {
      const int64_t at = row_segment(sg.row < p_.dk ? sg.row : -1, sg.column, p_.dv);
      tile.copy(sg, source, at >= 0 ? offset + at : -1);
    });
  }

  template <int kColumnFragments>
  void query_side(int64_t block, int64_t bh, Written& grad_q, Written& grad_mixed,
                  Written& grad_mixed_z, Written& terms) const {
    constexpr int kWidth = kColumnFragments * kFrag;
    const int warps = summaries_warps(p_.dk), threads = 32 * warps, rows = warps * kFrag;
    const Slice slice = slice_of(p_, unsigned(bh));
    const int n = count(block);
    SharedTile mixed(kMaxDim, kWidth + kPad);
    stage_state<kWidth / kSegment>(mixed, threads, rows, state_offset(p_, bh, block), state_.mixed);
    const float* z = &state_.mixed_z[size_t(normaliser_offset(p_, bh, block))];
    std::vector<std::vector<float>> acc(static_cast<size_t>(rows), std::vector<float>(kWidth));
    std::vector<std::vector<float>> u(kGradChunk, std::vector<float>(size_t(rows)));
    std::vector<float> grad_z(size_t(p_.dk)), inverse(kGradChunk), dden(kGradChunk);
    // Causal: each token's normalisers, and the sums of phi(k) over the chunks before.
    std::vector<std::vector<float>> own_z(kGradChunk, std::vector<float>(size_t(p_.dk)));
    std::vector<float> running(size_t(p_.dk));
    const auto z_of = [&](int t, int a) { return p_.causal ? own_z[size_t(t)][size_t(a)] : z[a]; };
    for (int c0 = 0; c0 < n; c0 += kGradChunk) {
      SharedTile qt(kGradChunk, kMaxDim + kPad), gt(kGradChunk, kWidth + kPad);
      stage_block_rows<kMaxDim / kSegment>(p_, qt, threads, kGradChunk, block, slice, c0, q_, p_.dk);
      stage_block_rows<kWidth / kSegment>(p_, gt, threads, kGradChunk, block, slice, c0, grad_o_, p_.dv);
      const int valid = std::min(kGradChunk, n - c0);
      for (int t = 0; t < valid; ++t)  // whole fragments of tokens in the kernel; these are read
        for (int d = 0; d < rows; ++d) {
          float sum = 0;
          for (int e = 0; e < kWidth; ++e) sum += gt.at(t, e) * mixed.at(d, e);
          u[size_t(t)][size_t(d)] = sum;
        }
      if (p_.causal) own_keys<kColumnFragments>(block, slice, c0, valid, gt, u, running, z, own_z);
      for (int t = 0; t < valid && p_.normalize; ++t) {
        float den = 0, dot = 0;
        for (int a = 0; a < p_.dk; ++a) {
          den += phi(qt.at(t, a)) * z_of(t, a);
          dot += phi(qt.at(t, a)) * u[size_t(t)][size_t(a)];
        }
        inverse[size_t(t)] = 1.0f / (den + float(p_.eps));
        dden[size_t(t)] = -dot * inverse[size_t(t)] * inverse[size_t(t)];
      }
      for (int t = 0; t < valid && p_.causal; ++t) {
        const int64_t row = block_token_row(p_, slice, block, c0 + t);
        terms.set(2 * row, p_.normalize ? inverse[size_t(t)] : float(p_.scale));
        terms.set(2 * row + 1, p_.normalize ? dden[size_t(t)] : 0.0f);
      }
      for_each_staged<kMaxDim / kSegment>(threads, kGradChunk, [&](const Segment& sg) {
        if (sg.row >= valid || sg.column >= p_.dk) return;
        const int64_t row = block_token_row(p_, slice, block, c0 + sg.row);
        for (int x = 0; x < kSegment; ++x) {
          const int a = sg.column + x;
          const float du = u[size_t(sg.row)][size_t(a)];
          const float grad_phi = p_.normalize ? du * inverse[size_t(sg.row)] + dden[size_t(sg.row)] * z_of(sg.row, a)
                                              : float(p_.scale) * du;
          grad_q.set(row * p_.dk + a, round_token(p_, grad_phi * cuda::feature_derivative(
                                                                     p_.phi, qt.at(sg.row, a))));
        }
      });
      if (p_.normalize) {
        for (int d = 0; d < p_.dk; ++d)
          for (int j = 0; j < valid; ++j) grad_z[size_t(d)] += phi(qt.at(j, d)) * dden[size_t(j)];
        for_each_staged<kWidth / kSegment>(threads, kGradChunk, [&](const Segment& sg) {
          if (sg.row >= valid) return;
          for (int x = 0; x < kSegment; ++x)
            gt.replace(sg.row, sg.column + x, round_bf16(gt.at(sg.row, sg.column + x) * inverse[size_t(sg.row)]));
        });
      }
      for (int step = 0; step < kGradChunk && step < valid; step += kFrag)
        for (int d = 0; d < rows; ++d)
          for (int e = 0; e < kWidth; ++e)
            for (int j = step; j < step + kFrag; ++j)
              acc[size_t(d)][size_t(e)] += operand_feature(p_.phi, qt.at(j, d)) * gt.at(j, e);
    }
    const int64_t base = state_offset(p_, bh, block);
    const float scale = p_.normalize ? 1.0f : float(p_.scale);
    for (int warp = 0; warp < warps; ++warp)
      for (int f = 0; f < kColumnFragments; ++f)
        write_fragment(acc, warp * kFrag, f * kFrag, [&](const Segment& ls, const float (&x)[kSegment]) {
          const int64_t d = warp * kFrag + ls.row, e = f * kFrag + ls.column;
          if (d < p_.dk && e < p_.dv)
            for (int y = 0; y < kSegment; ++y) grad_mixed.set(base + d * p_.dv + e + y, round_bf16(scale * x[y]));
        });
    for (int d = 0; d < p_.dk; ++d) grad_mixed_z.set(normaliser_offset(p_, bh, block) + d, grad_z[size_t(d)]);
  }

  // Token-level causal, the query side's own keys for the chunk [c0, c0 +
  // valid): the scores grad_o_t . v_j masked to j <= t, scaled by W[i, i]
  // and rounded, added to u against phi(k) a chunk of keys at a time, and the
  // tokens' normalisers z~_i + W[i, i] sum_{j <= t} phi(k_j).
  template <int kColumnFragments>
  void own_keys(int64_t block, const Slice& slice, int c0, int valid, const SharedTile& gt,
                std::vector<std::vector<float>>& u, std::vector<float>& running, const float* z,
                std::vector<std::vector<float>>& own_z) const {
    constexpr int kWidth = kColumnFragments * kFrag;
    const int threads = 32 * summaries_warps(p_.dk), rows = summaries_warps(p_.dk) * kFrag;
    const float w_ii = diagonal_weight(slice, block);
    for (int j0 = 0; j0 <= c0; j0 += kGradChunk) {
      SharedTile kt(kGradChunk, kMaxDim + kPad), vt(kGradChunk, kWidth + kPad), st(kGradChunk, kGradChunk + kPad);
      stage_block_rows<kMaxDim / kSegment>(p_, kt, threads, kGradChunk, block, slice, j0, k_, p_.dk);
      stage_block_rows<kWidth / kSegment>(p_, vt, threads, kGradChunk, block, slice, j0, v_, p_.dv);
      for (int t = 0; t < kGradChunk; ++t)
        for (int j = 0; j < kGradChunk; ++j) {
          float sum = 0;
          for (int e = 0; e < kWidth; ++e) sum += gt.at(t, e) * vt.at(j, e);
          st.set(t, j, round_bf16(j0 + j <= c0 + t ? w_ii * sum : 0.0f));
        }
      for (int t = 0; t < valid; ++t)
        for (int d = 0; d < rows; ++d)
          for (int j = 0; j < kGradChunk; ++j)
            u[size_t(t)][size_t(d)] += st.at(t, j) * operand_feature(p_.phi, kt.at(j, d));
      if (j0 == c0)
        for (int d = 0; d < p_.dk; ++d)
          for (int t = 0; t < valid; ++t) {
            running[size_t(d)] += phi(kt.at(t, d));
            own_z[size_t(t)][size_t(d)] = z[d] + w_ii * running[size_t(d)];
          }
    }
  }

  // The partial sums per (tile of W, copy, split), then their sum in order
  // with the normalisers' term, into grad_w as the operator uses W.
  void weight_gradient(const std::vector<float>& grad_mixed, const std::vector<float>& grad_mixed_z,
                       const std::vector<float>& diagonal, std::vector<float>& grad_w) const {
    constexpr int kSegments = kInnerChunk / kSegment;
    const WeightSplit split = weight_split(p_);
    const int64_t m = p_.blocks;
    Written partials(split.copies * split.splits * m * m);
    for (int64_t copy = 0; copy < split.copies; ++copy)
      for (int64_t part = 0; part < split.splits; ++part)
        for (int64_t i0 = 0; i0 < m; i0 += kWeightTile)
          for (int64_t b0 = 0; b0 < m; b0 += kWeightTile) {
            std::vector<std::vector<float>> acc(kWeightTile, std::vector<float>(kWeightTile));
            const int64_t first = part * split.chunks_per_split;
            const int64_t last = std::min(first + split.chunks_per_split, split.chunks);
            for (int64_t c = first; c < last; ++c) {
              const WeightChunk chunk = weight_chunk(p_, split, copy, c);
              SharedTile gt(kWeightTile, kInnerChunk + kPad), st(kWeightTile, kInnerChunk + kPad);
              for_each_staged<kSegments>(kWeightWarps * 32, kWeightTile, [&](const Segment& sg) {
                const int64_t i = i0 + sg.row, b = b0 + sg.row, f = chunk.first + sg.column;
                gt.copy(sg, grad_mixed, i < m ? state_offset(p_, chunk.bh, i) + f : -1);
                st.copy(sg, state_.s, b < m ? state_offset(p_, chunk.bh, b) + f : -1);
              });
              for (int i = 0; i < kWeightTile; ++i)
                for (int b = 0; b < kWeightTile; ++b)
                  for (int x = 0; x < kInnerChunk; ++x) acc[size_t(i)][size_t(b)] += gt.at(i, x) * st.at(b, x);
            }
            for (int warp = 0; warp < kWeightWarps; ++warp)
              for (int n = 0; n < kWeightTile / kFrag; ++n)
                write_fragment(acc, warp * kFrag, n * kFrag, [&](const Segment& ls, const float (&x)[kSegment]) {
                  const int64_t i = i0 + warp * kFrag + ls.row;
                  if (i >= m) return;
                  for (int y = 0; y < kSegment; ++y) {
                    const int64_t b = b0 + n * kFrag + ls.column + y;
                    if (b < m) partials.set((copy * split.splits + part) * m * m + i * m + b, x[y]);
                  }
                });
          }
    // The sum kernel: a tile of W a CTA, its rows of grad z~ and z staged a chunk of Dk at a time.
    const int64_t slices = p_.per_head_mixing ? p_.batch : p_.batch * p_.heads;
    std::vector<float> dense(size_t(split.copies * m * m));
    for (int64_t copy = 0; copy < split.copies; ++copy)
      for (int64_t i0 = 0; i0 < m; i0 += kSumTile)
        for (int64_t b0 = 0; b0 < m; b0 += kSumTile) {
          std::vector<float> sums(kSumTile * kSumTile);
          for (int t = 0; t < kSumTile * kSumTile; ++t) {
            const int64_t i = i0 + t / kSumTile, b = b0 + t % kSumTile;
            if (i < m && b < m)
              for (int64_t part = 0; part < split.splits; ++part)
                sums[size_t(t)] += partials.x[size_t((copy * split.splits + part) * m * m + i * m + b)];
          }
          for (int64_t slice = 0; slice < slices; ++slice) {
            const int64_t bh = p_.per_head_mixing ? slice * p_.heads + copy : slice;
            for (int64_t d0 = 0; d0 < p_.dk; d0 += kSumChunk) {
              const int width = int(std::min<int64_t>(p_.dk - d0, kSumChunk));
              SharedTile gz(kSumTile, kSumChunk + 1), zt(kSumTile, kSumChunk + 1);
              for (int g = 0; g < kSumTile * kSumChunk; ++g) {
                const int row = g / kSumChunk, d = g % kSumChunk;
                if (d >= width) continue;
                if (i0 + row < m) gz.set(row, d, grad_mixed_z[size_t(normaliser_offset(p_, bh, i0 + row) + d0 + d)]);
                if (b0 + row < m) zt.set(row, d, state_.z[size_t(normaliser_offset(p_, bh, b0 + row) + d0 + d)]);
              }
              for (int t = 0; t < kSumTile * kSumTile; ++t) {
                const int ti = t / kSumTile, tb = t % kSumTile;
                if (i0 + ti < m && b0 + tb < m)
                  for (int d = 0; d < width; ++d) sums[size_t(t)] += gz.at(ti, d) * zt.at(tb, d);
              }
            }
          }
          for (int t = 0; t < kSumTile * kSumTile; ++t) {
            const int64_t i = i0 + t / kSumTile, b = b0 + t % kSumTile;
            if (i >= m || b >= m) continue;
            if (p_.causal && i == b) {  // W[i, i]'s own-block parts over the slices
              sums[size_t(t)] = 0;
              for (int64_t slice = 0; slice < slices; ++slice)
                sums[size_t(t)] += diagonal[size_t((p_.per_head_mixing ? slice * p_.heads + copy : slice) * m + i)];
            }
            dense[size_t((copy * m + i) * m + b)] = sums[size_t(t)];
            if (!p_.toeplitz && cuda::uses(p_, i, b))
              grad_w[size_t((copy * p_.w_stride + i) * p_.w_stride + b)] += sums[size_t(t)];
          }
        }
    if (!p_.toeplitz) return;
    const int64_t length = p_.toeplitz_length;
    for (int64_t copy = 0; copy < split.copies; ++copy)
      for (int64_t d = 0; d <= length; ++d)
        grad_w[size_t(copy * (length + 1) + d)] +=
            cuda::toeplitz_entry_gradient(p_, &dense[size_t(copy * m * m)], d);
  }

  template <int kColumnFragments>
  void key_value_side(int64_t block, int64_t bh, const std::vector<float>& grad_s,
                      const std::vector<float>& grad_z, const std::vector<float>& terms, Written& grad_k,
                      Written& grad_v, Written& diagonal) const {
    constexpr int kWidth = kColumnFragments * kFrag;
    const int key_fragments = summaries_warps(p_.dk), threads = kKeyValueWarps * 32;
    const Slice slice = slice_of(p_, unsigned(bh));
    const int n = count(block);
    SharedTile gs(kMaxDim, kWidth + kPad);
    stage_state<kWidth / kSegment>(gs, threads, key_fragments * kFrag, state_offset(p_, bh, block), grad_s);
    const float* gz = &grad_z[size_t(normaliser_offset(p_, bh, block))];
    std::vector<float> weight_parts(threads);  // causal: each thread's part of W[i, i]'s gradient
    for (int c0 = 0; c0 < n; c0 += kGradChunk) {
      SharedTile kt(kGradChunk, kMaxDim + kPad), vt(kGradChunk, kWidth + kPad);
      stage_block_rows<kMaxDim / kSegment>(p_, kt, threads, kGradChunk, block, slice, c0, k_, p_.dk);
      stage_block_rows<kWidth / kSegment>(p_, vt, threads, kGradChunk, block, slice, c0, v_, p_.dv);
      const int valid = std::min(kGradChunk, n - c0);
      std::vector<std::vector<float>> own_k(kGradChunk, std::vector<float>(size_t(key_fragments * kFrag))),
          own_v(kGradChunk, std::vector<float>(kWidth));
      if (p_.causal)
        own_queries<kColumnFragments>(block, slice, c0, n, kt, vt, terms, own_k, own_v, weight_parts);
      std::vector<std::vector<float>> key(kGradChunk, std::vector<float>(size_t(key_fragments * kFrag))),
          value(kGradChunk, std::vector<float>(kWidth));
      for (int r = 0; r * kFrag < valid; ++r)
        for (int t = r * kFrag; t < r * kFrag + kFrag; ++t) {
          for (int d = 0; d < key_fragments * kFrag; ++d)
            for (int e = 0; e < kWidth; ++e) key[size_t(t)][size_t(d)] += vt.at(t, e) * gs.at(d, e);
          for (int e = 0; e < kWidth; ++e)
            for (int a = 0; a < key_fragments * kFrag; ++a)
              value[size_t(t)][size_t(e)] += operand_feature(p_.phi, kt.at(t, a)) * gs.at(a, e);
        }
      for (int r = 0; r * kFrag < valid; ++r) {
        for (int f = 0; f < key_fragments; ++f)
          write_fragment(key, r * kFrag, f * kFrag, [&](const Segment& ls, const float (&x)[kSegment]) {
            const int j = r * kFrag + ls.row, column = f * kFrag + ls.column;
            if (j >= valid || column >= p_.dk) return;
            const int64_t row = block_token_row(p_, slice, block, c0 + j);
            for (int y = 0; y < kSegment; ++y)
              grad_k.set(
                  row * p_.dk + column + y,
                  round_token(p_, (x[y] + gz[column + y] + own_k[size_t(j)][size_t(column + y)]) *
                                      cuda::feature_derivative(p_.phi, kt.at(j, column + y))));
          });
        for (int f = 0; f < kColumnFragments; ++f)
          write_fragment(value, r * kFrag, f * kFrag, [&](const Segment& ls, const float (&x)[kSegment]) {
            const int j = r * kFrag + ls.row, column = f * kFrag + ls.column;
            if (j >= valid || column >= p_.dv) return;
            const int64_t row = block_token_row(p_, slice, block, c0 + j);
            for (int y = 0; y < kSegment; ++y)
              grad_v.set(row * p_.dv + column + y,
                         round_token(p_, x[y] + own_v[size_t(j)][size_t(column + y)]));
          });
      }
    }
    if (p_.causal) {
      float sum = 0;
      for (float part : weight_parts) sum += part;
      diagonal.set(bh * p_.blocks + block, sum);
    }
  }

  // Token-level causal, the key and value side's own queries for the key
  // chunk [c0, c0 + kGradChunk): per chunk of queries from c0 on, the scores
  // A = phi(k_j) . phi(q_t) and grad_o_t . v_j of the four warps' fragments,
  // masked to t >= j; dA = W[i, i] (m_t grad_o_t . v_j + grad den_t) and
  // W[i, i] A m_t rounded into tiles, then against phi(Q) and grad_o into
  // own_k and own_v; each lane's part of W[i, i]'s gradient in its thread's slot.
  template <int kColumnFragments>
  void own_queries(int64_t block, const Slice& slice, int c0, int n, const SharedTile& kt, const SharedTile& vt,
                   const std::vector<float>& terms, std::vector<std::vector<float>>& own_k,
                   std::vector<std::vector<float>>& own_v, std::vector<float>& weight_parts) const {
    constexpr int kWidth = kColumnFragments * kFrag;
    const int key_fragments = summaries_warps(p_.dk), threads = kKeyValueWarps * 32;
    const float w_ii = diagonal_weight(slice, block);
    for (int t0 = c0; t0 < n; t0 += kGradChunk) {
      SharedTile qt(kGradChunk, kMaxDim + kPad), gt(kGradChunk, kWidth + kPad);
      stage_block_rows<kMaxDim / kSegment>(p_, qt, threads, kGradChunk, block, slice, t0, q_, p_.dk);
      stage_block_rows<kWidth / kSegment>(p_, gt, threads, kGradChunk, block, slice, t0, grad_o_, p_.dv);
      std::vector<float> m(kGradChunk), dd(kGradChunk);
      for (int t = 0; t < kGradChunk; ++t) {
        const int64_t row = block_token_row(p_, slice, block, t0 + t);
        m[size_t(t)] = row >= 0 ? terms[size_t(2 * row)] : 0.0f;
        dd[size_t(t)] = row >= 0 ? terms[size_t(2 * row + 1)] : 0.0f;
      }
      map_features(p_, qt, kGradChunk);
      std::vector<std::vector<float>> scores(kGradChunk, std::vector<float>(kGradChunk)),
          dots(kGradChunk, std::vector<float>(kGradChunk));
      for (int j = 0; j < kGradChunk; ++j)
        for (int t = 0; t < kGradChunk; ++t) {
          for (int d = 0; d < key_fragments * kFrag; ++d)
            scores[size_t(j)][size_t(t)] += operand_feature(p_.phi, kt.at(j, d)) * qt.at(t, d);
          for (int e = 0; e < kWidth; ++e) dots[size_t(j)][size_t(t)] += vt.at(j, e) * gt.at(t, e);
        }
      SharedTile grad_scores(kGradChunk, kGradChunk + kPad), scaled(kGradChunk, kGradChunk + kPad);
      for (int f = 0; f < kGradChunkFragments * kGradChunkFragments; ++f) {
        const int r = f / kGradChunkFragments, nf = f % kGradChunkFragments;
        write_fragment(dots, r * kFrag, nf * kFrag, [&](const Segment& ls, const float (&x)[kSegment]) {
          const int lane = 2 * ls.row + ls.column / kSegment;
          const int jl = r * kFrag + ls.row, tl = nf * kFrag + ls.column;
          for (int y = 0; y < kSegment; ++y) {
            const bool seen = t0 + tl + y >= c0 + jl && t0 + tl + y < n;
            const float a = scores[size_t(jl)][size_t(tl + y)], pull = m[size_t(tl + y)] * x[y] + dd[size_t(tl + y)];
            grad_scores.set(jl, tl + y, round_bf16(seen ? w_ii * pull : 0.0f));
            scaled.set(jl, tl + y, round_bf16(seen ? w_ii * a * m[size_t(tl + y)] : 0.0f));
            weight_parts[size_t(f * 32 + lane)] += seen ? a * pull : 0.0f;
          }
        });
      }
      for (int j = 0; j < kGradChunk; ++j)
        for (int t = 0; t < kGradChunk; ++t) {
          for (int d = 0; d < key_fragments * kFrag; ++d) own_k[size_t(j)][size_t(d)] += grad_scores.at(j, t) * qt.at(t, d);
          for (int e = 0; e < kWidth; ++e) own_v[size_t(j)][size_t(e)] += scaled.at(j, t) * gt.at(t, e);
        }
    }
  }

  const KernelProblem& p_;
  const std::vector<float>&q_, &k_, &v_, &w_, &grad_o_;
  const EmulatedForward& state_;
};

// The emulated backward against the float64 backward on the same inputs,
// given as tokens of `format`.
void check_backward(const Case& c, cuda::TokenFormat format) {
  const EmulatedCase e(c, 31, format);
  const KernelProblem& p = e.problem();
  ASSERT_TRUE(fits(p));

  const std::vector<float> qf = cast<float>(e.q), kf = cast<float>(e.k), vf = cast<float>(e.v),
                           gf = cast<float>(e.grad_o);
  const EmulatedForward state = ForwardEmulation(p, qf, kf, vf, e.w).run();
  const EmulatedBackward got = BackwardEmulation(p, qf, kf, vf, e.w, gf, state).run();

  const TensorView<const double> qv = view(e.q, c.q_shape()), kv = view(e.k, c.q_shape()),
                                 vv = view(e.v, c.v_shape()), wv = view(e.w64, c.w_shape());
  std::vector<double> o64(e.v.size()), dq(e.q.size()), dk(e.k.size()), dv(e.v.size()),
      dw(e.w64.size());
  forward<double>(e.options, qv, kv, vv, wv, view(o64, c.v_shape()));
  backward<double>(e.options, qv, kv, vv, wv, view(std::as_const(o64), c.v_shape()),
                   view(e.grad_o, c.v_shape()), view(dq, c.q_shape()), view(dk, c.q_shape()),
                   view(dv, c.v_shape()), view(dw, c.w_shape()));
  EXPECT_CLOSE(got.grad_q, dq, kStateGradientTolerance, "grad q");
  EXPECT_CLOSE(got.grad_k, dk, kStateGradientTolerance, "grad k");
  EXPECT_CLOSE(got.grad_v, dv, kStateGradientTolerance, "grad v");
  EXPECT_CLOSE(got.grad_w, dw,
               format == cuda::TokenFormat::float16 ? kFloat16StateWeightGradientTolerance
                                                    : kStateWeightGradientTolerance,
               "grad w");
}

class Bf16StateBackwardTiling : public testing::TestWithParam<Case> {};

TEST_P(Bf16StateBackwardTiling, MatchesFloat64OnTheSameInputs) {
  check_backward(GetParam(), cuda::TokenFormat::bfloat16);
}

INSTANTIATE_TEST_SUITE_P(AllModes, Bf16StateBackwardTiling, testing::ValuesIn(bf16_state_cases()),
                         case_name);

// float16 tokens, rounded to bfloat16 as they are staged and written as float16.
class Float16StateBackwardTiling : public testing::TestWithParam<Case> {};

TEST_P(Float16StateBackwardTiling, MatchesFloat64OnTheSameInputs) {
  check_backward(GetParam(), cuda::TokenFormat::float16);
}

INSTANTIATE_TEST_SUITE_P(AllModes, Float16StateBackwardTiling,
                         testing::ValuesIn(float16_state_cases()), case_name);

}  // namespace
}  // namespace mhla::test
