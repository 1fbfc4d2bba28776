// forward() and backward() with a ForwardState: the saved arrays in memory
// the state owns, and the record of the call that lets backward read them
// without the fingerprint check that arrays from outside get.
#include "mhla/forward_state.hpp"

#include <array>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "api/private_state_backward.hpp"
#include "backend/backend.hpp"
#include "core/allocation.hpp"
#include "core/host_copy.hpp"
#include "core/validate.hpp"
#include "mhla/operator.hpp"

namespace mhla {
namespace detail {

// The tensors a call is recorded by, in this order.
constexpr std::array<const char*, 5> kRecordedTensors{"q", "k", "v", "w", "o"};

template <typename S>
struct ForwardRecord {
  // The summaries, then the mixed summaries, `elements` each, on `device`.
  std::shared_ptr<void> storage;
  size_t capacity = 0;  // bytes
  Device device = Device::cpu;
  std::vector<int64_t> shape;
  int64_t elements = 0;
  bool filled = false;
  // The call that filled them.
  Options options;
  std::array<const void*, 5> addresses{};
  std::array<std::vector<int64_t>, 5> shapes;
  std::vector<S> w_values;
  const char* tokens = "";  // the element type of q, k, v and o

  S* summaries() const { return static_cast<S*>(storage.get()); }
  S* mixed() const { return summaries() + elements; }
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

// The saved arrays' shape, read off q and v before forward validates them:
// forward refuses the call unless this is their shape, and a call whose q or
// v has no plausible shape (empty here) is refused by forward before the
// state is touched.
template <typename X, typename Y>
std::vector<int64_t> state_shape(const Options& options, const TensorView<X>& q,
                                 const TensorView<Y>& v) {
  if (q.shape.size() != 4 || v.shape.size() != 4) return {};
  std::vector<int64_t> shape{q.shape[0], q.shape[2], options.layout.num_blocks(), q.shape[3],
                             v.shape[3] + 1};
  for (int64_t extent : shape)
    if (extent <= 0) return {};
  return shape;
}

// Room for both arrays of `shape` in the state, on q's device.
template <typename S>
void make_room(const char* fn, ForwardRecord<S>& r, const std::vector<int64_t>& shape,
               Device device) {
  r.elements = checked_product(shape, "the forward state's summaries");
  r.shape = shape;
  const size_t bytes = 2 * size_t(r.elements) * sizeof(S);
  if (r.storage != nullptr && r.device == device && r.capacity >= bytes) return;
  r.storage.reset();  // the old arrays go first
  r.capacity = 0;
  const backend::Memory& memory = backend::backend_for(fn, "q", device).memory();
  r.storage = allocating(fn, "the forward state's summaries and mixed summaries", double(bytes),
                         [&] { return memory.allocate(bytes); });
  r.capacity = bytes;
  r.device = device;
}

// forward(..., state) for q, k, v of element type X and w, o of W, O.
template <typename S, typename X, typename W, typename O, typename Forward>
void fill_state(const Options& options, const TensorView<const X>& q, const TensorView<const X>& k,
                const TensorView<const X>& v, const TensorView<const W>& w, const TensorView<O>& o,
                ForwardState<S>& state, Forward&& forward) {
  const char* fn = "mhla::forward";
  ForwardRecord<S>& r = ForwardStateAccess::record(state);
  r.filled = false;
  const std::vector<int64_t> shape = state_shape(options, q, v);
  if (shape.empty()) {
    forward(TensorView<S>{}, TensorView<S>{});  // refuses q or v by name
    fail(fn, "q and v need the shapes [B, N, H, Dk] and [B, N, H, Dv]");
  }
  make_room(fn, r, shape, q.device);
  forward(TensorView<S>{r.summaries(), shape, q.device}, TensorView<S>{r.mixed(), shape, q.device});
  r.options = options;
  r.addresses = {q.data, k.data, v.data, w.data, o.data};
  r.shapes = {q.shape, k.shape, v.shape, w.shape, o.shape};
  const HostCopy hw(w);
  r.w_values.assign(hw.data(), hw.data() + checked_product(w.shape, "w"));
  r.tokens = element_type<X>();
  r.filled = true;
}

// The record of a state given to backward, against the call.
template <typename S, typename X, typename W, typename O>
const ForwardRecord<S>& checked_record(const Options& options, const TensorView<const X>& q,
                                       const TensorView<const X>& k, const TensorView<const X>& v,
                                       const TensorView<const W>& w, const TensorView<O>& o,
                                       const ForwardState<S>& state) {
  const char* fn = "mhla::backward";
  const ForwardRecord<S>* r = ForwardStateAccess::record(state);
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
    if (addresses[i] != r->addresses[i] || *shapes[i] != r->shapes[i] || q.device != r->device)
      fail(fn, std::string(kRecordedTensors[i]) +
                   " is not the tensor that the forward() which filled state read (given " +
                   shape_to_string(*shapes[i]) + " at another address or device; forward read " +
                   shape_to_string(r->shapes[i]) + ")");
  const HostCopy hw(w);
  if (std::memcmp(hw.data(), r->w_values.data(), r->w_values.size() * sizeof(S)) != 0)
    fail(fn,
         "w changed since the forward() that filled state (an optimizer step between forward and "
         "backward?): the gradients would be those of other weights; run forward again");
  return *r;
}

}  // namespace
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

template <typename T>
void forward(const Options& options, TensorView<const T> q, TensorView<const T> k,
             TensorView<const T> v, TensorView<const T> w, TensorView<T> o,
             ForwardState<T>& state) {
  detail::fill_state(options, q, k, v, w, o, state, [&](TensorView<T> s, TensorView<T> m) {
    forward<T>(options, q, k, v, w, o, s, m);
  });
}

void forward(const Options& options, TensorView<const bfloat16> q, TensorView<const bfloat16> k,
             TensorView<const bfloat16> v, TensorView<const float> w, TensorView<bfloat16> o,
             ForwardState<float>& state) {
  detail::fill_state(options, q, k, v, w, o, state, [&](TensorView<float> s, TensorView<float> m) {
    forward(options, q, k, v, w, o, s, m);
  });
}

void forward(const Options& options, TensorView<const float16> q, TensorView<const float16> k,
             TensorView<const float16> v, TensorView<const float> w, TensorView<float16> o,
             ForwardState<float>& state) {
  detail::fill_state(options, q, k, v, w, o, state, [&](TensorView<float> s, TensorView<float> m) {
    forward(options, q, k, v, w, o, s, m);
  });
}

template <typename T>
void backward(const Options& options, TensorView<const T> q, TensorView<const T> k,
              TensorView<const T> v, TensorView<const T> w, TensorView<const T> o,
              TensorView<const T> grad_o, TensorView<T> grad_q, TensorView<T> grad_k,
              TensorView<T> grad_v, TensorView<T> grad_w, const ForwardState<T>& state) {
  const auto& r = detail::checked_record(options, q, k, v, w, o, state);
  detail::backward<T>(detail::SavedArrays::private_to_caller, options, q, k, v, w, o, grad_o,
                      grad_q, grad_k, grad_v, grad_w, {r.summaries(), r.shape, r.device},
                      {r.mixed(), r.shape, r.device});
}

void backward(const Options& options, TensorView<const bfloat16> q, TensorView<const bfloat16> k,
              TensorView<const bfloat16> v, TensorView<const float> w, TensorView<const bfloat16> o,
              TensorView<const bfloat16> grad_o, TensorView<bfloat16> grad_q,
              TensorView<bfloat16> grad_k, TensorView<bfloat16> grad_v, TensorView<float> grad_w,
              const ForwardState<float>& state) {
  const auto& r = detail::checked_record(options, q, k, v, w, o, state);
  detail::backward(detail::SavedArrays::private_to_caller, options, q, k, v, w, o, grad_o, grad_q,
                   grad_k, grad_v, grad_w, {r.summaries(), r.shape, r.device},
                   {r.mixed(), r.shape, r.device});
}

void backward(const Options& options, TensorView<const float16> q, TensorView<const float16> k,
              TensorView<const float16> v, TensorView<const float> w, TensorView<const float16> o,
              TensorView<const float16> grad_o, TensorView<float16> grad_q,
              TensorView<float16> grad_k, TensorView<float16> grad_v, TensorView<float> grad_w,
              const ForwardState<float>& state) {
  const auto& r = detail::checked_record(options, q, k, v, w, o, state);
  detail::backward(detail::SavedArrays::private_to_caller, options, q, k, v, w, o, grad_o, grad_q,
                   grad_k, grad_v, grad_w, {r.summaries(), r.shape, r.device},
                   {r.mixed(), r.shape, r.device});
}

template class ForwardState<float>;
template class ForwardState<double>;

#define MHLA_INSTANTIATE_STATE_CALLS(T)                                                       \
  template void forward<T>(const Options&, TensorView<const T>, TensorView<const T>,          \
                           TensorView<const T>, TensorView<const T>, TensorView<T>,           \
                           ForwardState<T>&);                                                 \
  template void backward<T>(const Options&, TensorView<const T>, TensorView<const T>,         \
                            TensorView<const T>, TensorView<const T>, TensorView<const T>,    \
                            TensorView<const T>, TensorView<T>, TensorView<T>, TensorView<T>, \
                            TensorView<T>, const ForwardState<T>&);
MHLA_INSTANTIATE_STATE_CALLS(float)
MHLA_INSTANTIATE_STATE_CALLS(double)
#undef MHLA_INSTANTIATE_STATE_CALLS

}  // namespace mhla
