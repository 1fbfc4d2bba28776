#include <sstream>

#include "mhla/options.hpp"
#include "mhla/tensor.hpp"
#include "mhla_support/parse_enum.hpp"

namespace mhla {

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ']';
  return out.str();
}

const char* to_string(Device device) {
  switch (device) {
    case Device::cpu:
      return "cpu";
    case Device::cuda:
      return "cuda";
  }
  return "?";
}

const char* to_string(FeatureMap phi) {
  switch (phi) {
    case FeatureMap::identity:
      return "identity";
    case FeatureMap::relu:
      return "relu";
    case FeatureMap::elu1:
      return "elu1";
  }
  return "?";
}

const char* to_string(Masking masking) {
  switch (masking) {
    case Masking::none:
      return "none";
    case Masking::causal:
      return "causal";
    case Masking::block_causal:
      return "block_causal";
  }
  return "?";
}

const char* to_string(MixingForm form) {
  switch (form) {
    case MixingForm::dense:
      return "dense";
    case MixingForm::toeplitz:
      return "toeplitz";
  }
  return "?";
}

FeatureMap parse_feature_map(const std::string& name) {
  return detail::parse_enum(name, "feature map",
                            {FeatureMap::identity, FeatureMap::relu, FeatureMap::elu1});
}

Masking parse_masking(const std::string& name) {
  return detail::parse_enum(name, "masking",
                            {Masking::none, Masking::causal, Masking::block_causal});
}

MixingForm parse_mixing_form(const std::string& name) {
  return detail::parse_enum(name, "mixing form", {MixingForm::dense, MixingForm::toeplitz});
}

}  // namespace mhla
