// The CUDA backend against the CPU operator, case by case: forward and
// backward in float and double, bfloat16, saved arrays from outside, reports
// of non-finite results, and the refusals. Without a CUDA device every test
// that needs one skips, and the refusal of device tensors is checked instead.
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>

#include "backend/backend.hpp"
#include "cuda/bf16_state_backward.cuh"
#include "cuda/bf16_state_cases.hpp"

namespace mhla::test {
namespace {

using testing::AllOf;
using testing::HasSubstr;
using testing::ThrowsMessage;

bool have_device() { return backend::cuda_device_present(); }

#define SKIP_WITHOUT_DEVICE() \
  if (!have_device()) GTEST_SKIP() << "no CUDA device: " << backend::cuda_absence_reason()

void cuda_ok(cudaError_t status) { ASSERT_EQ(status, cudaSuccess) << cudaGetErrorString(status); }

// A device copy of a host vector, read back with host().
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<T>& host) : size_(host.size()) {
    cuda_ok(cudaMalloc(&data_, bytes()));
    cuda_ok(cudaMemcpy(data_, host.data(), bytes(), cudaMemcpyHostToDevice));
  }
  explicit DeviceArray(size_t size) : DeviceArray(std::vector<T>(size)) {}
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { cudaFree(data_); }

  std::vector<T> host() const {
    std::vector<T> out(size_);
    cuda_ok(cudaMemcpy(out.data(), data_, bytes(), cudaMemcpyDeviceToHost));
    return out;
  }
  TensorView<T> view(std::vector<int64_t> shape) { return {data_, std::move(shape), Device::cuda}; }
  TensorView<const T> cview(std::vector<int64_t> shape) const {
    return {data_, std::move(shape), Device::cuda};
  }

 private:
  size_t bytes() const { return size_ * sizeof(T); }
  T* data_ = nullptr;
  size_t size_ = 0;
};

// A case whose calls ask for a CUDA kernel family (mhla::CudaKernels).
Case with_float16_kernels(Case c) {
  c.cuda.float16_tensor_cores = true;
  return c;
}
Case with_state_kernels(Case c) {
  c.cuda.bf16_state = true;
  return c;
}

// forward then backward on the device, the results copied back.
template <typename T>
OperatorResults<T> run_on_device(const Case& c, const Inputs& in) {
  const DeviceArray<T> q(cast<T>(in.q)), k(cast<T>(in.k)), v(cast<T>(in.v)), w(cast<T>(in.w)),
      g(cast<T>(in.grad_o));
  DeviceArray<T> o(in.v.size()), gq(in.q.size()), gk(in.q.size()), gv(in.v.size()), gw(in.w.size());
  forward<T>(c.options(), q.cview(c.q_shape()), k.cview(c.q_shape()), v.cview(c.v_shape()),
             w.cview(c.w_shape()), o.view(c.v_shape()));
  backward<T>(c.options(), q.cview(c.q_shape()), k.cview(c.q_shape()), v.cview(c.v_shape()),
              w.cview(c.w_shape()), o.cview(c.v_shape()), g.cview(c.v_shape()),
              gq.view(c.q_shape()), gk.view(c.q_shape()), gv.view(c.v_shape()),
              gw.view(c.w_shape()));
  return {o.host(), gq.host(), gk.host(), gv.host(), gw.host()};
}

template <typename T>
std::vector<double> widened(const std::vector<T>& x) {
  return {x.begin(), x.end()};
}

template <typename T>
void check_against_cpu(const Case& c, double tol) {
  const Inputs in = make_inputs(c, 7);
  const OperatorResults<T> want = run_operator<T>(c, in, 1);
  const OperatorResults<T> got = run_on_device<T>(c, in);
  EXPECT_CLOSE(got.o, widened(want.o), tol, "forward");
  EXPECT_CLOSE(got.gq, widened(want.gq), tol, "grad q");
  EXPECT_CLOSE(got.gk, widened(want.gk), tol, "grad k");
  EXPECT_CLOSE(got.gv, widened(want.gv), tol, "grad v");
  EXPECT_CLOSE(got.gw, widened(want.gw), tol, "grad w");
}

class CudaOperator : public testing::TestWithParam<Case> {};

TEST_P(CudaOperator, MatchesTheCpuOperator) {
  SKIP_WITHOUT_DEVICE();
  const Case& c = GetParam();
  if (c.masking == Masking::causal) {
    const Inputs in = make_inputs(c, 7);
    EXPECT_THAT([&] { run_on_device<float>(c, in); },
                ThrowsMessage<Error>(
                    HasSubstr("the cuda backend has no float32 kernels for token-level "
                              "causal masking (Masking::causal); use Masking::block_causal")));
    return;
  }
  check_against_cpu<float>(c, 2e-4);
  check_against_cpu<double>(c, 1e-11);
}

// Switched on, float32 runs on the tensor-core kernels, token-level causal
// masking included: operands split into two bfloat16 halves keep 16 of
// float32's 24 significant bits, so the results stay within 1e-3 of the
// CPU's float32 ones (the gradients' cancelling sums set that bound).
TEST_P(CudaOperator, FloatOnTensorCoresMatchesTheCpuOperator) {
  SKIP_WITHOUT_DEVICE();
  Case c = GetParam();
  c.cuda.float32_tensor_cores = true;
  check_against_cpu<float>(c, 1e-3);
}

INSTANTIATE_TEST_SUITE_P(AllModes, CudaOperator, testing::ValuesIn(all_mode_cases()), case_name);

// bfloat16 tokens: by default the CUDA backend computes in float on widened
// copies, as the CPU does without AVX512-BF16; both round the results once.
TEST(CudaBackend, Bfloat16MatchesTheCpuOperator) {
  SKIP_WITHOUT_DEVICE();
  Case c{"2d-ragged", 2, 2, 6, 5, TokenLayout::grid2d(7, 5, 3, 2)};
  const Inputs in = make_inputs(c, 3);
  const auto q = rounded_to_bfloat16(in.q), k = rounded_to_bfloat16(in.k),
             v = rounded_to_bfloat16(in.v), g = rounded_to_bfloat16(in.grad_o);
  const std::vector<float> w(in.w.begin(), in.w.end());
  std::vector<bfloat16> o(v.size());
  forward(c.options(), view(q, c.q_shape()), view(k, c.q_shape()), view(v, c.v_shape()),
          view(w, c.w_shape()), view(o, c.v_shape()));

  const DeviceArray<bfloat16> dq(q), dk(k), dv(v), dg(g);
  const DeviceArray<float> dw(w);
  DeviceArray<bfloat16> dout(v.size()), dgq(q.size()), dgk(k.size()), dgv(v.size());
  DeviceArray<float> dgw(w.size());
  forward(c.options(), dq.cview(c.q_shape()), dk.cview(c.q_shape()), dv.cview(c.v_shape()),
          dw.cview(c.w_shape()), dout.view(c.v_shape()));
  // One bfloat16 rounding of each result apart at most (2^-8 relative).
  EXPECT_CLOSE(bfloat16_values(dout.host()), bfloat16_values(o), 1e-2, "bfloat16 forward");

  std::vector<bfloat16> gq(q.size()), gk(k.size()), gv(v.size());
  std::vector<float> gw(w.size());
  backward<bfloat16>(c.options(), view(q, c.q_shape()), view(k, c.q_shape()), view(v, c.v_shape()),
                     view(w, c.w_shape()), view(o, c.v_shape()), view(g, c.v_shape()),
                     view(gq, c.q_shape()), view(gk, c.q_shape()), view(gv, c.v_shape()),
                     view(gw, c.w_shape()));
  backward(c.options(), dq.cview(c.q_shape()), dk.cview(c.q_shape()), dv.cview(c.v_shape()),
           dw.cview(c.w_shape()), dout.cview(c.v_shape()), dg.cview(c.v_shape()),
           dgq.view(c.q_shape()), dgk.view(c.q_shape()), dgv.view(c.v_shape()),
           dgw.view(c.w_shape()));
  EXPECT_CLOSE(bfloat16_values(dgq.host()), bfloat16_values(gq), 1e-2, "bfloat16 grad q");
  EXPECT_CLOSE(bfloat16_values(dgk.host()), bfloat16_values(gk), 1e-2, "bfloat16 grad k");
  EXPECT_CLOSE(bfloat16_values(dgv.host()), bfloat16_values(gv), 1e-2, "bfloat16 grad v");
  // grad w is float, so it is held to float64 on the same bfloat16 inputs
  // rather than to the CPU, whose AVX512-BF16 products (where the CPU has
  // them) round each product to bfloat16.
  std::vector<double> gq64(q.size()), gk64(k.size()), gv64(v.size()), gw64(w.size());
  const std::vector<double> q64 = bfloat16_values(q), k64 = bfloat16_values(k),
                            v64 = bfloat16_values(v), o64 = bfloat16_values(dout.host()),
                            g64 = bfloat16_values(g), w64 = widened(w);
  backward(c.options(), view(q64, c.q_shape()), view(k64, c.q_shape()), view(v64, c.v_shape()),
           view(w64, c.w_shape()), view(o64, c.v_shape()), view(g64, c.v_shape()),
           view(gq64, c.q_shape()), view(gk64, c.q_shape()), view(gv64, c.v_shape()),
           view(gw64, c.w_shape()));
  EXPECT_CLOSE(dgw.host(), gw64, 2e-4, "bfloat16 grad w");
}

// The bfloat16 forward's tensor-core kernels against float64 on the same
// bfloat16 inputs, in every mode they take, on the catalogue and on shapes
// that span several tiles (Dk and Dv over 64, blocks over 64 tokens). Every
// result array is poisoned (NaN) first, so an element left unwritten fails.
std::vector<Case> bf16_cases() {
  std::vector<Case> cases = shape_cases();
  cases.push_back({"1d-wide-long-blocks", 1, 2, 130, 70, TokenLayout::sequence(300, 100)});
  // Three chunks of 64 tokens in a block and a ragged last block: the causal
  // kernels' loops over earlier and later chunks of the same block.
  cases.push_back({"1d-ragged-three-chunk-blocks", 2, 1, 20, 12, TokenLayout::sequence(400, 150)});
  cases.push_back({"3d-ragged-wide", 2, 1, 72, 65, TokenLayout::grid3d(3, 9, 10, 2, 4, 6)});
  return with_all_modes(cases);
}

// The forward on tokens of type H; o within `o_tolerance` (its one rounding).
template <typename H>
void check_split_forward(const Case& c, double o_tolerance) {
  const Inputs in = make_inputs(c, 13);
  const auto q = rounded_to<H>(in.q), k = rounded_to<H>(in.k), v = rounded_to<H>(in.v);
  const std::vector<float> w(in.w.begin(), in.w.end());
  const std::vector<int64_t> s_shape = saved_summaries_shape(c.options(), c.q_shape(), c.v_shape());
  const size_t n = size_t(numel(s_shape));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const DeviceArray<H> dq(q), dk(k), dv(v);
  const DeviceArray<float> dw(w);
  DeviceArray<H> o(rounded_to<H>(std::vector<double>(v.size(), nan)));
  DeviceArray<float> s(std::vector<float>(n, nan)), m(std::vector<float>(n, nan));
  auto state = ForwardState<float>::over(s.view(s_shape), m.view(s_shape));
  forward<H>(c.options(), dq.cview(c.q_shape()), dk.cview(c.q_shape()), dv.cview(c.v_shape()),
             dw.cview(c.w_shape()), o.view(c.v_shape()), state);

  const std::vector<double> q64 = values_of(q), k64 = values_of(k), v64 = values_of(v),
                            w64 = widened(w);
  std::vector<double> o64(v.size()), s64(n), m64(n);
  auto state64 = ForwardState<double>::over(view(s64, s_shape), view(m64, s_shape));
  forward<double>(c.options(), view(q64, c.q_shape()), view(k64, c.q_shape()),
                  view(v64, c.v_shape()), view(w64, c.w_shape()), view(o64, c.v_shape()), state64);
  // Split bfloat16 operands keep the sums near float32: the summaries and the
  // mix far inside 1e-4, o within its one rounding.
  EXPECT_CLOSE(s.host(), s64, 1e-4, "summaries");
  EXPECT_CLOSE(m.host(), m64, 1e-4, "mixed summaries");
  EXPECT_CLOSE(values_of(o.host()), o64, o_tolerance, "o");
}

class CudaBf16Forward : public testing::TestWithParam<Case> {};

TEST_P(CudaBf16Forward, MatchesFloat64OnTheSameInputs) {
  SKIP_WITHOUT_DEVICE();
  check_split_forward<bfloat16>(GetParam(), 4e-3);  // bfloat16's half step: 2^-9
}

INSTANTIATE_TEST_SUITE_P(AllModes, CudaBf16Forward, testing::ValuesIn(bf16_cases()), case_name);

// The float64 operator's four gradients at these inputs (its own forward's o).
struct Float64Gradients {
  std::vector<double> q, k, v, w;
};
Float64Gradients float64_gradients(const Case& c, const std::vector<double>& q,
                                   const std::vector<double>& k, const std::vector<double>& v,
                                   const std::vector<double>& w, const std::vector<double>& g) {
  std::vector<double> o(v.size());
  Float64Gradients r{std::vector<double>(q.size()), std::vector<double>(k.size()),
                     std::vector<double>(v.size()), std::vector<double>(w.size())};
  forward<double>(c.options(), view(q, c.q_shape()), view(k, c.q_shape()), view(v, c.v_shape()),
                  view(w, c.w_shape()), view(o, c.v_shape()));
  backward<double>(c.options(), view(q, c.q_shape()), view(k, c.q_shape()), view(v, c.v_shape()),
                   view(w, c.w_shape()), view(std::as_const(o), c.v_shape()), view(g, c.v_shape()),
                   view(r.q, c.q_shape()), view(r.k, c.q_shape()), view(r.v, c.v_shape()),
                   view(r.w, c.w_shape()));
  return r;
}

// The bfloat16 backward's tensor-core kernels against float64 on the same
// bfloat16 inputs, with the forward's state and without it (the kernels
// recompute the summaries), gradients poisoned first; a second call must give
// the same bits (the weight gradient is summed in a fixed order).
template <typename H>
void check_split_backward(const Case& c) {
  const Inputs in = make_inputs(c, 17);
  const auto q = rounded_to<H>(in.q), k = rounded_to<H>(in.k), v = rounded_to<H>(in.v),
             g = rounded_to<H>(in.grad_o);
  const std::vector<float> w(in.w.begin(), in.w.end());
  const std::vector<int64_t> s_shape = saved_summaries_shape(c.options(), c.q_shape(), c.v_shape());
  const size_t n = size_t(numel(s_shape));
  const DeviceArray<H> dq(q), dk(k), dv(v), dg(g);
  const DeviceArray<float> dw(w);
  DeviceArray<H> o(v.size());
  DeviceArray<float> s(n), m(n);
  auto state = ForwardState<float>::over(s.view(s_shape), m.view(s_shape));
  forward<H>(c.options(), dq.cview(c.q_shape()), dk.cview(c.q_shape()), dv.cview(c.v_shape()),
             dw.cview(c.w_shape()), o.view(c.v_shape()), state);

  const std::vector<double> q64 = values_of(q), k64 = values_of(k), v64 = values_of(v),
                            g64 = values_of(g), w64 = widened(w);
  const auto [gq64, gk64, gv64, gw64] = float64_gradients(c, q64, k64, v64, w64, g64);

  const auto poisoned = [](size_t n) {
    return DeviceArray<H>(rounded_to<H>(std::vector<double>(n, std::nan(""))));
  };
  struct Gradients {
    std::vector<H> q, k, v;
    std::vector<float> w;
  };
  const auto run = [&](bool saved) {
    DeviceArray<H> gq = poisoned(q.size()), gk = poisoned(k.size()), gv = poisoned(v.size());
    DeviceArray<float> gw(std::vector<float>(w.size(), std::numeric_limits<float>::quiet_NaN()));
    if (saved)
      backward<H>(c.options(), dq.cview(c.q_shape()), dk.cview(c.q_shape()), dv.cview(c.v_shape()),
                  dw.cview(c.w_shape()), o.cview(c.v_shape()), dg.cview(c.v_shape()),
                  gq.view(c.q_shape()), gk.view(c.q_shape()), gv.view(c.v_shape()),
                  gw.view(c.w_shape()), state);
    else
      backward<H>(c.options(), dq.cview(c.q_shape()), dk.cview(c.q_shape()), dv.cview(c.v_shape()),
                  dw.cview(c.w_shape()), o.cview(c.v_shape()), dg.cview(c.v_shape()),
                  gq.view(c.q_shape()), gk.view(c.q_shape()), gv.view(c.v_shape()),
                  gw.view(c.w_shape()));
    return Gradients{gq.host(), gk.host(), gv.host(), gw.host()};
  };
  for (const bool saved : {true, false}) {
    const std::string how = saved ? " (forward state)" : " (recomputed)";
    const Gradients got = run(saved);
    // Each gradient is rounded once (bfloat16: 2^-9 relative) after sums
    // near float32; grad w stays float.
    EXPECT_CLOSE(values_of(got.q), gq64, 1e-2, "grad q" + how);
    EXPECT_CLOSE(values_of(got.k), gk64, 1e-2, "grad k" + how);
    EXPECT_CLOSE(values_of(got.v), gv64, 1e-2, "grad v" + how);
    EXPECT_CLOSE(got.w, gw64, 1e-3, "grad w" + how);
    if (!saved) continue;
    const Gradients again = run(saved);
    const auto same_bits = [](const auto& a, const auto& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
    };
    EXPECT_TRUE(same_bits(again.q, got.q) && same_bits(again.k, got.k) &&
                same_bits(again.v, got.v) && same_bits(again.w, got.w))
        << "a second call gave other bits";
  }
}

class CudaBf16Backward : public CudaBf16Forward {};

TEST_P(CudaBf16Backward, MatchesFloat64OnTheSameInputs) {
  SKIP_WITHOUT_DEVICE();
  check_split_backward<bfloat16>(GetParam());
}

INSTANTIATE_TEST_SUITE_P(AllModes, CudaBf16Backward, testing::ValuesIn(bf16_cases()), case_name);

// float16 tokens on the same tensor-core kernels (each float16 splits into
// two bfloat16 halves exactly): o within its one rounding to float16 (2^-12);
// and, switched off, on the float kernels over widened copies.
class CudaFloat16 : public CudaBf16Forward {};

TEST_P(CudaFloat16, ForwardMatchesFloat64OnTheSameInputs) {
  SKIP_WITHOUT_DEVICE();
  check_split_forward<float16>(GetParam(), 1e-3);  // the float kernels, on widened copies
  check_split_forward<float16>(with_float16_kernels(GetParam()), 1e-3);
}

TEST_P(CudaFloat16, BackwardMatchesFloat64OnTheSameInputs) {
  SKIP_WITHOUT_DEVICE();
  check_split_backward<float16>(GetParam());
  check_split_backward<float16>(with_float16_kernels(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(AllModes, CudaFloat16, testing::ValuesIn(bf16_cases()), case_name);

// An o finite in float32 but beyond float16's range is named, not returned
// as infinity: the kernels flag the rounded value, and the float path names it.
TEST(CudaBackend, Float16OverflowIsANamedError) {
  SKIP_WITHOUT_DEVICE();
  Case c{"range", 1, 2, 8, 8, TokenLayout::sequence(48, 4)};
  c.normalize = false;
  Options options = c.options();
  options.scale = 1e5;
  const Inputs in = make_inputs(c, 6);
  const DeviceArray<float16> q(rounded_to_float16(in.q)), k(rounded_to_float16(in.k)),
      v(rounded_to_float16(in.v));
  const DeviceArray<float> w(std::vector<float>(in.w.begin(), in.w.end()));
  DeviceArray<float16> o(in.v.size());
  const auto call = [&] {
    forward(options, q.cview(c.q_shape()), k.cview(c.q_shape()), v.cview(c.v_shape()),
            w.cview(c.w_shape()), o.view(c.v_shape()));
  };
  // The float path names the float32 value, the kernels' report the infinity
  // they wrote, as the plain-torch path does.
  EXPECT_THAT(call,
              ThrowsMessage<Error>(HasSubstr("beyond float16's range (largest finite 65504)")))
      << "on the float kernels over widened copies";
  options.cuda.float16_tensor_cores = true;
  EXPECT_THAT(call, ThrowsMessage<Error>(AllOf(HasSubstr("= inf is not finite although every input "
                                                         "is finite"),
                                               HasSubstr("exceeds the float16 range"))))
      << "on the tensor-core kernels";
}

// The bfloat16-state forward (options.cuda.bf16_state; a forward that saves
// no arrays) against float64 on the same bfloat16 inputs, o poisoned first,
// the same bits from a second call; the tiling emulation holds its tiles to
// the same bound without a GPU (test_bf16_state_tiling.cpp).

// The forward on tokens of type H, checked as above.
template <typename H>
void check_state_forward(const Case& asked) {
  const Case c = with_state_kernels(asked);
  const Inputs in = make_inputs(c, 29);
  const auto q = rounded_to<H>(in.q), k = rounded_to<H>(in.k), v = rounded_to<H>(in.v);
  const std::vector<float> w(in.w.begin(), in.w.end());
  const DeviceArray<H> dq(q), dk(k), dv(v);
  const DeviceArray<float> dw(w);
  DeviceArray<H> o(rounded_to<H>(std::vector<double>(v.size(), std::nan("")))), again(v.size());
  const auto run = [&](DeviceArray<H>& out) {
    forward(c.options(), dq.cview(c.q_shape()), dk.cview(c.q_shape()), dv.cview(c.v_shape()),
            dw.cview(c.w_shape()), out.view(c.v_shape()));
  };
  run(o);
  run(again);
  const std::vector<double> q64 = values_of(q), k64 = values_of(k), v64 = values_of(v),
                            w64 = widened(w);
  std::vector<double> o64(v.size());
  forward<double>(c.options(), view(q64, c.q_shape()), view(k64, c.q_shape()),
                  view(v64, c.v_shape()), view(w64, c.w_shape()), view(o64, c.v_shape()));
  EXPECT_CLOSE(values_of(o.host()), o64, 1e-2, "o");
  const std::vector<H> first = o.host(), second = again.host();
  EXPECT_EQ(0, std::memcmp(first.data(), second.data(), first.size() * sizeof(H)))
      << "a second call gave other bits";
}

class CudaBf16StateForward : public testing::TestWithParam<Case> {};

TEST_P(CudaBf16StateForward, MatchesFloat64OnTheSameInputs) {
  SKIP_WITHOUT_DEVICE();
  check_state_forward<bfloat16>(GetParam());
}

INSTANTIATE_TEST_SUITE_P(AllModes, CudaBf16StateForward, testing::ValuesIn(bf16_state_cases()),
                         case_name);

// float16 tokens on the same kernels (rounded to bfloat16 as they are staged).
class CudaFloat16StateForward : public testing::TestWithParam<Case> {};

TEST_P(CudaFloat16StateForward, MatchesFloat64OnTheSameInputs) {
  SKIP_WITHOUT_DEVICE();
  check_state_forward<float16>(with_float16_kernels(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(AllModes, CudaFloat16StateForward,
                         testing::ValuesIn(float16_state_cases()), case_name);

// The bfloat16-state backward (options.cuda.bf16_state, no saved arrays) on
// tokens of type H against float64 on the same inputs, at the tolerances its
// tiling emulation meets (bf16_state_cases.hpp), and the same bits from a
// second call.
template <typename H>
void check_state_backward(const Case& asked, double weight_tolerance) {
  const Case c = with_state_kernels(asked);
  const Inputs in = make_inputs(c, 31);
  const auto q = rounded_to<H>(in.q), k = rounded_to<H>(in.k), v = rounded_to<H>(in.v),
             g = rounded_to<H>(in.grad_o);
  const std::vector<float> w(in.w.begin(), in.w.end());
  const DeviceArray<H> dq(q), dk(k), dv(v), dg(g);
  const DeviceArray<float> dw(w);
  DeviceArray<H> o(v.size());
  forward(c.options(), dq.cview(c.q_shape()), dk.cview(c.q_shape()), dv.cview(c.v_shape()),
          dw.cview(c.w_shape()), o.view(c.v_shape()));
  struct Gradients {
    std::vector<H> q, k, v;
    std::vector<float> w;
  };
  const auto poisoned = [](size_t n) {
    return DeviceArray<H>(rounded_to<H>(std::vector<double>(n, std::nan(""))));
  };
  const auto run = [&] {
    DeviceArray<H> gq = poisoned(q.size()), gk = poisoned(k.size()), gv = poisoned(v.size());
    DeviceArray<float> gw(std::vector<float>(w.size(), std::numeric_limits<float>::quiet_NaN()));
    backward(c.options(), dq.cview(c.q_shape()), dk.cview(c.q_shape()), dv.cview(c.v_shape()),
             dw.cview(c.w_shape()), o.cview(c.v_shape()), dg.cview(c.v_shape()),
             gq.view(c.q_shape()), gk.view(c.q_shape()), gv.view(c.v_shape()),
             gw.view(c.w_shape()));
    return Gradients{gq.host(), gk.host(), gv.host(), gw.host()};
  };
  const Gradients got = run(), again = run();

  const std::vector<double> q64 = values_of(q), k64 = values_of(k), v64 = values_of(v),
                            g64 = values_of(g), w64 = widened(w);
  const auto [gq64, gk64, gv64, gw64] = float64_gradients(c, q64, k64, v64, w64, g64);
  EXPECT_CLOSE(values_of(got.q), gq64, kStateGradientTolerance, "grad q");
  EXPECT_CLOSE(values_of(got.k), gk64, kStateGradientTolerance, "grad k");
  EXPECT_CLOSE(values_of(got.v), gv64, kStateGradientTolerance, "grad v");
  EXPECT_CLOSE(got.w, gw64, weight_tolerance, "grad w");
  const auto same_bits = [](const auto& a, const auto& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
  };
  EXPECT_TRUE(same_bits(again.q, got.q) && same_bits(again.k, got.k) && same_bits(again.v, got.v) &&
              same_bits(again.w, got.w))
      << "a second call gave other bits";
}

class CudaBf16StateBackward : public testing::TestWithParam<Case> {};

TEST_P(CudaBf16StateBackward, MatchesFloat64OnTheSameInputs) {
  SKIP_WITHOUT_DEVICE();
  check_state_backward<bfloat16>(GetParam(), kStateWeightGradientTolerance);
}

INSTANTIATE_TEST_SUITE_P(AllModes, CudaBf16StateBackward, testing::ValuesIn(bf16_state_cases()),
                         case_name);

class CudaFloat16StateBackward : public testing::TestWithParam<Case> {};

TEST_P(CudaFloat16StateBackward, MatchesFloat64OnTheSameInputs) {
  SKIP_WITHOUT_DEVICE();
  check_state_backward<float16>(with_float16_kernels(GetParam()),
                                kFloat16StateWeightGradientTolerance);
}

INSTANTIATE_TEST_SUITE_P(AllModes, CudaFloat16StateBackward,
                         testing::ValuesIn(float16_state_cases()), case_name);

// The causal backward at Dv > 64 takes more shared memory a CTA than the
// about 99 KB of sm_86, sm_89 and sm_120: the plan knows each problem's bytes
// before any launch (bf16_state_backward_fits holds them to the device's
// opt-in limit, and the split-operand kernels run where they do not fit).
// No device needed.
TEST(CudaPlan, TheStateBackwardsSharedMemoryIsKnownBeforeALaunch) {
  cuda::KernelProblem p;
  p.dv = 128;
  p.causal = true;
  const int64_t wide_causal = cuda::bf16_state_backward_shared_bytes(p);
  EXPECT_GT(wide_causal, 99 * 1024);
  EXPECT_LE(wide_causal, 163 * 1024);  // sm_80's limit
  p.causal = false;
  EXPECT_LT(cuda::bf16_state_backward_shared_bytes(p), wide_causal);
  EXPECT_LE(cuda::bf16_state_backward_shared_bytes(p), 113 * 1024);
  p.dv = 64;
  EXPECT_LE(cuda::bf16_state_backward_shared_bytes(p), 113 * 1024);
}

// An overflow on the bfloat16-state kernels is reported as on the others.
TEST(CudaBackend, Bf16StateOverflowIsReported) {
  SKIP_WITHOUT_DEVICE();
  Case c{"1d", 1, 1, 8, 8, TokenLayout::sequence(32, 8)};
  c.cuda.bf16_state = true;
  c.phi = FeatureMap::identity;
  c.normalize = false;
  const std::vector<bfloat16> big(size_t(numel(c.q_shape())), to_bfloat16(3e38f));
  const std::vector<float> w(size_t(numel(c.w_shape())), 1.0f);
  const DeviceArray<bfloat16> x(big);
  const DeviceArray<float> dw(w);
  DeviceArray<bfloat16> o(big.size());
  EXPECT_THAT(
      [&] {
        forward(c.options(), x.cview(c.q_shape()), x.cview(c.q_shape()), x.cview(c.v_shape()),
                dw.cview(c.w_shape()), o.view(c.v_shape()));
      },
      ThrowsMessage<Error>(HasSubstr("is not finite although every input is finite")));
}

// A ForwardState keeps its arrays in device memory: backward reads them, and
// refuses a state whose record names other keys.
TEST(CudaBackend, AForwardStateKeepsItsArraysOnTheDevice) {
  SKIP_WITHOUT_DEVICE();
  Case c{"1d-ragged", 2, 3, 5, 7, TokenLayout::sequence(37, 8)};
  const Inputs in = make_inputs(c, 11);
  const auto f = [](const std::vector<double>& x) {
    return std::vector<float>(x.begin(), x.end());
  };
  const DeviceArray<float> q(f(in.q)), k(f(in.k)), v(f(in.v)), w(f(in.w)), g(f(in.grad_o));
  DeviceArray<float> o(in.v.size());
  DeviceArray<float> gq(in.q.size()), gk(in.q.size()), gv(in.v.size()), gw(in.w.size());
  ForwardState<float> state;
  forward<float>(c.options(), q.cview(c.q_shape()), k.cview(c.q_shape()), v.cview(c.v_shape()),
                 w.cview(c.w_shape()), o.view(c.v_shape()), state);
  const auto run_backward = [&](const DeviceArray<float>& keys) {
    backward<float>(c.options(), q.cview(c.q_shape()), keys.cview(c.q_shape()),
                    v.cview(c.v_shape()), w.cview(c.w_shape()), o.cview(c.v_shape()),
                    g.cview(c.v_shape()), gq.view(c.q_shape()), gk.view(c.q_shape()),
                    gv.view(c.v_shape()), gw.view(c.w_shape()), state);
  };
  run_backward(k);
  const OperatorResults<float> want = run_operator<float>(c, in, 1);
  EXPECT_CLOSE(gk.host(), widened(want.gk), 2e-4, "grad k from the state");
  std::vector<double> other_keys = in.k;
  for (double& x : other_keys) x += 0.5;
  const DeviceArray<float> stale(f(other_keys));
  EXPECT_THAT([&] { run_backward(stale); },
              ThrowsMessage<Error>(HasSubstr("k is not the tensor that the forward()")));
}

// A float call whose results overflow although every input is finite.
struct OverflowCall {
  Case c{"1d-ragged", 1, 1, 4, 4, TokenLayout::sequence(16, 4)};
  Inputs in;
  OverflowCall() {
    c.phi = FeatureMap::identity;
    c.normalize = false;
    in = make_inputs(c, 5);
    for (double& x : in.k) x = 3e38;
    for (double& x : in.v) x = 3e38;
  }
  void run() const { run_on_device<float>(c, in); }
};

// The overflow is reported, from host copies of the device tensors, with the
// mode's causes.
TEST(CudaBackend, NonFiniteOutputsAreReported) {
  SKIP_WITHOUT_DEVICE();
  const OverflowCall call;
  EXPECT_THAT([&] { call.run(); },
              ThrowsMessage<Error>(HasSubstr("is not finite although every input is finite")));
}

// DeviceChecks::deferred and streams (mhla/device_execution.hpp): the
// setting for one test, restored after it.
class Execution {
 public:
  explicit Execution(DeviceExecution e) : before_(device_execution()) { set_device_execution(e); }
  ~Execution() { set_device_execution(before_); }

 private:
  DeviceExecution before_;
};

// A non-blocking stream of the test's own.
class OwnStream {
 public:
  OwnStream() {
    if (cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) != cudaSuccess)
      ADD_FAILURE() << "cudaStreamCreateWithFlags";
  }
  OwnStream(const OwnStream&) = delete;
  OwnStream& operator=(const OwnStream&) = delete;
  ~OwnStream() { cudaStreamDestroy(stream_); }
  cudaStream_t get() const { return stream_; }
  void wait() const { cuda_ok(cudaStreamSynchronize(stream_)); }

 private:
  cudaStream_t stream_ = nullptr;
};

// A small bfloat16 call on the device, its tensors kept for reruns.
struct Bf16Call {
  Case c{"1d", 1, 2, 16, 16, TokenLayout::sequence(96, 16)};
  Inputs in = make_inputs(c, 41);
  DeviceArray<bfloat16> q{rounded_to_bfloat16(in.q)}, k{rounded_to_bfloat16(in.k)},
      v{rounded_to_bfloat16(in.v)}, g{rounded_to_bfloat16(in.grad_o)};
  DeviceArray<float> w{std::vector<float>(in.w.begin(), in.w.end())};
  DeviceArray<bfloat16> o{in.v.size()}, gq{in.q.size()}, gk{in.q.size()}, gv{in.v.size()};
  DeviceArray<float> gw{in.w.size()};

  void forward_backward() {
    forward(c.options(), q.cview(c.q_shape()), k.cview(c.q_shape()), v.cview(c.v_shape()),
            w.cview(c.w_shape()), o.view(c.v_shape()));
    backward(c.options(), q.cview(c.q_shape()), k.cview(c.q_shape()), v.cview(c.v_shape()),
             w.cview(c.w_shape()), o.cview(c.v_shape()), g.cview(c.v_shape()), gq.view(c.q_shape()),
             gk.view(c.q_shape()), gv.view(c.v_shape()), gw.view(c.w_shape()));
  }
  std::vector<std::vector<float>> results() const {
    const auto f = [](const std::vector<bfloat16>& x) {
      std::vector<float> out;
      for (bfloat16 e : x) out.push_back(to_float(e));
      return out;
    };
    return {f(o.host()), f(gq.host()), f(gk.host()), f(gv.host()), gw.host()};
  }
};

TEST(CudaDeviceExecution, DeferredOverflowIsReportedByTheNextCheck) {
  SKIP_WITHOUT_DEVICE();
  const Execution deferred({nullptr, DeviceChecks::deferred});
  OverflowCall().run();  // returns: nothing waits
  EXPECT_THAT([] { check_device_results(); },
              ThrowsMessage<Error>(HasSubstr("a result of an earlier call on CUDA is not finite "
                                             "although every input is finite")));
  check_device_results();  // reported once
}

TEST(CudaDeviceExecution, DeferredNonFiniteInputsPropagateWithoutAnError) {
  SKIP_WITHOUT_DEVICE();
  const Execution deferred({nullptr, DeviceChecks::deferred});
  Case c{"1d-ragged", 1, 1, 4, 4, TokenLayout::sequence(16, 4)};
  Inputs in = make_inputs(c, 5);
  in.q[3] = std::numeric_limits<double>::quiet_NaN();
  run_on_device<float>(c, in);
  check_device_results();
}

// A refused weight keeps the operator's exact words, read back later.
TEST(CudaDeviceExecution, DeferredWeightErrorHasTheSyncMessage) {
  SKIP_WITHOUT_DEVICE();
  Bf16Call call;
  std::vector<float> bad(call.in.w.begin(), call.in.w.end());
  bad[size_t(1 * call.c.blocks() + 0)] = -0.25f;
  const DeviceArray<float> w(bad);
  const auto run = [&] {
    forward(call.c.options(), call.q.cview(call.c.q_shape()), call.k.cview(call.c.q_shape()),
            call.v.cview(call.c.v_shape()), w.cview(call.c.w_shape()),
            call.o.view(call.c.v_shape()));
  };
  std::string sync_message;
  try {
    run();
  } catch (const Error& e) {
    sync_message = e.what();
  }
  ASSERT_THAT(sync_message, HasSubstr("w[1, 0] = -0.250000 is negative"));
  const Execution deferred({nullptr, DeviceChecks::deferred});
  run();
  EXPECT_THAT([] { check_device_results(); }, ThrowsMessage<Error>(testing::StrEq(sync_message)));
}

// Both bfloat16 kernel families: the split-operand kernels and the
// bfloat16-state kernels (options.cuda.bf16_state), which Bf16Call's shape fits.
class CudaDeviceExecutionOfKernels : public testing::TestWithParam<bool> {};

TEST_P(CudaDeviceExecutionOfKernels, RunsOnTheGivenStreamWithTheSameBits) {
  SKIP_WITHOUT_DEVICE();
  Bf16Call call;
  call.c.cuda.bf16_state = GetParam();
  call.forward_backward();
  const auto want = call.results();
  const OwnStream stream;
  const Execution on_stream({stream.get(), DeviceChecks::deferred});
  call.forward_backward();
  stream.wait();
  check_device_results();
  EXPECT_EQ(call.results(), want);
}

// Forward and backward captured into a CUDA graph (after one eager call,
// which sizes the scratch) replay to the eager results on new inputs.
TEST_P(CudaDeviceExecutionOfKernels, CapturedGraphReplaysTheEagerResults) {
  SKIP_WITHOUT_DEVICE();
  Bf16Call call;
  call.c.cuda.bf16_state = GetParam();
  const OwnStream stream;
  const Execution on_stream({stream.get(), DeviceChecks::deferred});
  call.forward_backward();
  stream.wait();
  cudaGraph_t graph = nullptr;
  cuda_ok(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeGlobal));
  call.forward_backward();
  cuda_ok(cudaStreamEndCapture(stream.get(), &graph));
  cudaGraphExec_t exec = nullptr;
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0));

  std::vector<double> other = call.in.q;
  for (double& x : other) x = -x;
  const std::vector<bfloat16> q2 = rounded_to_bfloat16(other);
  cuda_ok(cudaMemcpy(call.q.view({}).data, q2.data(), q2.size() * sizeof(bfloat16),
                     cudaMemcpyHostToDevice));
  cuda_ok(cudaGraphLaunch(exec, stream.get()));
  stream.wait();
  const auto replayed = call.results();
  call.forward_backward();
  stream.wait();
  check_device_results();
  EXPECT_EQ(replayed, call.results());
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

INSTANTIATE_TEST_SUITE_P(Bf16Kernels, CudaDeviceExecutionOfKernels, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& info) {
                           return info.param ? "state_kernels" : "split_operand_kernels";
                         });

TEST(CudaDeviceExecution, SyncChecksRefuseACaptureByName) {
  SKIP_WITHOUT_DEVICE();
  Bf16Call call;
  const OwnStream stream;
  const Execution on_stream({stream.get(), DeviceChecks::sync});
  cuda_ok(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeGlobal));
  EXPECT_THAT([&] { call.forward_backward(); },
              ThrowsMessage<Error>(HasSubstr("set DeviceChecks::deferred")));
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(stream.get(), &graph);
  if (graph != nullptr) cudaGraphDestroy(graph);
}

// Every tensor of a call on one device.
TEST(CudaBackend, MixedDevicesAreRefusedByName) {
  SKIP_WITHOUT_DEVICE();
  Case c{"1d-ragged", 1, 1, 4, 4, TokenLayout::sequence(16, 4)};
  const Inputs in = make_inputs(c, 5);
  const auto f = [](const std::vector<double>& x) {
    return std::vector<float>(x.begin(), x.end());
  };
  const DeviceArray<float> q(f(in.q)), v(f(in.v)), w(f(in.w));
  const std::vector<float> k = f(in.k);
  DeviceArray<float> o(in.v.size());
  EXPECT_THAT(
      [&] {
        forward<float>(c.options(), q.cview(c.q_shape()), view(k, c.q_shape()),
                       v.cview(c.v_shape()), w.cview(c.w_shape()), o.view(c.v_shape()));
      },
      ThrowsMessage<Error>(HasSubstr(
          "mhla::forward: k is on the cpu device but q is on the cuda device; pass every tensor "
          "of the call on one device")));
}

// Without a device, tensors marked as CUDA memory are refused by name before
// anything reads them.
TEST(CudaBackend, WithoutADeviceCudaTensorsAreRefusedByName) {
  if (have_device()) GTEST_SKIP() << "a CUDA device is present";
  Case c{"1d-ragged", 1, 1, 4, 4, TokenLayout::sequence(16, 4)};
  std::vector<float> q(64), w(16), o(64);
  const auto on_cuda = [](auto& x, std::vector<int64_t> shape) {
    return TensorView<std::remove_reference_t<decltype(x[0])>>{x.data(), std::move(shape),
                                                               Device::cuda};
  };
  EXPECT_THAT(
      [&] {
        forward<float>(c.options(), on_cuda(q, c.q_shape()), on_cuda(q, c.q_shape()),
                       on_cuda(q, c.v_shape()), on_cuda(w, c.w_shape()), on_cuda(o, c.v_shape()));
      },
      ThrowsMessage<Error>(HasSubstr("mhla::forward: q is on the cuda device, but no CUDA device "
                                     "is visible to this process")));
}

}  // namespace
}  // namespace mhla::test
