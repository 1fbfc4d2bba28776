#include "options.hpp"

#include <pybind11/stl.h>

#include <string>

#include "mhla/layout.hpp"

namespace py = pybind11;
using namespace py::literals;

namespace mhla::python {
namespace {

// An enum given as itself or by its name; anything else is a TypeError. The
// enum's Python name is passed in: pybind11 3 has no py::type::of<Enum>.
template <typename Enum>
Enum enum_of(const py::object& value, const char* name, const char* enum_name,
             Enum (*parse)(const std::string&)) {
  if (py::isinstance<py::str>(value)) return parse(value.cast<std::string>());
  if (py::isinstance<Enum>(value)) return value.cast<Enum>();
  throw py::type_error(std::string(name) + " must be a str or mhla." + enum_name + ", not " +
                       py::str(py::type::of(value).attr("__name__")).cast<std::string>());
}

template <typename T>
T value_of(const py::object& value, const char* name, const char* type) {
  try {
    return value.cast<T>();
  } catch (const py::cast_error&) {
    throw py::type_error(std::string(name) + " must be " + type + ", not " +
                         py::str(py::type::of(value).attr("__name__")).cast<std::string>());
  }
}

}  // namespace

MixingForm mixing_form_of(const py::object& value) {
  return enum_of<MixingForm>(value, "mixing", "MixingForm", parse_mixing_form);
}

void apply_keywords(const OptionKeywords& k, LinearAttentionOptions& o) {
  if (!k.masking.is_none())
    o.masking = enum_of<Masking>(k.masking, "masking", "Masking", parse_masking);
  apply_keywords(k, static_cast<ReadoutOptions&>(o));
}

void apply_keywords(const OptionKeywords& k, ReadoutOptions& o) {
  if (!k.feature_map.is_none())
    o.feature_map =
        enum_of<FeatureMap>(k.feature_map, "feature_map", "FeatureMap", parse_feature_map);
  if (!k.normalize.is_none()) {
    if (!py::isinstance<py::bool_>(k.normalize))
      throw py::type_error("normalize must be a bool, not " +
                           py::str(py::type::of(k.normalize).attr("__name__")).cast<std::string>());
    o.normalize = k.normalize.cast<bool>();
  }
  if (!k.eps.is_none()) o.eps = value_of<double>(k.eps, "eps", "a float");
  if (!k.scale.is_none()) o.scale = value_of<double>(k.scale, "scale", "a float or None");
}

namespace {

bool any_given(const OptionKeywords& k) {
  return !k.masking.is_none() || !k.feature_map.is_none() || !k.normalize.is_none() ||
         !k.eps.is_none() || !k.scale.is_none();
}

void refuse_both(const char* type) {
  throw py::type_error(std::string("pass either options=mhla.") + type +
                       "(...) or the option keywords, not both");
}

Options make_options(const py::object& layout, const OptionKeywords& keywords,
                     const py::object& mixing) {
  Options o;
  if (!layout.is_none()) o.layout = value_of<TokenLayout>(layout, "layout", "an mhla.Layout");
  apply_keywords(keywords, o);
  if (!mixing.is_none()) o.mixing = mixing_form_of(mixing);
  return o;
}

LinearAttentionOptions make_linear_options(const OptionKeywords& keywords) {
  LinearAttentionOptions o;
  apply_keywords(keywords, o);
  return o;
}

VarlenOptions make_varlen_options(const py::object& block, const py::object& mixing,
                                  const OptionKeywords& keywords) {
  VarlenOptions o;
  if (!block.is_none()) o.block = value_of<int64_t>(block, "block", "an int");
  if (!mixing.is_none()) o.mixing = mixing_form_of(mixing);
  apply_keywords(keywords, o);
  return o;
}

std::string describe(const LinearAttentionOptions& o) {
  return std::string("masking=") + to_string(o.masking) +
         ", feature_map=" + to_string(o.feature_map) +
         ", normalize=" + (o.normalize ? "True" : "False") +
         ", eps=" + py::str(py::float_(o.eps)).cast<std::string>() +
         ", scale=" + (o.scale ? py::str(py::float_(*o.scale)).cast<std::string>() : "None");
}

}  // namespace

Options options_of(const py::object& options, const py::object& layout,
                   const OptionKeywords& keywords, const py::object& mixing) {
  if (options.is_none()) return make_options(layout, keywords, mixing);
  if (any_given(keywords) || !layout.is_none() || !mixing.is_none()) refuse_both("Options");
  return value_of<Options>(options, "options", "an mhla.Options");
}

LinearAttentionOptions linear_options_of(const py::object& options,
                                         const OptionKeywords& keywords) {
  if (options.is_none()) return make_linear_options(keywords);
  if (any_given(keywords)) refuse_both("LinearOptions");
  return value_of<LinearAttentionOptions>(options, "options", "an mhla.LinearOptions");
}

VarlenOptions varlen_options_of(const py::object& options, const py::object& block,
                                const py::object& mixing, const OptionKeywords& keywords) {
  if (options.is_none()) return make_varlen_options(block, mixing, keywords);
  if (any_given(keywords) || !block.is_none() || !mixing.is_none()) refuse_both("VarlenOptions");
  return value_of<VarlenOptions>(options, "options", "an mhla.VarlenOptions");
}

void bind_options(py::module_& m) {
  py::enum_<Masking>(m, "Masking")
      .value("none", Masking::none)
      .value("causal", Masking::causal)
      .value("block_causal", Masking::block_causal);
  py::enum_<FeatureMap>(m, "FeatureMap")
      .value("identity", FeatureMap::identity)
      .value("relu", FeatureMap::relu)
      .value("elu1", FeatureMap::elu1);
  py::enum_<MixingForm>(m, "MixingForm")
      .value("dense", MixingForm::dense)
      .value("toeplitz", MixingForm::toeplitz);

  const auto keywords = [](py::object masking, py::object feature_map, py::object normalize,
                           py::object eps, py::object scale) {
    return OptionKeywords{masking, feature_map, normalize, eps, scale};
  };
  py::class_<LinearAttentionOptions>(m, "LinearOptions",
                                     "Options of linear attention (and of MHLA, which adds the "
                                     "layout and the mixing form).")
      .def(py::init([keywords](py::object masking, py::object feature_map, py::object normalize,
                               py::object eps, py::object scale) {
             return make_linear_options(keywords(masking, feature_map, normalize, eps, scale));
           }),
           py::kw_only(), "masking"_a = py::none(), "feature_map"_a = py::none(),
           "normalize"_a = py::none(), "eps"_a = py::none(), "scale"_a = py::none())
      .def_readwrite("masking", &LinearAttentionOptions::masking)
      .def_readwrite("feature_map", &LinearAttentionOptions::feature_map)
      .def_readwrite("normalize", &LinearAttentionOptions::normalize)
      .def_readwrite("eps", &LinearAttentionOptions::eps)
      .def_readwrite("scale", &LinearAttentionOptions::scale)
      .def("__repr__", [](const LinearAttentionOptions& o) {
        return "mhla.LinearOptions(" + describe(o) + ")";
      });
  py::class_<CudaKernels>(m, "CudaKernels",
                          "The CUDA kernel families an MHLA call may run (each off by default "
                          "until it has passed its tests on a GPU; CPU calls ignore them).")
      .def(py::init([](bool bf16_state, bool float16_tensor_cores, bool float32_tensor_cores) {
             return CudaKernels{bf16_state, float16_tensor_cores, float32_tensor_cores};
           }),
           py::kw_only(), "bf16_state"_a = false, "float16_tensor_cores"_a = false,
           "float32_tensor_cores"_a = false)
      .def_readwrite("bf16_state", &CudaKernels::bf16_state)
      .def_readwrite("float16_tensor_cores", &CudaKernels::float16_tensor_cores)
      .def_readwrite("float32_tensor_cores", &CudaKernels::float32_tensor_cores)
      .def("__repr__", [](const CudaKernels& c) {
        const auto flag = [](bool x) { return x ? "True" : "False"; };
        return std::string("mhla.CudaKernels(bf16_state=") + flag(c.bf16_state) +
               ", float16_tensor_cores=" + flag(c.float16_tensor_cores) +
               ", float32_tensor_cores=" + flag(c.float32_tensor_cores) + ")";
      });
  py::class_<Options, LinearAttentionOptions>(m, "Options", "Options of the MHLA operator.")
      .def(py::init([keywords](py::object layout, py::object masking, py::object feature_map,
                               py::object normalize, py::object eps, py::object scale,
                               py::object mixing, py::object cuda) {
             Options o = make_options(layout, keywords(masking, feature_map, normalize, eps, scale),
                                      mixing);
             if (!cuda.is_none())
               o.cuda = value_of<CudaKernels>(cuda, "cuda", "an mhla.CudaKernels");
             return o;
           }),
           "layout"_a = py::none(), py::kw_only(), "masking"_a = py::none(),
           "feature_map"_a = py::none(), "normalize"_a = py::none(), "eps"_a = py::none(),
           "scale"_a = py::none(), "mixing"_a = py::none(), "cuda"_a = py::none())
      .def_readwrite("layout", &Options::layout)
      .def_readwrite("mixing", &Options::mixing)
      .def_readwrite("cuda", &Options::cuda)
      .def("__repr__", [](const Options& o) {
        return "mhla.Options(" +
               (o.layout.empty() ? std::string("no layout") : o.layout.describe()) + ", " +
               describe(o) + ", mixing=" + to_string(o.mixing) + ")";
      });
  py::class_<VarlenOptions, LinearAttentionOptions>(
      m, "VarlenOptions", "Options of packed variable-length batches (mhla.varlen_forward).")
      .def(py::init([keywords](py::object block, py::object masking, py::object feature_map,
                               py::object normalize, py::object eps, py::object scale,
                               py::object mixing) {
             return make_varlen_options(block, mixing,
                                        keywords(masking, feature_map, normalize, eps, scale));
           }),
           py::kw_only(), "block"_a = py::none(), "masking"_a = py::none(),
           "feature_map"_a = py::none(), "normalize"_a = py::none(), "eps"_a = py::none(),
           "scale"_a = py::none(), "mixing"_a = py::none())
      .def_readwrite("block", &VarlenOptions::block)
      .def_readwrite("mixing", &VarlenOptions::mixing)
      .def("__repr__", [](const VarlenOptions& o) {
        return "mhla.VarlenOptions(block=" + std::to_string(o.block) + ", " + describe(o) +
               ", mixing=" + to_string(o.mixing) + ")";
      });
}

}  // namespace mhla::python
