#include "decoder_bindings.hpp"

#include <pybind11/stl.h>

#include <optional>
#include <string>

#include "dlpack_buffer.hpp"
#include "dlpack_import.hpp"
#include "mhla/binding.hpp"
#include "mhla/decoder.hpp"
#include "options.hpp"

namespace py = pybind11;
using namespace py::literals;

namespace mhla::python {
namespace {

// The decoder computes in float32 (its state is float32 whatever the inputs).
void check_float32(std::initializer_list<const ImportedTensor*> tensors) {
  for (const ImportedTensor* t : tensors)
    if (t->dtype() != DType::float32)
      throw py::type_error(std::string(t->name()) + " has dtype " + dtype_name(t->dtype()) +
                           "; the decoder computes in float32 (convert with .float())");
}

DecoderOptions make_decoder_options(int64_t batch, int64_t heads, int64_t dk, int64_t dv,
                                    int64_t block, const py::object& feature_map,
                                    const py::object& normalize, const py::object& eps,
                                    const py::object& scale, const py::object& mixing) {
  DecoderOptions d;
  d.batch = batch;
  d.heads = heads;
  d.dk = dk;
  d.dv = dv;
  d.block = block;
  // A keyword left as None keeps the default.
  apply_keywords({py::none(), feature_map, normalize, eps, scale}, d);
  if (!mixing.is_none()) d.mixing = mixing_form_of(mixing);
  return d;
}

std::string describe(const DecoderOptions& d) {
  return "batch=" + std::to_string(d.batch) + ", heads=" + std::to_string(d.heads) +
         ", dk=" + std::to_string(d.dk) + ", dv=" + std::to_string(d.dv) +
         ", block=" + std::to_string(d.block) + ", feature_map=" + to_string(d.feature_map) +
         ", normalize=" + (d.normalize ? "True" : "False") +
         ", eps=" + py::str(py::float_(d.eps)).cast<std::string>() +
         ", scale=" + (d.scale ? py::str(py::float_(*d.scale)).cast<std::string>() : "None") +
         ", mixing=" + to_string(d.mixing);
}

Decoder make_decoder(const DecoderOptions& options, py::handle w_) {
  ImportedTensor w(w_, "w");
  check_float32({&w});
  return Decoder(options, w.view<float>());
}

Buffer prefill(Decoder& decoder, int64_t seq, py::handle q_, py::handle k_, py::handle v_) {
  ImportedTensor q(q_, "q"), k(k_, "k"), v(v_, "v");
  check_float32({&q, &k, &v});
  if (q.shape().size() != 4)
    throw py::value_error("mhla.Decoder.prefill: q must be [1, L, H, Dk]; got " +
                          shape_to_string(q.shape()));
  const DecoderOptions& d = decoder.options();
  Buffer o(DType::float32, {1, q.shape()[1], d.heads, d.dv});
  // The GIL stays held: a decoder is one mutable state, and holding it keeps
  // two Python threads from updating the same decoder at once.
  decoder.prefill(seq, q.view<float>(), k.view<float>(), v.view<float>(), o.view<float>());
  return o;
}

Buffer step(Decoder& decoder, py::handle q_, py::handle k_, py::handle v_) {
  ImportedTensor q(q_, "q"), k(k_, "k"), v(v_, "v");
  check_float32({&q, &k, &v});
  const DecoderOptions& d = decoder.options();
  Buffer o(DType::float32, {d.batch, 1, d.heads, d.dv});
  decoder.step(q.view<float>(), k.view<float>(), v.view<float>(), o.view<float>());
  return o;
}

py::bytes serialize(const Decoder& decoder) {
  const std::vector<uint8_t> bytes = decoder.serialize();
  return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

Decoder deserialize(const py::bytes& data, const std::optional<DecoderOptions>& expect,
                    const std::string& source) {
  const std::string_view view = data;
  return Decoder::deserialize(std::span(reinterpret_cast<const uint8_t*>(view.data()), view.size()),
                              expect, source);
}

void bind_decoder_checks(py::module_& m) {
  m.def(
      "_check_decoder",
      [](const DecoderOptions& options, py::handle w_) {
        const ImportedTensor w(w_, "w");
        check_float32({&w});
        binding::check_decoder(options, w.shape(), w.view<float>().data);
      },
      "options"_a, "w"_a, "mhla.Decoder's checks of its options and w (a CPU float32 copy).");
  m.def(
      "_check_decoder_sequence",
      [](const std::string& function, const DecoderOptions& options, int64_t seq) {
        binding::check_decoder_sequence(function.c_str(), options, seq);
      },
      "function"_a, "options"_a, "seq"_a);
  m.def(
      "_check_decoder_prefill",
      [](const DecoderOptions& options, const std::vector<int64_t>& w_shape, int64_t seq,
         int64_t position, const std::vector<int64_t>& q_shape, const std::vector<int64_t>& k_shape,
         const std::vector<int64_t>& v_shape) {
        binding::check_decoder_prefill(options, w_shape, seq, position, q_shape, k_shape, v_shape);
      },
      "options"_a, "w_shape"_a, "seq"_a, "position"_a, "q_shape"_a, "k_shape"_a, "v_shape"_a);
  m.def(
      "_check_decoder_step",
      [](const DecoderOptions& options, const std::vector<int64_t>& w_shape,
         const std::vector<int64_t>& positions, const std::vector<int64_t>& q_shape,
         const std::vector<int64_t>& k_shape, const std::vector<int64_t>& v_shape) {
        binding::check_decoder_step(options, w_shape, positions, q_shape, k_shape, v_shape);
      },
      "options"_a, "w_shape"_a, "positions"_a, "q_shape"_a, "k_shape"_a, "v_shape"_a);
}

}  // namespace

void bind_decoder(py::module_& m) {
  bind_decoder_checks(m);
  py::class_<DecoderOptions>(m, "DecoderOptions",
                             "Sizes and options of a streaming decoder (each keyword left as None "
                             "keeps the C++ default).")
      .def(py::init(&make_decoder_options), py::kw_only(), "batch"_a = 1, "heads"_a, "dk"_a, "dv"_a,
           "block"_a, "feature_map"_a = py::none(), "normalize"_a = py::none(),
           "eps"_a = py::none(), "scale"_a = py::none(), "mixing"_a = py::none())
      .def_readonly("batch", &DecoderOptions::batch)
      .def_readonly("heads", &DecoderOptions::heads)
      .def_readonly("dk", &DecoderOptions::dk)
      .def_readonly("dv", &DecoderOptions::dv)
      .def_readonly("block", &DecoderOptions::block)
      .def_readonly("feature_map", &DecoderOptions::feature_map)
      .def_readonly("normalize", &DecoderOptions::normalize)
      .def_readonly("eps", &DecoderOptions::eps)
      .def_readonly("scale", &DecoderOptions::scale)
      .def_readonly("mixing", &DecoderOptions::mixing)
      .def("__repr__",
           [](const DecoderOptions& d) { return "mhla.DecoderOptions(" + describe(d) + ")"; });

  py::class_<Decoder>(m, "Decoder",
                      "Streaming causal MHLA: prefill a prompt per sequence, then one token for "
                      "every sequence per step; outputs equal the causal forward on the whole "
                      "sequence. float32.")
      .def(py::init(&make_decoder), "options"_a, "w"_a)
      .def("prefill", &prefill, "seq"_a, "q"_a, "k"_a, "v"_a,
           "Feeds a prompt q, k [1, L, H, Dk], v [1, L, H, Dv] to the empty sequence `seq`; "
           "returns o [1, L, H, Dv].")
      .def("step", &step, "q"_a, "k"_a, "v"_a,
           "One token for every sequence: q, k [B, 1, H, Dk], v [B, 1, H, Dv]; returns o [B, 1, "
           "H, Dv].")
      .def("position", &Decoder::position, "seq"_a, "Tokens seen by sequence `seq`.")
      .def("reset", &Decoder::reset, "seq"_a, "Empties sequence `seq`.")
      .def_property_readonly(
          "max_tokens",
          [](const Decoder& d) -> std::optional<int64_t> {
            if (d.options().mixing == MixingForm::toeplitz) return std::nullopt;
            return d.max_tokens();
          },
          "Context per sequence (dense mixing: M * block); None for Toeplitz (unbounded).")
      .def_property_readonly("state_bytes", &Decoder::state_bytes)
      .def_property_readonly("summary_bytes", &Decoder::summary_bytes,
                             "Bytes of one block summary in the state (rows padded to 16 floats).")
      .def_property_readonly("options", &Decoder::options)
      .def("serialize", &serialize, "A versioned, CRC-checked snapshot (bytes).")
      .def("save", &Decoder::save, "path"_a,
           "Writes the snapshot to a temporary file, then renames it over `path`.")
      .def_static("deserialize", &deserialize, "data"_a, py::kw_only(), "expect"_a = py::none(),
                  "source"_a = "decoder state",
                  "Rebuilds a decoder from serialize()'s bytes; with `expect` (DecoderOptions) "
                  "a snapshot of another configuration is a ValueError naming the difference.")
      .def_static("load", &Decoder::load, "path"_a, py::kw_only(), "expect"_a = py::none())
      // Reduced to mhla._unpickle.decoder: see there why.
      .def("__reduce__", [](const Decoder& d) {
        return py::make_tuple(py::module_::import("mhla._unpickle").attr("decoder"),
                              py::make_tuple(serialize(d)));
      });
}

}  // namespace mhla::python
