// Differential fuzzer of the C++ API: random calls of mhla::forward and
// mhla::backward, consistent or with one flaw. Every call must end in exactly
// one of two ways: success with finite results equal to the double-precision
// block reference, or one mhla::Error. A flawed call that succeeds, a
// consistent call that is refused (other than for a non-finite result), any
// other exception, a mismatch or a non-finite result is a failure; a crash or
// a sanitizer report ends the process. Buffers are always sized from the
// shapes the call declares, so a wrongly accepted call cannot make this
// program itself read out of bounds.
//
//   mhla_api_fuzz CASES [FIRST_SEED]
#include <cstdio>
#include <cstdlib>
#include <string>

#include "mhla/reference.hpp"
#include "outcomes.hpp"
#include "random_call.hpp"

namespace mhla::fuzz {
namespace {

template <typename T>
std::vector<T> fit(const std::vector<double>& values, const std::vector<int64_t>& shape) {
  std::vector<T> out(size_t(std::max<int64_t>(element_count(shape), 0)), T(0.5));
  for (size_t i = 0; i < out.size() && i < values.size(); ++i) out[i] = T(values[i]);
  return out;
}

// max |got - want| / max(max |want|, 1); NaN counts as infinitely wrong.
template <typename T>
double relative_error(const std::vector<T>& got, const std::vector<double>& want) {
  double scale = 1, err = 0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = std::abs(double(got[i]) - want[i]);
    if (!(d <= err)) err = d;
  }
  return err / scale;
}

bool all_finite(const std::vector<double>& x) {
  for (double e : x)
    if (!std::isfinite(e)) return false;
  return true;
}

// Runs the call; returns "" if it matched the reference, else why not.
template <typename T>
std::string run(const RandomCall& c) {
  const Options& opt = c.options;
  std::vector<T> q = fit<T>(c.q, c.q_shape), k = fit<T>(c.k, c.k_shape), v = fit<T>(c.v, c.v_shape),
                 w = fit<T>(c.w, c.w_shape), g = fit<T>(c.grad_o, c.o_shape);
  std::vector<T> o(size_t(element_count(c.o_shape))), saved(size_t(element_count(c.saved_shape)));
  const TensorView<const T> qv{q.data(), c.q_shape}, kv{c.null_k ? nullptr : k.data(), c.k_shape},
      vv{v.data(), c.v_shape}, wv{w.data(), c.w_shape};
  const TensorView<T> saved_view = c.save_summaries ? TensorView<T>{saved.data(), c.saved_shape} : TensorView<T>{};
  forward<T>(opt, qv, kv, vv, wv, {o.data(), c.o_shape}, saved_view);
  std::vector<T> gq(size_t(element_count(c.grad_q_shape))), gk(k.size()), gv(v.size()), gw(w.size());
  if (c.backward)
    backward<T>(opt, qv, kv, vv, wv, {o.data(), c.o_shape}, {g.data(), c.o_shape}, {gq.data(), c.grad_q_shape},
                {gk.data(), c.k_shape}, {gv.data(), c.v_shape}, {gw.data(), c.w_shape}, saved_view);
  if (!c.flaw.empty()) return "flawed input was accepted";

  // The reference on the very values the kernel saw.
  const std::vector<double> qd(q.begin(), q.end()), kd(k.begin(), k.end()), vd(v.begin(), v.end()),
      wd(w.begin(), w.end()), gd(g.begin(), g.end());
  std::vector<double> o_ref(o.size());
  reference::block_forward(opt, {qd.data(), c.q_shape}, {kd.data(), c.k_shape}, {vd.data(), c.v_shape},
                           {wd.data(), c.w_shape}, {o_ref.data(), c.o_shape});
  const double tol = sizeof(T) == 4 ? 2e-3 : 1e-8;
  const std::vector<double> o_got(o.begin(), o.end());
  if (!all_finite(o_got)) return "non-finite o returned without an error";
  if (!all_finite(o_ref)) return "";  // the double reference itself overflowed: nothing to compare
  if (relative_error(o, o_ref) > tol) return "o differs from the reference by " + std::to_string(relative_error(o, o_ref));
  if (!c.backward) return "";
  std::vector<double> gq_ref(gq.size()), gk_ref(gk.size()), gv_ref(gv.size()), gw_ref(gw.size());
  reference::block_backward(opt, {qd.data(), c.q_shape}, {kd.data(), c.k_shape}, {vd.data(), c.v_shape},
                            {wd.data(), c.w_shape}, {gd.data(), c.o_shape}, {gq_ref.data(), c.q_shape},
                            {gk_ref.data(), c.k_shape}, {gv_ref.data(), c.v_shape}, {gw_ref.data(), c.w_shape});
  const std::pair<const char*, std::pair<const std::vector<T>*, const std::vector<double>*>> grads[] = {
      {"grad_q", {&gq, &gq_ref}}, {"grad_k", {&gk, &gk_ref}}, {"grad_v", {&gv, &gv_ref}}, {"grad_w", {&gw, &gw_ref}}};
  for (const auto& [name, pair] : grads) {
    const std::vector<double> got(pair.first->begin(), pair.first->end());
    if (!all_finite(got)) return std::string("non-finite ") + name + " returned without an error";
    if (!all_finite(*pair.second)) return "";
    const double err = relative_error(*pair.first, *pair.second);
    if (err > tol * 10) return std::string(name) + " differs from the reference by " + std::to_string(err);
  }
  return "";
}

}  // namespace
}  // namespace mhla::fuzz

int main(int argc, char** argv) {
  using namespace mhla::fuzz;
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CASES [FIRST_SEED]\n", argv[0]);
    return 2;
  }
  const long cases = std::atol(argv[1]);
  const unsigned long long first = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1;
  Outcomes outcomes("C++ API");
  for (long i = 0; i < cases; ++i) {
    const RandomCall c = make_random_call(first + uint64_t(i));
    try {
      const std::string problem = c.single_precision ? run<float>(c) : run<double>(c);
      if (problem.empty()) outcomes.success(c.flaw.empty() ? "consistent" : c.flaw);
      else outcomes.failure(c.describe() + ": " + problem);
    } catch (const mhla::Error& e) {
      outcomes.named_error(c, e.what());
    } catch (const std::exception& e) {
      outcomes.failure(c.describe() + ": unexpected exception " + e.what());
    }
  }
  return outcomes.report();
}
