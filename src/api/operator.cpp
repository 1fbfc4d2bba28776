// Public MHLA entry points: validate once, then run the kernels of the
// tensors' device (backend/backend.hpp) with the mixing (dense or Toeplitz W)
// the options ask for, keeping or reading a ForwardState's arrays where the
// call has one (api/forward_record.hpp).
#include "mhla/operator.hpp"

#include <type_traits>
#include <utility>

#include "api/forward_record.hpp"
#include "backend/backend.hpp"
#include "core/finite_results.hpp"
#include "core/host_copy.hpp"
#include "core/validated_call.hpp"
#include "mhla/device_execution.hpp"

namespace mhla {

namespace {

using backend::Scratch;

std::vector<int64_t> summaries_shape(const detail::AttentionDims& d, int64_t blocks) {
  return {d.batch, d.heads, blocks, d.dk, d.dv + 1};
}

// The opening of every MHLA entry point here, for float and bfloat16 tokens
// alike: q's device has a backend in this build, every tensor is there, the
// call is validated and o checked.
template <typename S, typename W, typename O>
detail::ValidatedCall checked_call(const char* fn, const Options& options,
                                   const TensorView<const S>& q, const TensorView<const S>& k,
                                   const TensorView<const S>& v, const TensorView<const W>& w,
                                   const TensorView<O>& o) {
  // A failed check of an earlier deferred call is reported first.
  backend::backend_for(fn, "q", q.device).raise_deferred(false);
  detail::Problem problem = detail::validate_mhla(fn, options, q, k, v, w, q.device);
  detail::check_output(fn, "o", o, detail::v_shape(problem), q.device);
  return {std::move(problem), options.layout};
}

// The reports of non-finite results read the tensors they name: on another
// device, from host copies (only when a kernel has raised its flag).
template <typename T>
void report_output(const char* fn, const detail::Problem& p, const TensorView<const T>& q,
                   const TensorView<const T>& k, const TensorView<const T>& v,
                   const TensorView<T>& o, const char* type = nullptr) {
  const detail::HostCopy hq(q), hk(k), hv(v);
  const detail::HostCopy ho(o);
  detail::report_non_finite_output(fn, p, hq.view(), hk.view(), hv.view(), ho.view(), type);
}

// The device's float or double kernels for a validated problem. A backend
// answers nullptr for a problem its kernels do not take (backend.hpp); the
// call is refused here, in one place, by name.
template <typename T>
std::unique_ptr<backend::Attention<T>> kernels_for(const char* fn, const backend::Backend& device,
                                                   const detail::Problem& p, const T* w,
                                                   Device where) {
  if (auto kernels = device.attention(p, w)) return kernels;
  const std::string type = sizeof(T) == 4 ? "float32" : "float64";
  detail::fail(fn, std::string("the ") + to_string(where) + " backend has no " + type +
                       " kernels for " +
                       (p.causal ? "token-level causal masking (Masking::causal); use "
                                   "Masking::block_causal, bfloat16 or float16 tokens, "
                                   "options.cuda.float32_tensor_cores for float32, or CPU tensors"
                                 : "this call; pass CPU tensors"));
}

// Elements of a checked buffer.
template <typename T>
int64_t elements(const TensorView<T>& t) {
  return detail::checked_product(t.shape, "buffer");
}

// A float copy of a 16-bit tensor (exact) in the calling thread's scratch:
// fresh buffers cost more in page faults than the copies.
template <typename H>
TensorView<const float> widened(const backend::Backend& device, const TensorView<const H>& x,
                                Scratch slot) {
  const int64_t n = elements(x);
  float* dst = backend::scratch<float>(device.memory(), slot, size_t(n));
  backend::convert(device.memory(), x.data, n, dst);
  return {dst, x.shape, x.device};
}

// `from` rounded into `to`. A float result beyond float16's range would
// become infinity there: that is an mhla::Error naming the entry, found on
// the host once the narrowing has seen one.
template <typename H>
void narrowed(const char* fn, const char* name, const backend::Backend& device,
              const TensorView<float>& from, const TensorView<H>& to, const char* remedy) {
  if constexpr (std::is_same_v<H, float16>) {
    if (backend::convert(device.memory(), from.data, elements(to), to.data)) return;
    const detail::HostCopy host(TensorView<const float>{from.data, from.shape, from.device});
    detail::check_float16_range(fn, {name, host.data(), from.shape}, remedy);
  } else {
    backend::convert(device.memory(), from.data, elements(to), to.data);
  }
}

// backward on a validated call, float or double tokens.
template <typename T>
void run_backward(const char* fn, const detail::Problem& p, const backend::Backend& device,
                  const TensorView<const T>& q, const TensorView<const T>& k,
                  const TensorView<const T>& v, const TensorView<const T>& w,
                  const TensorView<const T>& o, const TensorView<const T>& grad_o,
                  const TensorView<T>& grad_q, const TensorView<T>& grad_k,
                  const TensorView<T>& grad_v, const TensorView<T>& grad_w,
                  const T* saved_summaries, const T* saved_mixed) {
  // The kernels add to grad_w.
  backend::zero(device.memory(), grad_w.data, elements(grad_w));
  const bool finite =
      kernels_for(fn, device, p, w.data, q.device)
          ->backward(q.data, k.data, v.data, grad_o.data, grad_q.data, grad_k.data, grad_v.data,
                     grad_w.data, saved_summaries, saved_mixed) &&
      // grad_w is small ([H,] M, M) and written by the mixer: scanned
      // here (deferred, the mixer's kernels flag it on the device).
      (p.checks_on_device ||
       detail::first_non_finite(detail::HostCopy(grad_w).data(), elements(grad_w)) < 0);
  if (finite) return;
  const detail::HostCopy hq(q), hk(k), hv(v), ho(o), hgo(grad_o);
  const detail::HostCopy hgq(grad_q), hgk(grad_k), hgv(grad_v), hgw(grad_w);
  detail::report_non_finite_gradients(fn, p, hq.view(), hk.view(), hv.view(), ho.view(), hgo.view(),
                                      hgq.view(), hgk.view(), hgv.view(), hgw.view());
}

}  // namespace

std::vector<int64_t> saved_summaries_shape(const Options& options,
                                           const std::vector<int64_t>& q_shape,
                                           const std::vector<int64_t>& v_shape) {
  const char* fn = "mhla::saved_summaries_shape";
  // Shapes only: any non-null address passes the pointer checks.
  const int marker = 0;
  const detail::AttentionDims d =
      detail::check_qkv(fn, &marker, q_shape, &marker, q_shape, &marker, v_shape);
  detail::check_layout_tokens(fn, options.layout, d.tokens);
  return summaries_shape(d, options.layout.num_blocks());
}

namespace {

// forward on a validated call whose state arrays (nullptr: none) are ready,
// 16-bit tokens on the device's 16-bit kernels where it has them for the
// problem, else on the float kernels over widened copies.
template <typename X>
void run_forward(const char* fn, const detail::Problem& p, const TensorView<const X>& q,
                 const TensorView<const X>& k, const TensorView<const X>& v,
                 const TensorView<const weight_t<X>>& w, const TensorView<X>& o,
                 weight_t<X>* summaries, weight_t<X>* mixed) {
  const backend::Backend& device = backend::backend_for(fn, "q", q.device);
  if constexpr (std::is_same_v<weight_t<X>, X>) {  // float and double tokens
    if (!kernels_for(fn, device, p, w.data, q.device)
             ->forward(q.data, k.data, v.data, o.data, summaries, mixed))
      report_output(fn, p, q, k, v, o);
  } else {
    if (const auto kernels = device.half_attention(p, w.data, X{})) {
      if (kernels->forward(q.data, k.data, v.data, o.data, summaries, mixed)) return;
      // Rare: the report, on float copies of what the kernels wrote (a float16
      // o beyond its range is infinite there).
      const TensorView<const float> of = widened<X>(device, o, Scratch::widened_o);
      report_output(fn, p, widened(device, q, Scratch::widened_q),
                    widened(device, k, Scratch::widened_k), widened(device, v, Scratch::widened_v),
                    TensorView<float>{const_cast<float*>(of.data), o.shape, o.device},
                    std::is_same_v<X, float16> ? "float16" : "float32");
      return;
    }
    // The float kernels on widened copies where the device has no 16-bit
    // kernels for the problem (on the CPU: float16, causal masking, or no
    // AVX512-BF16).
    const TensorView<const float> qf = widened(device, q, Scratch::widened_q),
                                  kf = widened(device, k, Scratch::widened_k),
                                  vf = widened(device, v, Scratch::widened_v);
    const TensorView<float> of{
        backend::scratch<float>(device.memory(), Scratch::widened_o, size_t(elements(o))), o.shape,
        o.device};
    if (!kernels_for(fn, device, p, w.data, q.device)
             ->forward(qf.data, kf.data, vf.data, of.data, summaries, mixed))
      report_output(fn, p, qf, kf, vf, of);
    narrowed(fn, "o", device, of, o, "rescale q, k or v");
  }
}

// forward, with or without a state to fill.
template <typename X>
void forward_call(const Options& options, const TensorView<const X>& q,
                  const TensorView<const X>& k, const TensorView<const X>& v,
                  const TensorView<const weight_t<X>>& w, const TensorView<X>& o,
                  ForwardState<weight_t<X>>* state) {
  const char* fn = "mhla::forward";
  if (state != nullptr) detail::forget_call(*state);
  const detail::ValidatedCall call = checked_call(fn, options, q, k, v, w, o);
  const detail::Problem& p = call.problem();
  if (state == nullptr) return run_forward(fn, p, q, k, v, w, o, nullptr, nullptr);
  const auto [summaries, mixed] =
      detail::arrays_to_fill(fn, summaries_shape(p, p.blocks), q.device, *state);
  run_forward(fn, p, q, k, v, w, o, summaries, mixed);
  detail::record_call<weight_t<X>, X>(options, q, k, v, w, o, *state);
}

// backward, with or without a state to read: the state is checked first,
// then the call and its gradient buffers.
template <typename X>
void backward_call(const Options& options, const TensorView<const X>& q,
                   const TensorView<const X>& k, const TensorView<const X>& v,
                   const TensorView<const weight_t<X>>& w, const TensorView<const X>& o,
                   const TensorView<const X>& grad_o, const TensorView<X>& grad_q,
                   const TensorView<X>& grad_k, const TensorView<X>& grad_v,
                   const TensorView<weight_t<X>>& grad_w, const ForwardState<weight_t<X>>* state) {
  const char* fn = "mhla::backward";
  using S = weight_t<X>;
  std::pair<const S*, const S*> saved{nullptr, nullptr};
  if (state != nullptr) saved = detail::arrays_to_read<S, X>(options, q, k, v, w, o, *state);
  const auto [summaries, mixed] = saved;
  const detail::ValidatedCall call = checked_call(fn, options, q, k, v, w, o);
  const detail::Problem& p = call.problem();
  detail::check_gradients(fn, p, grad_o, grad_q, grad_k, grad_v, q.device);
  detail::check_output(fn, "grad_w", grad_w, w.shape, q.device);
  const backend::Backend& device = backend::backend_for(fn, "q", q.device);
  if constexpr (std::is_same_v<weight_t<X>, X>) {  // float and double tokens
    run_backward(fn, p, device, q, k, v, w, o, grad_o, grad_q, grad_k, grad_v, grad_w, summaries,
                 mixed);
  } else {
    // The 16-bit kernels read and write the tensors in place. A flag of
    // non-finite results is checked, and reported, by the float path below.
    if (const auto kernels = device.half_attention(p, w.data, X{})) {
      backend::zero(device.memory(), grad_w.data, elements(grad_w));
      if (kernels->backward(q.data, k.data, v.data, grad_o.data, grad_q.data, grad_k.data,
                            grad_v.data, grad_w.data, summaries, mixed) &&
          (p.checks_on_device ||
           detail::first_non_finite(detail::HostCopy(grad_w).data(), elements(grad_w)) < 0))
        return;
    }
    // The float kernels on widened copies; the gradients are rounded at the end.
    const int64_t nq = elements(grad_q), nv = elements(grad_v);
    const TensorView<float> gq{
        backend::scratch<float>(device.memory(), Scratch::token_grad_q, size_t(nq)), grad_q.shape,
        q.device},
        gk{backend::scratch<float>(device.memory(), Scratch::token_grad_k, size_t(nq)),
           grad_k.shape, q.device},
        gv{backend::scratch<float>(device.memory(), Scratch::token_grad_v, size_t(nv)),
           grad_v.shape, q.device};
    run_backward<float>(
        fn, p, device, widened(device, q, Scratch::widened_q),
        widened(device, k, Scratch::widened_k), widened(device, v, Scratch::widened_v), w,
        widened(device, o, Scratch::widened_o), widened(device, grad_o, Scratch::widened_grad_o),
        gq, gk, gv, grad_w, summaries, mixed);
    const char* remedy = "scale grad_o down (a smaller loss scale)";
    narrowed(fn, "grad_q", device, gq, grad_q, remedy);
    narrowed(fn, "grad_k", device, gk, grad_k, remedy);
    narrowed(fn, "grad_v", device, gv, grad_v, remedy);
  }
}

}  // namespace

template <typename T>
void forward(const Options& options, TensorView<const T> q, TensorView<const T> k,
             TensorView<const T> v, TensorView<const weight_t<T>> w, TensorView<T> o) {
  forward_call<T>(options, q, k, v, w, o, nullptr);
}

template <typename T>
void forward(const Options& options, TensorView<const T> q, TensorView<const T> k,
             TensorView<const T> v, TensorView<const weight_t<T>> w, TensorView<T> o,
             ForwardState<weight_t<T>>& state) {
  forward_call<T>(options, q, k, v, w, o, &state);
}

template <typename T>
void backward(const Options& options, TensorView<const T> q, TensorView<const T> k,
              TensorView<const T> v, TensorView<const weight_t<T>> w, TensorView<const T> o,
              TensorView<const T> grad_o, TensorView<T> grad_q, TensorView<T> grad_k,
              TensorView<T> grad_v, TensorView<weight_t<T>> grad_w) {
  backward_call<T>(options, q, k, v, w, o, grad_o, grad_q, grad_k, grad_v, grad_w, nullptr);
}

template <typename T>
void backward(const Options& options, TensorView<const T> q, TensorView<const T> k,
              TensorView<const T> v, TensorView<const weight_t<T>> w, TensorView<const T> o,
              TensorView<const T> grad_o, TensorView<T> grad_q, TensorView<T> grad_k,
              TensorView<T> grad_v, TensorView<weight_t<T>> grad_w,
              const ForwardState<weight_t<T>>& state) {
  backward_call<T>(options, q, k, v, w, o, grad_o, grad_q, grad_k, grad_v, grad_w, &state);
}

FlopCount mhla_flops(int64_t batch, int64_t tokens, int64_t heads, int64_t dk, int64_t dv,
                     int64_t blocks, Masking masking, int64_t block_size) {
  const double n = double(tokens), m = double(blocks), dkdv = double(dk) * double(dv);
  double per_head = 0;
  if (masking == Masking::block_causal) {
    // summaries 2N DkDv, lower-triangular mix M(M+1) DkDv, outputs 2N DkDv.
    per_head = 4 * n * dkdv + m * (m + 1) * dkdv;
  } else if (masking == Masking::causal) {
    // summaries 2N DkDv, strictly-lower mix M(M-1) DkDv, inter-block outputs
    // 2N DkDv, in-block masked products N C (Dk + Dv) (half of each C x C tile).
    per_head = 4 * n * dkdv + m * (m - 1) * dkdv + n * double(block_size) * double(dk + dv);
  } else {
    // summaries 2N DkDv, mix 2M^2 DkDv, outputs 2N DkDv.
    per_head = 4 * n * dkdv + 2 * m * m * dkdv;
  }
  const double fwd = double(batch) * double(heads) * per_head;
  // Backward runs each forward GEMM twice (once per input operand).
  return {fwd, 2 * fwd};
}

#define MHLA_INSTANTIATE_OPERATOR(T)                                                           \
  template void forward<T>(const Options&, TensorView<const T>, TensorView<const T>,           \
                           TensorView<const T>, TensorView<const weight_t<T>>, TensorView<T>); \
  template void forward<T>(const Options&, TensorView<const T>, TensorView<const T>,           \
                           TensorView<const T>, TensorView<const weight_t<T>>, TensorView<T>,  \
                           ForwardState<weight_t<T>>&);                                        \
  template void backward<T>(const Options&, TensorView<const T>, TensorView<const T>,          \
                            TensorView<const T>, TensorView<const weight_t<T>>,                \
                            TensorView<const T>, TensorView<const T>, TensorView<T>,           \
                            TensorView<T>, TensorView<T>, TensorView<weight_t<T>>);            \
  template void backward<T>(                                                                   \
      const Options&, TensorView<const T>, TensorView<const T>, TensorView<const T>,           \
      TensorView<const weight_t<T>>, TensorView<const T>, TensorView<const T>, TensorView<T>,  \
      TensorView<T>, TensorView<T>, TensorView<weight_t<T>>, const ForwardState<weight_t<T>>&);
MHLA_INSTANTIATE_OPERATOR(float)
MHLA_INSTANTIATE_OPERATOR(double)
MHLA_INSTANTIATE_OPERATOR(bfloat16)
MHLA_INSTANTIATE_OPERATOR(float16)
#undef MHLA_INSTANTIATE_OPERATOR

}  // namespace mhla
