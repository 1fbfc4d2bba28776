#include "phases_bindings.hpp"

#include <pybind11/stl.h>

#include <cstring>

#include "dlpack_buffer.hpp"
#include "dlpack_import.hpp"
#include "mhla/phases.hpp"
#include "mhla/shards.hpp"

namespace py = pybind11;
using namespace py::literals;

namespace mhla::python {
namespace {

// The backward phases add to their outputs: these start at zero.
Buffer zeros(DType dtype, std::vector<int64_t> shape) {
  Buffer b(dtype, std::move(shape));
  size_t bytes = dtype_size(dtype);
  for (int64_t e : b.shape()) bytes *= size_t(e);
  std::memset(b.view<char>().data, 0, bytes);
  return b;
}

std::vector<int64_t> summary_shape(const ImportedTensor& k, const ImportedTensor& v,
                                   int64_t blocks) {
  if (k.shape().size() != 4 || v.shape().size() != 4)
    throw py::value_error("k and v must be [B, N, H, D]; got k " + shape_to_string(k.shape()) +
                          " and v " + shape_to_string(v.shape()));
  return {k.shape()[0], k.shape()[2], blocks, k.shape()[3], v.shape()[3] + 1};
}

Buffer block_summaries_py(py::handle k_, py::handle v_, const Options& options) {
  ImportedTensor k(k_, "k"), v(v_, "v");
  check_same_dtype({&k, &v});
  Buffer s(k.dtype(), summary_shape(k, v, options.layout.num_blocks()));
  dispatch(k.dtype(), [&]<typename T>() {
    py::gil_scoped_release release;
    block_summaries<T>(options, k.view<T>(), v.view<T>(), s.view<T>());
  });
  return s;
}

Buffer mix_summaries_py(py::handle w_, py::handle s_, const Options& options, int64_t first_block,
                        int64_t blocks) {
  ImportedTensor w(w_, "w"), s(s_, "summaries");
  check_same_dtype({&w, &s});
  if (s.shape().size() != 5)
    throw py::value_error("summaries must be [B, H, M, Dk, Dv + 1]; got " +
                          shape_to_string(s.shape()));
  std::vector<int64_t> shape = s.shape();
  shape[2] = blocks;
  Buffer mixed(s.dtype(), shape);
  dispatch(s.dtype(), [&]<typename T>() {
    py::gil_scoped_release release;
    mix_summaries<T>(options, w.view<T>(), s.view<T>(), mixed.view<T>(), first_block);
  });
  return mixed;
}

Buffer read_out_py(py::handle q_, py::handle k_, py::handle v_, py::handle w_, py::handle m_,
                   const Options& options, int64_t first_block) {
  ImportedTensor q(q_, "q"), k(k_, "k"), v(v_, "v"), w(w_, "w"), mixed(m_, "mixed");
  check_same_dtype({&q, &k, &v, &w, &mixed});
  if (v.shape().size() != 4)
    throw py::value_error("v must be [B, N, H, Dv]; got " + shape_to_string(v.shape()));
  Buffer o(q.dtype(), v.shape());
  dispatch(q.dtype(), [&]<typename T>() {
    py::gil_scoped_release release;
    read_out<T>(options, q.view<T>(), k.view<T>(), v.view<T>(), w.view<T>(), mixed.view<T>(),
                o.view<T>(), first_block);
  });
  return o;
}

py::tuple read_out_backward_py(py::handle q_, py::handle k_, py::handle v_, py::handle w_,
                               py::handle m_, py::handle o_, py::handle g_, const Options& options,
                               int64_t first_block) {
  ImportedTensor q(q_, "q"), k(k_, "k"), v(v_, "v"), w(w_, "w"), mixed(m_, "mixed"), o(o_, "o"),
      grad_o(g_, "grad_o");
  check_same_dtype({&q, &k, &v, &w, &mixed, &o, &grad_o});
  Buffer gq = zeros(q.dtype(), q.shape()), gk = zeros(q.dtype(), k.shape()),
         gv = zeros(q.dtype(), v.shape()), gm = zeros(q.dtype(), mixed.shape()),
         gw = zeros(q.dtype(), w.shape());
  dispatch(q.dtype(), [&]<typename T>() {
    py::gil_scoped_release release;
    read_out_backward<T>(options, q.view<T>(), k.view<T>(), v.view<T>(), w.view<T>(),
                         mixed.view<T>(), o.view<T>(), grad_o.view<T>(), gq.view<T>(), gk.view<T>(),
                         gv.view<T>(), gm.view<T>(), gw.view<T>(), first_block);
  });
  return py::make_tuple(std::move(gq), std::move(gk), std::move(gv), std::move(gm), std::move(gw));
}

py::tuple mix_summaries_backward_py(py::handle w_, py::handle s_, py::handle gm_,
                                    const Options& options, int64_t first_block) {
  ImportedTensor w(w_, "w"), s(s_, "summaries"), gm(gm_, "grad_mixed");
  check_same_dtype({&w, &s, &gm});
  Buffer gs = zeros(s.dtype(), s.shape()), gw = zeros(s.dtype(), w.shape());
  dispatch(s.dtype(), [&]<typename T>() {
    py::gil_scoped_release release;
    mix_summaries_backward<T>(options, w.view<T>(), s.view<T>(), gm.view<T>(), gs.view<T>(),
                              gw.view<T>(), first_block);
  });
  return py::make_tuple(std::move(gs), std::move(gw));
}

py::tuple block_summaries_backward_py(py::handle k_, py::handle v_, py::handle gs_,
                                      const Options& options) {
  ImportedTensor k(k_, "k"), v(v_, "v"), gs(gs_, "grad_summaries");
  check_same_dtype({&k, &v, &gs});
  Buffer gk = zeros(k.dtype(), k.shape()), gv = zeros(k.dtype(), v.shape());
  dispatch(k.dtype(), [&]<typename T>() {
    py::gil_scoped_release release;
    block_summaries_backward<T>(options, k.view<T>(), v.view<T>(), gs.view<T>(), gk.view<T>(),
                                gv.view<T>());
  });
  return py::make_tuple(std::move(gk), std::move(gv));
}

}  // namespace

void bind_phases(py::module_& m) {
  py::class_<Shard>(m, "Shard", "One rank's part of a sequence (mhla/shards.hpp).")
      .def_readonly("first_token", &Shard::first_token)
      .def_readonly("tokens", &Shard::tokens)
      .def_readonly("first_block", &Shard::first_block)
      .def_readonly("blocks", &Shard::blocks)
      .def_readonly("layout", &Shard::layout)
      .def("__repr__", [](const Shard& s) {
        return "<mhla.Shard tokens " + std::to_string(s.first_token) + "+" +
               std::to_string(s.tokens) + ", blocks " + std::to_string(s.first_block) + "+" +
               std::to_string(s.blocks) + ">";
      });
  m.def("plan_shards", &plan_shards, "layout"_a, "tokens_per_rank"_a,
        "The shards of ranks holding tokens_per_rank[r] tokens each, in rank order.");
  m.def("block_summaries", &block_summaries_py, "k"_a, "v"_a, py::kw_only(), "options"_a,
        "Phase 1: summaries [B, H, M, Dk, Dv + 1] of options.layout's blocks.");
  m.def("mix_summaries", &mix_summaries_py, "w"_a, "summaries"_a, py::kw_only(), "options"_a,
        "first_block"_a, "blocks"_a,
        "Phase 2: the mixed summaries of W's rows first_block .. first_block + blocks - 1.");
  m.def("read_out", &read_out_py, "q"_a, "k"_a, "v"_a, "w"_a, "mixed"_a, py::kw_only(), "options"_a,
        "first_block"_a, "Phase 3: o from the mixed summaries.");
  m.def("read_out_backward", &read_out_backward_py, "q"_a, "k"_a, "v"_a, "w"_a, "mixed"_a, "o"_a,
        "grad_o"_a, py::kw_only(), "options"_a, "first_block"_a,
        "Returns (grad_q, grad_k, grad_v, grad_mixed, grad_w): phase 3's share.");
  m.def("mix_summaries_backward", &mix_summaries_backward_py, "w"_a, "summaries"_a, "grad_mixed"_a,
        py::kw_only(), "options"_a, "first_block"_a,
        "Returns (grad_summaries, grad_w): phase 2's share.");
  m.def("block_summaries_backward", &block_summaries_backward_py, "k"_a, "v"_a, "grad_summaries"_a,
        py::kw_only(), "options"_a, "Returns (grad_k, grad_v): phase 1's share.");
}

}  // namespace mhla::python
