// The CPU backend: the chunked kernels with the mixer of W
// (cpu/cpu_attention.hpp), the bfloat16 kernels where the CPU has
// AVX512-BF16, and per-thread scratch arrays.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>

#include "backend/backend.hpp"
#include "cpu/bf16_backward.hpp"
#include "cpu/bf16_forward.hpp"
#include "cpu/chunked_attention.hpp"
#include "cpu/cpu_attention.hpp"
#include "cpu/forked_children.hpp"
#include "cpu/simd/bf16_products.hpp"
#include "cpu/simd/isa.hpp"
#include "cpu/workspace.hpp"
#include "mhla/operator.hpp"

namespace mhla::cpu {
namespace {

// The bfloat16 kernels: the forward's products on bfloat16 operands, the
// backward's phases reading and writing the bfloat16 tensors in place. Not
// in causal mode (its in-block products are float only).
class CpuBf16Attention final : public backend::HalfAttention<bfloat16> {
 public:
  CpuBf16Attention(const detail::Problem& p, const float* w)
      : p_(p),
        mixer_(make_mixer(p_, w)),
        kernel_(p_, *mixer_),
        forward_(p_, *mixer_),
        backward_(p_, *mixer_, kernel_) {}

  bool forward(const bfloat16* q, const bfloat16* k, const bfloat16* v, bfloat16* o,
               float* saved_summaries, float* saved_mixed) const override {
    return forward_.forward(q, k, v, o, saved_summaries, saved_mixed);
  }
  bool backward(const bfloat16* q, const bfloat16* k, const bfloat16* v, const bfloat16* grad_o,
                bfloat16* grad_q, bfloat16* grad_k, bfloat16* grad_v, float* grad_w,
                const float* saved_summaries, const float* saved_mixed) const override {
    return backward_.backward(q, k, v, grad_o, grad_q, grad_k, grad_v, grad_w, saved_summaries,
                              saved_mixed);
  }

 private:
  const detail::Problem p_;
  const std::unique_ptr<Mixer<float>> mixer_;
  const ChunkedAttention<float> kernel_;  // the summaries the backward recomputes
  const Bf16Forward forward_;
  const Bf16Backward backward_;
};

// The CPU's memory: the calling thread's scratch arrays (cpu/workspace.hpp)
// and plain loops.
class CpuMemory final : public backend::Memory {
 public:
  void* scratch(Scratch slot, size_t bytes) const override {
    return cpu::scratch<std::byte>(slot, bytes);
  }
  void release_scratch() const override { release_scratch_buffers(); }
  std::shared_ptr<void> allocate(size_t bytes) const override {
    constexpr std::align_val_t line{64};
    return {::operator new(bytes, line), [](void* p) { ::operator delete(p, line); }};
  }

  bool elementwise(const backend::Elementwise& pass) const override {
    using backend::Element;
    using Kind = backend::Elementwise::Kind;
    const int64_t n = pass.n;
    const Element from = pass.from_type, to = pass.to_type;
    if (pass.kind == Kind::zero || (pass.kind == Kind::copy && from == to)) {
      const size_t bytes = size_t(n) * backend::element_bytes(to);
      if (pass.kind == Kind::zero) {
        std::memset(pass.to, 0, bytes);  // +0.0 in every element type
      } else {
        std::memcpy(pass.to, pass.from, bytes);
      }
      return true;
    }
    if (pass.kind == Kind::add && from == to && from == Element::float32) {
      add_to(static_cast<const float*>(pass.from), n, static_cast<float*>(pass.to));
      return true;
    }
    if (pass.kind == Kind::add && from == to && from == Element::float64) {
      add_to(static_cast<const double*>(pass.from), n, static_cast<double*>(pass.to));
      return true;
    }
    if (pass.kind == Kind::copy && to == Element::float32 && from == Element::bfloat16) {
      widen(static_cast<const bfloat16*>(pass.from), n, static_cast<float*>(pass.to));
      return true;
    }
    if (pass.kind == Kind::copy && to == Element::float32 && from == Element::float16) {
      widen(static_cast<const float16*>(pass.from), n, static_cast<float*>(pass.to));
      return true;
    }
    if (pass.kind == Kind::copy && from == Element::float32 && to == Element::bfloat16) {
      const float* src = static_cast<const float*>(pass.from);
      bfloat16* dst = static_cast<bfloat16*>(pass.to);
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < n; ++i) dst[i] = to_bfloat16(src[i]);
      return true;
    }
    if (pass.kind == Kind::copy && from == Element::float32 && to == Element::float16) {
      return narrow_to_float16(static_cast<const float*>(pass.from), n,
                               static_cast<float16*>(pass.to));
    }
    throw std::logic_error("mhla: an element-wise pass the CPU backend does not define");
  }
  void to_host(const void* from, size_t bytes, void* to) const override {
    std::memcpy(to, from, bytes);
  }

 private:
  template <typename T>
  static void add_to(const T* from, int64_t n, T* to) {
    for (int64_t i = 0; i < n; ++i) to[i] += from[i];
  }
  template <typename H>
  static void widen(const H* from, int64_t n, float* to) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) to[i] = to_float(from[i]);
  }
  static bool narrow_to_float16(const float* from, int64_t n, float16* to) {
    uint32_t overflowed = 0;
#pragma omp parallel for simd schedule(static) reduction(| : overflowed)
    for (int64_t i = 0; i < n; ++i) {
      to[i] = to_float16(from[i]);
      // Infinite now (all exponent bits) but finite before.
      overflowed |= uint32_t((to[i].bits & 0x7c00u) == 0x7c00u) &
                    uint32_t((std::bit_cast<uint32_t>(from[i]) & 0x7f800000u) != 0x7f800000u);
    }
    return overflowed == 0;
  }
};

class CpuBackend final : public backend::Backend {
 public:
  std::unique_ptr<backend::Attention<float>> attention(const detail::Problem& p,
                                                       const float* w) const override {
    return std::make_unique<CpuAttention<float>>(p, w);
  }
  std::unique_ptr<backend::Attention<double>> attention(const detail::Problem& p,
                                                        const double* w) const override {
    return std::make_unique<CpuAttention<double>>(p, w);
  }
  std::unique_ptr<backend::HalfAttention<bfloat16>> half_attention(const detail::Problem& p,
                                                                   const float* w,
                                                                   bfloat16) const override {
    if (p.causal || !simd::bf16_products_available()) return nullptr;
    return std::make_unique<CpuBf16Attention>(p, w);
  }
  // float16 computes in float on widened copies (exact): the CPU's 16-bit
  // products here are AVX512-BF16's, which take bfloat16 only.
  std::unique_ptr<backend::HalfAttention<float16>> half_attention(const detail::Problem&,
                                                                  const float*,
                                                                  float16) const override {
    return nullptr;
  }

  const backend::Memory& memory() const override { return memory_; }

 private:
  CpuMemory memory_;
};

}  // namespace
}  // namespace mhla::cpu

namespace mhla::backend {

// At load: every entry point reaches the CPU backend through cpu_backend(), so
// this object file, and the fork handler with it, is in every program.
[[maybe_unused]] const bool forked_children_run_serially = cpu::run_forked_children_serially();

const Backend& cpu_backend() {
  static const cpu::CpuBackend backend;
  return backend;
}

}  // namespace mhla::backend

namespace mhla {

// The CPU's own queries of the public API (mhla/operator.hpp).
bool bf16_products() { return cpu::simd::bf16_products_available(); }

std::string kernel_isa() { return cpu::simd::target_name(cpu::simd::active_target()); }

}  // namespace mhla
