// Differential fuzzer of the C++ API: random calls of mhla::forward and
// mhla::backward, consistent or with one flaw, some with k, v or w changed
// between forward and backward while a ForwardState was kept. Every call
// must end in exactly one of two ways: success with finite results equal to
// the double-precision block reference (for a stale call, the gradients at
// backward's own inputs), or one mhla::Error. A flawed call that succeeds, a
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

// Runs the call; returns "" if it matched the reference, else why not.
template <typename T>
std::string run(const RandomCall& c) {
  const Options& opt = c.options;
  std::vector<T> q = fit<T>(c.q, c.q_shape), k = fit<T>(c.k, c.k_shape), v = fit<T>(c.v, c.v_shape),
                 w = fit<T>(c.w, c.w_shape), g = fit<T>(c.grad_o, c.o_shape);
  std::vector<T> o(size_t(element_count(c.o_shape)));
  const TensorView<const T> qv{q.data(), c.q_shape}, kv{c.null_k ? nullptr : k.data(), c.k_shape},
      vv{v.data(), c.v_shape}, wv{w.data(), c.w_shape};
  ForwardState<T> state;
  if (c.keep_state)
    forward<T>(opt, qv, kv, vv, wv, {o.data(), c.o_shape}, state);
  else
    forward<T>(opt, qv, kv, vv, wv, {o.data(), c.o_shape});
  std::vector<T> gq(size_t(element_count(c.grad_q_shape))), gk(k.size()), gv(v.size()),
      gw(size_t(element_count(c.grad_w_shape)));
  // Backward's own k, v and w: forward's, or changed since in buffers of
  // their own (a stale call).
  const std::vector<T> bk = fit<T>(c.backward_k, c.k_shape), bv = fit<T>(c.backward_v, c.v_shape),
                       bw = fit<T>(c.backward_w, c.w_shape);
  const bool stale = !c.stale.empty();
  const TensorView<const T> bkv{c.null_k ? nullptr : (stale ? bk : k).data(), c.k_shape},
      bvv{(stale ? bv : v).data(), c.v_shape}, bwv{(stale ? bw : w).data(), c.w_shape};
  const TensorView<T> gqv{gq.data(), c.grad_q_shape}, gkv{gk.data(), c.k_shape},
      gvv{gv.data(), c.v_shape}, gwv{gw.data(), c.grad_w_shape};
  if (c.backward && c.keep_state)
    backward<T>(opt, qv, bkv, bvv, bwv, {o.data(), c.o_shape}, {g.data(), c.o_shape}, gqv, gkv, gvv,
                gwv, state);
  else if (c.backward)
    backward<T>(opt, qv, bkv, bvv, bwv, {o.data(), c.o_shape}, {g.data(), c.o_shape}, gqv, gkv, gvv,
                gwv);
  if (!c.flaw.empty()) return "flawed input was accepted";

  // make_random_call rounds float32 inputs, so the reference sees the kernel's values.
  const std::vector<std::vector<T>*> got = {&o, &gq, &gk, &gv, &gw};
  if (stale) return "a stale state was accepted";
  const std::vector<NamedResult> want = reference_results(c);
  for (size_t r = 0; r < want.size(); ++r) {
    const std::string problem = compare_result(
        want[r], std::vector<double>(got[r]->begin(), got[r]->end()), sizeof(T) == 4);
    if (!problem.empty()) return problem;
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
      if (problem.empty())
        outcomes.success(c.flaw.empty() ? "consistent" : c.flaw);
      else
        outcomes.failure(c.describe() + ": " + problem);
    } catch (const mhla::Error& e) {
      outcomes.named_error(c, e.what());
    } catch (const std::exception& e) {
      outcomes.failure(c.describe() + ": unexpected exception " + e.what());
    }
  }
  return outcomes.report();
}
