#include "varlen_bindings.hpp"

#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "dlpack_buffer.hpp"
#include "dlpack_import.hpp"
#include "mhla/binding.hpp"
#include "mhla/varlen.hpp"
#include "options.hpp"

namespace py = pybind11;
using namespace py::literals;

namespace mhla::python {
namespace {

TensorView<const int64_t> offsets_view(const std::vector<int64_t>& cu_seqlens) {
  return {cu_seqlens.data(), {static_cast<int64_t>(cu_seqlens.size())}};
}

Buffer forward_py(py::handle q_, py::handle k_, py::handle v_, py::handle w_,
                  const std::vector<int64_t>& cu_seqlens, const VarlenOptions& options) {
  ImportedTensor q(q_, "q"), k(k_, "k"), v(v_, "v"), w(w_, "w");
  check_same_dtype({&q, &k, &v, &w});
  Buffer o(q.dtype(), v.shape());
  dispatch(q.dtype(), [&]<typename T>() {
    py::gil_scoped_release release;
    varlen_forward<T>(options, offsets_view(cu_seqlens), q.view<T>(), k.view<T>(), v.view<T>(),
                      w.view<T>(), o.view<T>());
  });
  return o;
}

py::tuple backward_py(py::handle q_, py::handle k_, py::handle v_, py::handle w_, py::handle o_,
                      py::handle grad_o_, const std::vector<int64_t>& cu_seqlens,
                      const VarlenOptions& options) {
  ImportedTensor q(q_, "q"), k(k_, "k"), v(v_, "v"), w(w_, "w"), o(o_, "o"),
      grad_o(grad_o_, "grad_o");
  check_same_dtype({&q, &k, &v, &w, &o, &grad_o});
  Buffer gq(q.dtype(), q.shape()), gk(q.dtype(), k.shape()), gv(q.dtype(), v.shape()),
      gw(q.dtype(), w.shape());
  dispatch(q.dtype(), [&]<typename T>() {
    py::gil_scoped_release release;
    varlen_backward<T>(options, offsets_view(cu_seqlens), q.view<T>(), k.view<T>(), v.view<T>(),
                       w.view<T>(), o.view<T>(), grad_o.view<T>(), gq.view<T>(), gk.view<T>(),
                       gv.view<T>(), gw.view<T>());
  });
  return py::make_tuple(std::move(gq), std::move(gk), std::move(gv), std::move(gw));
}

}  // namespace

void bind_varlen(py::module_& m) {
  m.def(
      "varlen_forward",
      [](py::handle q, py::handle k, py::handle v, py::handle w, std::vector<int64_t> cu_seqlens,
         py::object options, py::object block, py::object mixing, py::object masking,
         py::object feature_map, py::object normalize, py::object eps, py::object scale) {
        return forward_py(q, k, v, w, cu_seqlens,
                          varlen_options_of(options, block, mixing,
                                            {masking, feature_map, normalize, eps, scale}));
      },
      "q"_a, "k"_a, "v"_a, "w"_a, "cu_seqlens"_a, py::kw_only(), "options"_a = py::none(),
      "block"_a = py::none(), "mixing"_a = py::none(), "masking"_a = py::none(),
      "feature_map"_a = py::none(), "normalize"_a = py::none(), "eps"_a = py::none(),
      "scale"_a = py::none(),
      "Packed sequences q, k [1, total, H, Dk], v [1, total, H, Dv], sequence s holding tokens "
      "cu_seqlens[s] .. cu_seqlens[s + 1] - 1; returns o [1, total, H, Dv]. Options as "
      "options=mhla.VarlenOptions(...) or as keywords (block: 64 when not given).");
  m.def(
      "varlen_backward",
      [](py::handle q, py::handle k, py::handle v, py::handle w, py::handle o, py::handle grad_o,
         std::vector<int64_t> cu_seqlens, py::object options, py::object block, py::object mixing,
         py::object masking, py::object feature_map, py::object normalize, py::object eps,
         py::object scale) {
        return backward_py(q, k, v, w, o, grad_o, cu_seqlens,
                           varlen_options_of(options, block, mixing,
                                             {masking, feature_map, normalize, eps, scale}));
      },
      "q"_a, "k"_a, "v"_a, "w"_a, "o"_a, "grad_o"_a, "cu_seqlens"_a, py::kw_only(),
      "options"_a = py::none(), "block"_a = py::none(), "mixing"_a = py::none(),
      "masking"_a = py::none(), "feature_map"_a = py::none(), "normalize"_a = py::none(),
      "eps"_a = py::none(), "scale"_a = py::none(), "Returns (grad_q, grad_k, grad_v, grad_w).");
  // The plain-torch path's packing checks: varlen_forward's own, on shapes and offsets.
  m.def(
      "_check_varlen_call",
      [](const std::vector<int64_t>& q_shape, const std::vector<int64_t>& k_shape,
         const std::vector<int64_t>& v_shape, const std::vector<int64_t>& w_shape,
         const std::vector<int64_t>& cu_seqlens, py::object block, py::object mixing,
         py::object masking, py::object feature_map, py::object normalize, py::object eps,
         py::object scale) {
        binding::check_varlen_call(varlen_options_of(py::none(), block, mixing,
                                                     {masking, feature_map, normalize, eps, scale}),
                                   cu_seqlens, q_shape, k_shape, v_shape, w_shape);
      },
      "q_shape"_a, "k_shape"_a, "v_shape"_a, "w_shape"_a, "cu_seqlens"_a, py::kw_only(),
      "block"_a = py::none(), "mixing"_a = py::none(), "masking"_a = py::none(),
      "feature_map"_a = py::none(), "normalize"_a = py::none(), "eps"_a = py::none(),
      "scale"_a = py::none());
}

}  // namespace mhla::python
