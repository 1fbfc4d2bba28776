#pragma once
// The operator's options as Python objects: mhla.Masking, mhla.FeatureMap and
// mhla.MixingForm are the C++ enums, and mhla.Options / mhla.LinearOptions /
// mhla.VarlenOptions the C++ structs, so that a layer builds its options once and hands the same
// object to forward and backward. Each keyword left as None keeps the C++
// default (include/mhla/options.hpp is the one place that states them), and
// an enum may also be given by its name ("causal").
#include <pybind11/pybind11.h>

#include "mhla/options.hpp"
#include "mhla/varlen.hpp"

namespace mhla::python {

void bind_options(pybind11::module_& m);

// The option keywords of a call, each None when not given.
struct OptionKeywords {
  pybind11::object masking, feature_map, normalize, eps, scale;
};

// Sets the options whose keyword is not None (checking types and enum names);
// the masking keyword only where the options have masking.
void apply_keywords(const OptionKeywords& keywords, ReadoutOptions& options);
void apply_keywords(const OptionKeywords& keywords, LinearAttentionOptions& options);
// A MixingForm given as itself or by its name ("dense", "toeplitz").
MixingForm mixing_form_of(const pybind11::object& value);

// `options` (an Options / LinearOptions object, or None) or the keywords; not both.
Options options_of(const pybind11::object& options, const pybind11::object& layout,
                   const OptionKeywords& keywords, const pybind11::object& mixing);
LinearAttentionOptions linear_options_of(const pybind11::object& options,
                                         const OptionKeywords& keywords);
// `options` (a VarlenOptions object, or None) or block, mixing and the keywords; not both.
VarlenOptions varlen_options_of(const pybind11::object& options, const pybind11::object& block,
                                const pybind11::object& mixing, const OptionKeywords& keywords);

}  // namespace mhla::python
