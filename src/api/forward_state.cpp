// ForwardState: the saved arrays in memory the state owns (or the caller's,
// for a state made with ForwardState::over), and the record of the call that
// backward checks before it reads them.
#include "mhla/forward_state.hpp"

#include <array>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "api/forward_record.hpp"
#include "backend/backend.hpp"
#include "core/allocation.hpp"
#include "core/host_copy.hpp"
#include "core/validate.hpp"
#include "mhla/bfloat16.hpp"
#include "mhla/float16.hpp"

namespace mhla {
namespace detail {

// The tensors a call is recorded by, in this order.
constexpr std::array<const char*, 5> kRecordedTensors{"q", "k", "v", "w", "o"};

template <typename S>
struct ForwardRecord {
  // The arrays (the summaries, then the mixed summaries) in `storage`, which
  // the state owns; or, for a state made with ForwardState::over, the
  // caller's, with no record to check.
  std::shared_ptr<void> storage;
  size_t capacity = 0;  // bytes
  TensorView<S> summaries, mixed;
  bool over_caller_arrays = false;
  bool filled = false;
  // The call that filled them.
  Options options;
  std::array<const void*, 5> addresses{};
  std::array<std::vector<int64_t>, 5> shapes;
  std::vector<S> w_values;
  const char* tokens = "";  // the element type of q, k, v and o
};

struct ForwardStateAccess {
  template <typename S>
  static ForwardRecord<S>& record(ForwardState<S>& state) {
    if (!state.record_) state.record_ = std::make_unique<ForwardRecord<S>>();
    return *state.record_;
  }
  template <typename S>
  static const ForwardRecord<S>* record(const ForwardState<S>& state) {
    return state.record_.get();
  }
};

namespace {

template <typename X>
constexpr const char* element_type() {
  if constexpr (std::is_same_v<X, bfloat16>) return "bfloat16";
  if constexpr (std::is_same_v<X, float16>) return "float16";
  if constexpr (std::is_same_v<X, float>) return "float32";
  return "float64";
}

bool same_options(const Options& a, const Options& b) {
  return a.layout == b.layout && a.mixing == b.mixing && a.masking == b.masking &&
         a.feature_map == b.feature_map && a.normalize == b.normalize && a.eps == b.eps &&
         a.scale == b.scale && a.cuda.bf16_state == b.cuda.bf16_state &&
         a.cuda.float16_tensor_cores == b.cuda.float16_tensor_cores &&
         a.cuda.float32_tensor_cores == b.cuda.float32_tensor_cores;
}

}  // namespace

template <typename S>
void forget_call(ForwardState<S>& state) {
  ForwardStateAccess::record(state).filled = false;
}

template <typename S>
std::pair<S*, S*> arrays_to_fill(const char* fn, const std::vector<int64_t>& shape, Device device,
                                 ForwardState<S>& state) {
  ForwardRecord<S>& r = ForwardStateAccess::record(state);
  if (r.over_caller_arrays) {
    check_output(fn, "the state's summaries", r.summaries, shape, device);
    check_output(fn, "the state's mixed summaries", r.mixed, shape, device);
    return {r.summaries.data, r.mixed.data};
  }
  const int64_t elements = checked_product(shape, "the forward state's summaries");
  const size_t bytes = 2 * size_t(elements) * sizeof(S);
  if (r.storage == nullptr || r.summaries.device != device || r.capacity < bytes) {
    r.storage.reset();  // the old arrays go first
    r.capacity = 0;
    const backend::Memory& memory = backend::backend_for(fn, "q", device).memory();
    r.storage = allocating(fn, "the forward state's summaries and mixed summaries", double(bytes),
                           [&] { return memory.allocate(bytes); });
    r.capacity = bytes;
  }
  S* first = static_cast<S*>(r.storage.get());
  r.summaries = {first, shape, device};
  r.mixed = {first + elements, shape, device};
  return {r.summaries.data, r.mixed.data};
}

template <typename S, typename X>
void record_call(const Options& options, const TensorView<const X>& q, const TensorView<const X>& k,
                 const TensorView<const X>& v, const TensorView<const S>& w,
                 const TensorView<const X>& o, ForwardState<S>& state) {
  ForwardRecord<S>& r = ForwardStateAccess::record(state);
  r.options = options;
  r.addresses = {q.data, k.data, v.data, w.data, o.data};
  r.shapes = {q.shape, k.shape, v.shape, w.shape, o.shape};
  if (!r.over_caller_arrays) {
    const HostCopy hw(w);
    r.w_values.assign(hw.data(), hw.data() + checked_product(w.shape, "w"));
  }
  r.tokens = element_type<X>();
  r.filled = true;
}

template <typename S, typename X>
std::pair<const S*, const S*> arrays_to_read(const Options& options, const TensorView<const X>& q,
                                             const TensorView<const X>& k,
                                             const TensorView<const X>& v,
                                             const TensorView<const S>& w,
                                             const TensorView<const X>& o,
                                             const ForwardState<S>& state) {
  const char* fn = "mhla::backward";
  const ForwardRecord<S>* r = ForwardStateAccess::record(state);
  if (r != nullptr && r->over_caller_arrays) return {r->summaries.data, r->mixed.data};
  if (r == nullptr || !r->filled)
    fail(fn, "state is empty: no forward() has filled it, or the last one given it failed");
  if (r->tokens != std::string_view(element_type<X>()))
    fail(fn, std::string("state was filled by a forward of ") + r->tokens +
                 " tensors, and this backward's q is " + element_type<X>());
  if (!same_options(r->options, options))
    fail(fn, "the options differ from those of the forward() that filled state");
  const std::array<const void*, 5> addresses{q.data, k.data, v.data, w.data, o.data};
  const std::array<const std::vector<int64_t>*, 5> shapes{&q.shape, &k.shape, &v.shape, &w.shape,
                                                          &o.shape};
  for (size_t i = 0; i < addresses.size(); ++i)
    if (addresses[i] != r->addresses[i] || *shapes[i] != r->shapes[i] ||
        q.device != r->summaries.device)
      fail(fn, std::string(kRecordedTensors[i]) +
                   " is not the tensor that the forward() which filled state read (given " +
                   shape_to_string(*shapes[i]) + " at another address or device; forward read " +
                   shape_to_string(r->shapes[i]) + ")");
  const HostCopy hw(w);
  if (std::memcmp(hw.data(), r->w_values.data(), r->w_values.size() * sizeof(S)) != 0)
    fail(fn,
         "w changed since the forward() that filled state (an optimizer step between forward and "
         "backward?): the gradients would be those of other weights; run forward again");
  return {r->summaries.data, r->mixed.data};
}

#define MHLA_INSTANTIATE_RECORD(S, X)                                                     \
  template void record_call<S, X>(const Options&, const TensorView<const X>&,             \
                                  const TensorView<const X>&, const TensorView<const X>&, \
                                  const TensorView<const S>&, const TensorView<const X>&, \
                                  ForwardState<S>&);                                      \
  template std::pair<const S*, const S*> arrays_to_read<S, X>(                            \
      const Options&, const TensorView<const X>&, const TensorView<const X>&,             \
      const TensorView<const X>&, const TensorView<const S>&, const TensorView<const X>&, \
      const ForwardState<S>&);
MHLA_INSTANTIATE_RECORD(float, float)
MHLA_INSTANTIATE_RECORD(double, double)
MHLA_INSTANTIATE_RECORD(float, bfloat16)
MHLA_INSTANTIATE_RECORD(float, float16)
#undef MHLA_INSTANTIATE_RECORD
template void forget_call(ForwardState<float>&);
template void forget_call(ForwardState<double>&);
template std::pair<float*, float*> arrays_to_fill(const char*, const std::vector<int64_t>&, Device,
                                                  ForwardState<float>&);
template std::pair<double*, double*> arrays_to_fill(const char*, const std::vector<int64_t>&,
                                                    Device, ForwardState<double>&);

}  // namespace detail

template <typename S>
ForwardState<S>::ForwardState() = default;
template <typename S>
ForwardState<S>::ForwardState(ForwardState&&) noexcept = default;
template <typename S>
ForwardState<S>& ForwardState<S>::operator=(ForwardState&&) noexcept = default;
template <typename S>
ForwardState<S>::~ForwardState() = default;
template <typename S>
bool ForwardState<S>::empty() const {
  return record_ == nullptr || !record_->filled;
}
template <typename S>
ForwardState<S> ForwardState<S>::over(TensorView<S> summaries, TensorView<S> mixed) {
  ForwardState state;
  detail::ForwardRecord<S>& r = detail::ForwardStateAccess::record(state);
  r.summaries = std::move(summaries);
  r.mixed = std::move(mixed);
  r.over_caller_arrays = true;
  return state;
}

template class ForwardState<float>;
template class ForwardState<double>;

}  // namespace mhla
