#include "core/finite_results.hpp"

namespace mhla::detail {

std::string element_name(const char* name, const std::vector<int64_t>& shape, int64_t flat) {
  std::vector<int64_t> index(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    index[d] = flat % shape[d];
    flat /= shape[d];
  }
  std::string text = std::string(name) + "[";
  for (size_t d = 0; d < index.size(); ++d) text += (d ? ", " : "") + std::to_string(index[d]);
  return text + "]";
}

std::string non_finite_reason(const Problem& problem, bool single_precision) {
  const bool normalize = problem.normalize;
  const double eps = problem.eps;
  const FeatureMap phi = problem.phi;
  const std::string type = single_precision ? "float32" : "float64";
  if (!normalize)
    return "scale * phi(q)^T S~ exceeds the " + type + " range; rescale q, k or v" +
           (single_precision ? ", or compute in float64" : "");
  std::string zero_denominator;
  if (eps == 0) zero_denominator = "eps = 0 with all-zero features gives 0 / 0";
  if (phi == FeatureMap::identity)
    zero_denominator += std::string(zero_denominator.empty() ? "" : "; ") +
                        "the identity feature map's signed sums phi(q)^T z~ can cancel to -eps";
  return "the normalized read-out phi(q)^T S~ / (phi(q)^T z~ + eps) has a zero denominator or "
         "overflows " +
         type + (zero_denominator.empty() ? "" : " (" + zero_denominator + ")") +
         "; rescale q and k" + (single_precision ? ", compute in float64" : "") +
         (phi == FeatureMap::identity ? ", use a positive feature map (relu, elu1)" : "") +
         (eps == 0 ? ", or use eps > 0" : "");
}

std::string non_finite_message(const std::string& what,
                               const std::vector<std::pair<std::string, double>>& magnitudes,
                               const Problem& problem, bool single_precision) {
  std::string bounds;
  for (const auto& [name, largest] : magnitudes)
    bounds += (bounds.empty() ? "|" : ", |") + name + "| <= " + format_number(largest);
  // Without magnitudes (a check that saw only a flag) the parenthesis goes.
  return what + " is not finite although every input is finite" +
         (bounds.empty() ? "" : " (" + bounds + ")") + ": " +
         non_finite_reason(problem, single_precision);
}

}  // namespace mhla::detail
