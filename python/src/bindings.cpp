// The extension module mhla._core: the operator, its two baselines and the
// mixing initialisers for any DLPack tensor. Results come back as Buffer
// objects; the Python package turns them into tensors of the caller's kind.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <variant>

#include "conversion_bindings.hpp"
#include "cuda_interop.hpp"
#include "decoder_bindings.hpp"
#include "dlpack_buffer.hpp"
#include "dlpack_import.hpp"
#include "mhla/binding.hpp"
#include "mhla/mhla.hpp"
#include "mhla/version.hpp"
#include "options.hpp"
#include "phases_bindings.hpp"
#include "varlen_bindings.hpp"

namespace py = pybind11;
using namespace py::literals;

namespace mhla::python {
namespace {

// Runs the kernel without the GIL, so other Python threads go on meanwhile.
// mhla::Error (argument named, expected vs given) arrives as ValueError.
template <typename Fn>
void compute(Fn&& fn) {
  py::gil_scoped_release release;
  fn();
}

// The operator's tensors: float32, float64, bfloat16 or float16, on the CPU
// or on CUDA. The results go to q's device; the library refuses a call whose
// tensors are on different devices.
ImportedTensor operator_tensor(py::handle object, const char* name) {
  return ImportedTensor(object, name, true, Devices::cpu_and_cuda);
}

// With 16-bit q, k, v (and o, grad_o), w and a state's arrays are float32.
void check_float32(const ImportedTensor& t, DType tokens) {
  if (t.dtype() != DType::float32)
    throw py::type_error(std::string(t.name()) + " has dtype " + dtype_name(t.dtype()) + "; with " +
                         dtype_name(tokens) + " q, k and v it must be float32");
}

// Runs fn.template operator()<X, S>() for the operator's dtypes: X the type
// of q, k, v and o, S that of w, grad_w and a state (float32 with
// 16-bit tokens, X otherwise).
template <typename Fn>
decltype(auto) dispatch_operator(DType tokens, Fn&& fn) {
  switch (tokens) {
    case DType::bfloat16:
      return fn.template operator()<bfloat16, float>();
    case DType::float16:
      return fn.template operator()<float16, float>();
    case DType::float32:
      return fn.template operator()<float, float>();
    default:
      return fn.template operator()<double, double>();
  }
}

// q, k, v (and the other token tensors) of one dtype, and w of the one that goes with it.
void check_operator_dtypes(std::initializer_list<const ImportedTensor*> tokens,
                           const ImportedTensor& w) {
  check_same_dtype(tokens);
  const ImportedTensor& q = **tokens.begin();
  if (q.dtype() == DType::bfloat16 || q.dtype() == DType::float16)
    check_float32(w, q.dtype());
  else
    check_same_dtype({&q, &w});
}

// An mhla_attention call's shapes and options checked as forward() checks
// them, and w's values when w is a CPU tensor (elsewhere reading them would
// wait for the device): the pure-torch path's errors are the operator's own.
void check_call(const std::vector<int64_t>& q_shape, const std::vector<int64_t>& k_shape,
                const std::vector<int64_t>& v_shape, const std::vector<int64_t>& w_shape,
                py::handle w_values, const Options& options, const std::string& function) {
  const char* fn = function.c_str();
  if (w_values.is_none())
    return binding::check_call(fn, options, q_shape, k_shape, v_shape, w_shape);
  const ImportedTensor w(w_values, "w");
  if (w.dtype() == DType::float32 || w.dtype() == DType::float64)
    dispatch(w.dtype(), [&]<typename T>() {
      binding::check_call(fn, options, q_shape, k_shape, v_shape, w_shape, w.view<T>().data);
    });
  else
    binding::check_call(fn, options, q_shape, k_shape, v_shape, w_shape);
}

// The operator's named error for a result that is not finite although the
// inputs are, for the plain-torch path, which finds the entry and the inputs'
// magnitudes itself: entry = (name, shape, flat index, value); without one,
// `what` names the result (the read-out's denominator when it is empty too).
std::string non_finite_message(
    const std::string& function,
    const std::optional<std::tuple<std::string, std::vector<int64_t>, int64_t, double>>& entry,
    const std::string& what, const std::vector<std::pair<std::string, double>>& magnitudes,
    const Options& options, int64_t dk, const std::string& type) {
  std::string named = what;
  if (entry) {
    const auto& [name, shape, flat, value] = *entry;
    named = binding::element_text(name, shape, flat, value);
  }
  return binding::non_finite_message(function, named, magnitudes, options, dk, type);
}

// A ForwardState of either element type, or none yet.
using AnyForwardState = std::variant<std::monostate, ForwardState<float>, ForwardState<double>>;

// mhla.ForwardState: the C++ ForwardState of the last forward given it (a
// float state for float32, bfloat16 and float16 tensors, a double one for
// float64), with the dtype of that forward's tensors.
class PyForwardState {
 public:
  template <typename S>
  ForwardState<S>& to_fill(DType dtype) {
    if (!std::holds_alternative<ForwardState<S>>(state_)) state_ = ForwardState<S>();
    filled_by_ = dtype;
    return std::get<ForwardState<S>>(state_);
  }
  // A state filled by tensors of another dtype than the backward's is refused
  // by name; an unfilled one reaches backward, which names it empty.
  template <typename S>
  const ForwardState<S>& to_read(DType dtype) const {
    if (std::holds_alternative<std::monostate>(state_)) {
      static const ForwardState<S> unfilled;
      return unfilled;
    }
    if (filled_by_ != dtype)
      throw Error(std::string("mhla::backward: state was filled by a forward of ") +
                  dtype_name(filled_by_) + " tensors, and this backward's q is " +
                  dtype_name(dtype));
    return std::get<ForwardState<S>>(state_);
  }
  bool empty() const {
    return std::visit(
        [](const auto& state) {
          if constexpr (std::is_same_v<std::decay_t<decltype(state)>, std::monostate>)
            return true;
          else
            return state.empty();
        },
        state_);
  }

 private:
  AnyForwardState state_;
  DType filled_by_ = DType::float32;
};

// The checked operands of one call of the operator.
struct OperatorCall {
  ImportedTensor q, k, v, w;
  OperatorCall(py::handle q_, py::handle k_, py::handle v_, py::handle w_)
      : q(operator_tensor(q_, "q")),
        k(operator_tensor(k_, "k")),
        v(operator_tensor(v_, "v")),
        w(operator_tensor(w_, "w")) {}
};

// forward into a new o, filling `fill(S)` (a ForwardState<S>*, or nullptr).
template <typename Fill>
Buffer run_forward(OperatorCall& c, const Options& options, Fill&& fill) {
  check_operator_dtypes({&c.q, &c.k, &c.v}, c.w);
  // The outputs are sized from these shapes, so they are checked first, as forward checks them
  // and under its name (forward then checks the devices and w's values).
  check_call(c.q.shape(), c.k.shape(), c.v.shape(), c.w.shape(), py::none(), options,
             "mhla::forward");
  Buffer o(c.q.dtype(), c.v.shape(), c.q.place());
  dispatch_operator(c.q.dtype(), [&]<typename X, typename S>() {
    ForwardState<S>* state = fill.template operator()<S>();
    compute([&] {
      if (state != nullptr)
        forward<X>(options, c.q.view<X>(), c.k.view<X>(), c.v.view<X>(), c.w.view<S>(), o.view<X>(),
                   *state);
      else
        forward<X>(options, c.q.view<X>(), c.k.view<X>(), c.v.view<X>(), c.w.view<S>(),
                   o.view<X>());
    });
  });
  return o;
}

// backward into new gradients, reading `read(S)` (a const ForwardState<S>*, or nullptr).
template <typename Read>
py::tuple run_backward(OperatorCall& c, py::handle o_, py::handle grad_o_, const Options& options,
                       Read&& read) {
  ImportedTensor o = operator_tensor(o_, "o"), grad_o = operator_tensor(grad_o_, "grad_o");
  check_operator_dtypes({&c.q, &c.k, &c.v, &o, &grad_o}, c.w);
  Buffer gq(c.q.dtype(), c.q.shape(), c.q.place()), gk(c.q.dtype(), c.k.shape(), c.q.place()),
      gv(c.q.dtype(), c.v.shape(), c.q.place()), gw(c.w.dtype(), c.w.shape(), c.q.place());
  dispatch_operator(c.q.dtype(), [&]<typename X, typename S>() {
    const ForwardState<S>* state = read.template operator()<S>();
    compute([&] {
      if (state != nullptr)
        backward<X>(options, c.q.view<X>(), c.k.view<X>(), c.v.view<X>(), c.w.view<S>(),
                    o.view<X>(), grad_o.view<X>(), gq.view<X>(), gk.view<X>(), gv.view<X>(),
                    gw.view<S>(), *state);
      else
        backward<X>(options, c.q.view<X>(), c.k.view<X>(), c.v.view<X>(), c.w.view<S>(),
                    o.view<X>(), grad_o.view<X>(), gq.view<X>(), gk.view<X>(), gv.view<X>(),
                    gw.view<S>());
    });
  });
  return py::make_tuple(std::move(gq), std::move(gk), std::move(gv), std::move(gw));
}

Buffer mhla_forward(py::handle q, py::handle k, py::handle v, py::handle w, const Options& options,
                    PyForwardState* state) {
  OperatorCall c(q, k, v, w);
  const DType tokens = c.q.dtype();
  return run_forward(c, options, [&]<typename S>() -> ForwardState<S>* {
    return state != nullptr ? &state->to_fill<S>(tokens) : nullptr;
  });
}

py::tuple mhla_backward(py::handle q, py::handle k, py::handle v, py::handle w, py::handle o,
                        py::handle grad_o, const Options& options, const PyForwardState* state) {
  OperatorCall c(q, k, v, w);
  const DType tokens = c.q.dtype();
  return run_backward(c, o, grad_o, options, [&]<typename S>() -> const ForwardState<S>* {
    return state != nullptr ? &state->to_read<S>(tokens) : nullptr;
  });
}

// mhla.torch's forward that keeps its state for backward in arrays torch holds
// (a custom op's results must be tensors): (o, summaries, mixed), the arrays in
// w's dtype, filled through a ForwardState over them.
py::tuple forward_into_arrays(py::handle q, py::handle k, py::handle v, py::handle w,
                              const Options& options) {
  OperatorCall c(q, k, v, w);
  std::optional<Buffer> summaries, mixed;
  AnyForwardState state;
  Buffer o = run_forward(c, options, [&]<typename S>() -> ForwardState<S>* {
    const std::vector<int64_t> shape = saved_summaries_shape(options, c.q.shape(), c.v.shape());
    summaries.emplace(c.w.dtype(), shape, c.q.place());
    mixed.emplace(c.w.dtype(), shape, c.q.place());
    return &state.emplace<ForwardState<S>>(
        ForwardState<S>::over(summaries->view<S>(), mixed->view<S>()));
  });
  return py::make_tuple(std::move(o), std::move(*summaries), std::move(*mixed));
}

// Its backward, reading those arrays through a ForwardState over them: torch's
// version counters refuse a backward after q, k, v or w changed in place, which
// is the promise ForwardState::over asks for.
py::tuple backward_from_arrays(py::handle q, py::handle k, py::handle v, py::handle w, py::handle o,
                               py::handle grad_o, py::handle summaries_, py::handle mixed_,
                               const Options& options) {
  OperatorCall c(q, k, v, w);
  ImportedTensor summaries(summaries_, "summaries", false, Devices::cpu_and_cuda),
      mixed(mixed_, "mixed", false, Devices::cpu_and_cuda);
  check_same_dtype({&c.w, &summaries, &mixed});
  AnyForwardState state;
  return run_backward(c, o, grad_o, options, [&]<typename S>() -> const ForwardState<S>* {
    // The arrays are only read: the const views' memory is torch's, writable.
    const auto writable = [](const ImportedTensor& t) {
      const TensorView<const S> view = t.view<S>();
      return TensorView<S>{const_cast<S*>(view.data), view.shape, view.device};
    };
    return &state.emplace<ForwardState<S>>(
        ForwardState<S>::over(writable(summaries), writable(mixed)));
  });
}

Buffer linear_forward(py::handle q_, py::handle k_, py::handle v_,
                      const LinearAttentionOptions& options) {
  ImportedTensor q(q_, "q"), k(k_, "k"), v(v_, "v");
  check_same_dtype({&q, &k, &v});
  Buffer o(q.dtype(), v.shape());
  dispatch(q.dtype(), [&]<typename T>() {
    compute([&] {
      linear_attention_forward<T>(options, q.view<T>(), k.view<T>(), v.view<T>(), o.view<T>());
    });
  });
  return o;
}

py::tuple linear_backward(py::handle q_, py::handle k_, py::handle v_, py::handle o_,
                          py::handle grad_o_, const LinearAttentionOptions& options) {
  ImportedTensor q(q_, "q"), k(k_, "k"), v(v_, "v"), o(o_, "o"), grad_o(grad_o_, "grad_o");
  check_same_dtype({&q, &k, &v, &o, &grad_o});
  Buffer gq(q.dtype(), q.shape()), gk(q.dtype(), k.shape()), gv(q.dtype(), v.shape());
  dispatch(q.dtype(), [&]<typename T>() {
    compute([&] {
      linear_attention_backward<T>(options, q.view<T>(), k.view<T>(), v.view<T>(), o.view<T>(),
                                   grad_o.view<T>(), gq.view<T>(), gk.view<T>(), gv.view<T>());
    });
  });
  return py::make_tuple(std::move(gq), std::move(gk), std::move(gv));
}

py::tuple softmax_forward(py::handle q_, py::handle k_, py::handle v_,
                          const SoftmaxOptions& options) {
  ImportedTensor q(q_, "q"), k(k_, "k"), v(v_, "v");
  check_same_dtype({&q, &k, &v});
  if (q.shape().size() != 4)
    throw py::value_error("q must be [B, N, H, D]; got " + shape_to_string(q.shape()));
  Buffer o(q.dtype(), v.shape());
  Buffer lse(q.dtype(), {q.shape()[0], q.shape()[2], q.shape()[1]});
  dispatch(q.dtype(), [&]<typename T>() {
    compute([&] {
      softmax_attention_forward<T>(options, q.view<T>(), k.view<T>(), v.view<T>(), o.view<T>(),
                                   lse.view<T>());
    });
  });
  return py::make_tuple(std::move(o), std::move(lse));
}

py::tuple softmax_backward(py::handle q_, py::handle k_, py::handle v_, py::handle o_,
                           py::handle lse_, py::handle grad_o_, const SoftmaxOptions& options) {
  ImportedTensor q(q_, "q"), k(k_, "k"), v(v_, "v"), o(o_, "o"), lse(lse_, "lse"),
      grad_o(grad_o_, "grad_o");
  check_same_dtype({&q, &k, &v, &o, &lse, &grad_o});
  Buffer gq(q.dtype(), q.shape()), gk(q.dtype(), k.shape()), gv(q.dtype(), v.shape());
  dispatch(q.dtype(), [&]<typename T>() {
    compute([&] {
      softmax_attention_backward<T>(options, q.view<T>(), k.view<T>(), v.view<T>(), o.view<T>(),
                                    lse.view<T>(), grad_o.view<T>(), gq.view<T>(), gk.view<T>(),
                                    gv.view<T>());
    });
  });
  return py::make_tuple(std::move(gq), std::move(gk), std::move(gv));
}

Buffer float32_buffer(const std::vector<float>& values, std::vector<int64_t> shape) {
  Buffer b(DType::float32, std::move(shape));
  std::copy(values.begin(), values.end(), b.view<float>().data);
  return b;
}

MixingInit make_init(const std::string& transform, double sigma, double threshold, bool causal) {
  MixingInit init;
  init.transform = parse_mixing_transform(transform);
  init.sigma = sigma;
  init.threshold = threshold;
  init.causal = causal;
  return init;
}

// Result memory: its reuse, its export (DLPack, NumPy) and the errors of a failed allocation.
void bind_memory(py::module_& m) {
  m.def(
      "release_memory",
      [] {
        release_recycled_buffers();
        release_scratch();
      },
      "Frees the memory kept for reuse: freed results of 1 MiB or more (up to 2 GiB) and the "
      "calling thread's scratch arrays.");
  m.def("recycled_buffer_bytes", &recycled_buffer_bytes,
        "Bytes of freed results kept for reuse by results of the same size.");
  // mhla::Error derives from std::invalid_argument, which pybind11 raises as
  // ValueError; a failed allocation is a MemoryError with the same message.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const OutOfMemory& e) {
      PyErr_SetString(PyExc_MemoryError, e.what());
    }
  });

  py::class_<Buffer>(m, "Buffer",
                     "Result memory, exported through DLPack (torch.from_dlpack) or NumPy's "
                     "array interface (numpy.asarray).")
      .def_property_readonly("__array_interface__", &Buffer::array_interface)
      .def("__dlpack__", &Buffer::dlpack, "stream"_a = py::none())
      .def("__dlpack_device__", &Buffer::dlpack_device)
      .def_property_readonly("shape",
                             [](const Buffer& b) { return py::tuple(py::cast(b.shape())); })
      .def_property_readonly("dtype", [](const Buffer& b) { return dtype_name(b.dtype()); });
}

void bind_layout(py::module_& m) {
  py::class_<TokenLayout>(m, "Layout",
                          "How the N tokens map onto the M blocks (1D sequence, 2D or 3D grid).")
      .def_static("sequence", &TokenLayout::sequence, "tokens"_a, "block"_a,
                  "1D: `tokens` tokens in blocks of `block`; M = ceil(tokens / block).")
      .def_static(
          "grid2d", &TokenLayout::grid2d, "height"_a, "width"_a, "tile_height"_a, "tile_width"_a,
          "2D: a height x width token grid (row-major) in tiles; edge tiles may be smaller.")
      .def_static("grid3d", &TokenLayout::grid3d, "frames"_a, "height"_a, "width"_a,
                  "tile_frames"_a, "tile_height"_a, "tile_width"_a,
                  "3D: frames x height x width tokens in tiles.")
      .def_property_readonly("rank", &TokenLayout::rank)
      .def_property_readonly("num_tokens", &TokenLayout::num_tokens)
      .def_property_readonly("num_blocks", &TokenLayout::num_blocks)
      .def_property_readonly("grid", &TokenLayout::grid,
                             "(T, H, W) token extents; leading 1s for lower ranks")
      .def_property_readonly("tile", &TokenLayout::tile)
      .def_property_readonly("block_grid", &TokenLayout::block_grid)
      .def("block_of", &TokenLayout::block_of, "token"_a)
      .def("__eq__", [](const TokenLayout& a, const TokenLayout& b) { return a == b; })
      .def("__repr__", [](const TokenLayout& l) { return "<mhla.Layout " + l.describe() + ">"; })
      // Reduced to mhla._unpickle.layout: see there why.
      .def("__reduce__", [](const TokenLayout& l) {
        return py::make_tuple(py::module_::import("mhla._unpickle").attr("layout"),
                              py::make_tuple(l.rank(), l.grid(), l.tile()));
      });
}

// MHLA's forward and backward, and the checks and messages the plain-torch path shares with them.
void bind_operator(py::module_& m) {
  py::class_<PyForwardState>(
      m, "ForwardState",
      "What forward keeps for backward: pass one as state= to both calls. It owns the block and "
      "mixed summaries and records the call (options, the tensors' addresses and shapes, w's "
      "values); backward refuses a state that another call filled. q, k, v and o must not be "
      "written between the two calls.")
      .def(py::init<>())
      .def_property_readonly("empty", &PyForwardState::empty,
                             "Whether no forward has filled it (or the last one failed).");
  // The option keywords default to None (the C++ defaults), or options= takes
  // an Options object built once, e.g. by a layer for its forward and backward.
  m.def(
      "forward",
      [](py::handle q, py::handle k, py::handle v, py::handle w, py::object options,
         py::object layout, py::object masking, py::object feature_map, py::object normalize,
         py::object eps, py::object scale, py::object mixing, PyForwardState* state,
         py::object stream) {
        const cuda::CallStream on(stream);
        return mhla_forward(
            q, k, v, w,
            options_of(options, layout, {masking, feature_map, normalize, eps, scale}, mixing),
            state);
      },
      "q"_a, "k"_a, "v"_a, "w"_a, py::kw_only(), "options"_a = py::none(), "layout"_a = py::none(),
      "masking"_a = py::none(), "feature_map"_a = py::none(), "normalize"_a = py::none(),
      "eps"_a = py::none(), "scale"_a = py::none(), "mixing"_a = py::none(), "state"_a = py::none(),
      "stream"_a = py::none(),
      "Returns o. state (a ForwardState) keeps the block and mixed summaries [B, H, M, Dk, Dv + 1] "
      "for a backward given the same state, which then recomputes neither. "
      "CUDA tensors: the call runs on `stream`, a cudaStream_t as an int (torch: "
      "torch.cuda.current_stream().cuda_stream), None for the legacy default stream.");
  m.def("_check_call", &check_call, "q_shape"_a, "k_shape"_a, "v_shape"_a, "w_shape"_a,
        "w_values"_a, "options"_a, "function"_a = "mhla::forward",
        "Raises forward()'s error for these shapes and options (and w's values, given a CPU w).");
  m.def("_non_finite_message", &non_finite_message, "function"_a, "entry"_a, "what"_a,
        "magnitudes"_a, "options"_a, "dk"_a, "type"_a,
        "The operator's error text for a non-finite result of finite inputs.");
  m.def(
      "_float16_range_message",
      [](const std::string& function, const std::string& element, const std::string& remedy) {
        return binding::float16_range_message(function, element, remedy);
      },
      "function"_a, "element"_a, "remedy"_a,
      "The operator's error text for a float16 result beyond float16's range.");
  m.def(
      "_softmax_overflow_message",
      [](const std::string& function, const std::vector<std::pair<std::string, double>>& magnitudes,
         double scale, const std::string& type) {
        return binding::softmax_overflow_message(function, magnitudes, scale, type);
      },
      "function"_a, "magnitudes"_a, "scale"_a, "type"_a,
      "The softmax baseline's error text for a result that is not finite from finite inputs.");
  m.def(
      "backward",
      [](py::handle q, py::handle k, py::handle v, py::handle w, py::handle o, py::handle grad_o,
         py::object options, py::object layout, py::object masking, py::object feature_map,
         py::object normalize, py::object eps, py::object scale, py::object mixing,
         const PyForwardState* state, py::object stream) {
        const cuda::CallStream on(stream);
        return mhla_backward(
            q, k, v, w, o, grad_o,
            options_of(options, layout, {masking, feature_map, normalize, eps, scale}, mixing),
            state);
      },
      "q"_a, "k"_a, "v"_a, "w"_a, "o"_a, "grad_o"_a, py::kw_only(), "options"_a = py::none(),
      "layout"_a = py::none(), "masking"_a = py::none(), "feature_map"_a = py::none(),
      "normalize"_a = py::none(), "eps"_a = py::none(), "scale"_a = py::none(),
      "mixing"_a = py::none(), "state"_a = py::none(), "stream"_a = py::none(),
      "Returns (grad_q, grad_k, grad_v, grad_w). A ForwardState that forward filled (state=) is "
      "held to its record of that call and read instead of recomputing the summaries. "
      "CUDA tensors: the call runs on `stream`, as forward's.");
  m.def(
      "_forward_into_arrays",
      [](py::handle q, py::handle k, py::handle v, py::handle w, const Options& options,
         py::object stream) {
        const cuda::CallStream on(stream);
        return forward_into_arrays(q, k, v, w, options);
      },
      "q"_a, "k"_a, "v"_a, "w"_a, py::kw_only(), "options"_a, "stream"_a = py::none(),
      "(o, summaries, mixed), for mhla.torch, whose autograd keeps the arrays for "
      "_backward_from_arrays.");
  m.def(
      "_backward_from_arrays",
      [](py::handle q, py::handle k, py::handle v, py::handle w, py::handle o, py::handle grad_o,
         py::handle summaries, py::handle mixed, const Options& options, py::object stream) {
        const cuda::CallStream on(stream);
        return backward_from_arrays(q, k, v, w, o, grad_o, summaries, mixed, options);
      },
      "q"_a, "k"_a, "v"_a, "w"_a, "o"_a, "grad_o"_a, py::kw_only(), "summaries"_a, "mixed"_a,
      "options"_a, "stream"_a = py::none(),
      "backward from the arrays _forward_into_arrays returned, for mhla.torch: torch refuses a "
      "backward after an input changed in place.");
}

// Linear attention and softmax attention, the baselines.
void bind_baselines(py::module_& m) {
  m.def(
      "linear_attention_forward",
      [](py::handle q, py::handle k, py::handle v, py::object options, py::object masking,
         py::object feature_map, py::object normalize, py::object eps, py::object scale) {
        return linear_forward(
            q, k, v, linear_options_of(options, {masking, feature_map, normalize, eps, scale}));
      },
      "q"_a, "k"_a, "v"_a, py::kw_only(), "options"_a = py::none(), "masking"_a = py::none(),
      "feature_map"_a = py::none(), "normalize"_a = py::none(), "eps"_a = py::none(),
      "scale"_a = py::none());
  m.def(
      "linear_attention_backward",
      [](py::handle q, py::handle k, py::handle v, py::handle o, py::handle grad_o,
         py::object options, py::object masking, py::object feature_map, py::object normalize,
         py::object eps, py::object scale) {
        return linear_backward(
            q, k, v, o, grad_o,
            linear_options_of(options, {masking, feature_map, normalize, eps, scale}));
      },
      "q"_a, "k"_a, "v"_a, "o"_a, "grad_o"_a, py::kw_only(), "options"_a = py::none(),
      "masking"_a = py::none(), "feature_map"_a = py::none(), "normalize"_a = py::none(),
      "eps"_a = py::none(), "scale"_a = py::none());
  m.def(
      "softmax_attention_forward",
      [](py::handle q, py::handle k, py::handle v, bool causal, std::optional<double> scale) {
        return softmax_forward(q, k, v, SoftmaxOptions{causal, scale});
      },
      "q"_a, "k"_a, "v"_a, py::kw_only(), "causal"_a = false, "scale"_a = py::none(),
      "Returns (o, lse).");
  m.def(
      "softmax_attention_backward",
      [](py::handle q, py::handle k, py::handle v, py::handle o, py::handle lse, py::handle grad_o,
         bool causal, std::optional<double> scale) {
        return softmax_backward(q, k, v, o, lse, grad_o, SoftmaxOptions{causal, scale});
      },
      "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a, "grad_o"_a, py::kw_only(), "causal"_a = false,
      "scale"_a = py::none());
}

// The locality-biased initial mixing.
void bind_initial_mixing(py::module_& m) {
  m.def(
      "init_mixing",
      [](const TokenLayout& layout, const std::string& transform, double sigma, double threshold,
         bool causal) {
        const int64_t m = layout.num_blocks();
        return float32_buffer(init_mixing(layout, make_init(transform, sigma, threshold, causal)),
                              {m, m});
      },
      "layout"_a, py::kw_only(), "transform"_a = "linear", "sigma"_a = 1.0, "threshold"_a = 1.5,
      "causal"_a = false, "Locality-biased [M, M] mixing matrix (float32, rows sum to 1).");
  m.def(
      "init_toeplitz_mixing",
      [](int64_t length, const std::string& transform, double sigma, double threshold) {
        return float32_buffer(
            init_toeplitz_mixing(length, make_init(transform, sigma, threshold, false)),
            {length + 1});
      },
      "length"_a, py::kw_only(), "transform"_a = "linear", "sigma"_a = 1.0, "threshold"_a = 1.5,
      "Toeplitz mixing vector [length + 1] (float32): w[d] for block distance d, w[length] the "
      "tail.");
}

}  // namespace
}  // namespace mhla::python

PYBIND11_MODULE(_core, m) {
  using namespace mhla::python;
  m.doc() =
      "MHLA operator bindings (CPU; CUDA for forward and backward in CUDA builds). Use the mhla "
      "package, which wraps results in the caller's tensor type.";
  m.attr("__version__") = MHLA_VERSION_STRING;
  m.attr("has_cuda_backend") = cuda::backend_built();
  bind_memory(m);
  bind_layout(m);
  bind_options(m);
  bind_phases(m);
  bind_decoder(m);
  bind_varlen(m);
  bind_conversions(m);
  bind_operator(m);
  bind_baselines(m);
  bind_initial_mixing(m);
}
