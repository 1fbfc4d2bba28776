// Public MHLA entry points: validate once, then run the chunked kernel with a
// dense mixing matrix.
#include "cpu/chunked_attention.hpp"
#include "mhla/operator.hpp"

namespace mhla {

template <typename T>
void forward(const Options& options, TensorView<const T> q, TensorView<const T> k,
             TensorView<const T> v, TensorView<const T> w, TensorView<T> o) {
  const char* fn = "mhla::forward";
  const detail::Problem p = detail::validate_mhla(fn, options, q, k, v, w);
  detail::check_output(fn, "o", o, detail::v_shape(p.dims));
  const cpu::DenseMixer<T> mixer(p, w.data);
  cpu::ChunkedAttention<T>(p, mixer).forward(q.data, k.data, v.data, o.data);
}

template <typename T>
void backward(const Options& options, TensorView<const T> q, TensorView<const T> k,
              TensorView<const T> v, TensorView<const T> w, TensorView<const T> o,
              TensorView<const T> grad_o, TensorView<T> grad_q, TensorView<T> grad_k,
              TensorView<T> grad_v, TensorView<T> grad_w) {
  const char* fn = "mhla::backward";
  const detail::Problem p = detail::validate_mhla(fn, options, q, k, v, w);
  detail::check_output(fn, "o", o, detail::v_shape(p.dims));
  detail::check_gradients(fn, p.dims, grad_o, grad_q, grad_k, grad_v);
  detail::check_output(fn, "grad_w", grad_w, w.shape);
  const cpu::DenseMixer<T> mixer(p, w.data);
  cpu::ChunkedAttention<T>(p, mixer).backward(q.data, k.data, v.data, o.data, grad_o.data,
                                              grad_q.data, grad_k.data, grad_v.data, grad_w.data);
}

FlopCount mhla_flops(int64_t batch, int64_t tokens, int64_t heads, int64_t dk, int64_t dv,
                     int64_t blocks, Masking masking, int64_t block_size) {
  const double n = double(tokens), m = double(blocks), dkdv = double(dk) * double(dv);
  double per_head = 0;
  if (masking == Masking::causal) {
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

template void forward<float>(const Options&, TensorView<const float>, TensorView<const float>,
                             TensorView<const float>, TensorView<const float>, TensorView<float>);
template void forward<double>(const Options&, TensorView<const double>, TensorView<const double>,
                              TensorView<const double>, TensorView<const double>,
                              TensorView<double>);
template void backward<float>(const Options&, TensorView<const float>, TensorView<const float>,
                              TensorView<const float>, TensorView<const float>,
                              TensorView<const float>, TensorView<const float>, TensorView<float>,
                              TensorView<float>, TensorView<float>, TensorView<float>);
template void backward<double>(const Options&, TensorView<const double>, TensorView<const double>,
                               TensorView<const double>, TensorView<const double>,
                               TensorView<const double>, TensorView<const double>,
                               TensorView<double>, TensorView<double>, TensorView<double>,
                               TensorView<double>);

}  // namespace mhla
