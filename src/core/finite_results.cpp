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

std::string non_finite_reason(const Problem& problem, const std::string& type) {
  const bool normalize = problem.normalize;
  const double eps = problem.eps;
  const FeatureMap phi = problem.phi;
  // A wider type than the results': float16's range is the narrowest.
  const std::string wider = type == "float64"   ? ""
                            : type == "float16" ? "pass bfloat16 or float32 tensors"
                                                : "compute in float64";
  if (!normalize)
    return "scale * phi(q)^T S~ exceeds the " + type + " range; rescale q, k or v" +
           (wider.empty() ? "" : ", or " + wider);
  std::string zero_denominator;
  if (eps == 0) zero_denominator = "eps = 0 with all-zero features gives 0 / 0";
  if (phi == FeatureMap::identity)
    zero_denominator += std::string(zero_denominator.empty() ? "" : "; ") +
                        "the identity feature map's signed sums phi(q)^T z~ can cancel to -eps";
  // A denominator below 1 / the largest value (features near 1e-20 in
  // float32 multiply to subnormals) has lost its precision, and the read-out's
  // reciprocal of it overflows: named with the zero ones.
  return "the normalized read-out phi(q)^T S~ / (phi(q)^T z~ + eps) has a zero denominator (or "
         "one below " +
         type + "'s normal range, whose reciprocal overflows) or overflows " + type +
         (zero_denominator.empty() ? "" : " (" + zero_denominator + ")") +
         "; rescale q and k" + (wider.empty() ? "" : ", " + wider) +
         (phi == FeatureMap::identity ? ", use a positive feature map (relu, elu1)" : "") +
         (eps == 0 ? ", or use eps > 0" : "");
}

std::string non_finite_message(const std::string& what,
                               const std::vector<std::pair<std::string, double>>& magnitudes,
                               const Problem& problem, const std::string& type) {
  std::string bounds;
  for (const auto& [name, largest] : magnitudes)
    bounds += (bounds.empty() ? "|" : ", |") + name + "| <= " + format_number(largest);
  // Without magnitudes (a check that saw only a flag) the parenthesis goes.
  return what + " is not finite although every input is finite" +
         (bounds.empty() ? "" : " (" + bounds + ")") + ": " + non_finite_reason(problem, type);
}

void check_float16_range(const char* fn, const NamedTensor<float>& result, const char* remedy) {
  const int64_t n = checked_product(result.shape, result.name);
  // From 65520 up a float rounds to float16's infinity (mhla/float16.hpp).
  constexpr float kRoundsToInfinity = 65520.0f;
  float largest = 0;
#pragma omp simd reduction(max : largest)
  for (int64_t i = 0; i < n; ++i)
    largest = std::max(largest, std::isfinite(result.data[i]) ? std::abs(result.data[i]) : 0.0f);
  if (largest < kRoundsToInfinity) return;
  for (int64_t i = 0; i < n; ++i)
    if (std::isfinite(result.data[i]) && std::abs(result.data[i]) >= kRoundsToInfinity)
      fail(fn, float16_range_message(element_name(result.name, result.shape, i), remedy));
}

std::string float16_range_message(const std::string& element, const std::string& remedy) {
  return element + " is beyond float16's range (largest finite 65504) although every input is " +
         "finite; " + remedy + ", or pass bfloat16 or float32 tensors";
}

std::string softmax_overflow_message(const std::vector<std::pair<std::string, double>>& magnitudes,
                                     double scale, const std::string& type) {
  std::string bounds;
  for (const auto& [name, largest] : magnitudes)
    bounds += (bounds.empty() ? "|" : ", |") + name + "| <= " + format_number(largest);
  return "the result is not finite although every input is finite" +
         (bounds.empty() ? "" : " (" + bounds + ", scale " + format_number(scale) + ")") +
         ": the scores q k^T * scale overflow " + type + "; rescale q or k" +
         (type == "float64" ? "" : ", or compute in float64");
}

}  // namespace mhla::detail
