#include "distributed/call_descriptor.hpp"

#include <bit>
#include <cstring>

#include "mhla/error.hpp"
#include "mhla_support/checked_math.hpp"

namespace mhla::distributed {
namespace {

enum class Kind { integer, element_type, masking, feature_map, boolean, real, mixing, checksum };
struct Field {
  const char* name;
  Kind kind;
};

// The order of CallDescriptor::values. "tokens" is the rank's own N_r.
constexpr Field kFields[] = {
    {"batch size B", Kind::integer},  {"heads H", Kind::integer},
    {"key size Dk", Kind::integer},   {"value size Dv", Kind::integer},
    {"tokens", Kind::integer},        {"element type", Kind::element_type},
    {"masking", Kind::masking},       {"feature map", Kind::feature_map},
    {"normalize", Kind::boolean},     {"eps", Kind::real},
    {"scale given", Kind::boolean},   {"scale", Kind::real},
    {"mixing form", Kind::mixing},    {"layout rank", Kind::integer},
    {"layout grid T", Kind::integer}, {"layout grid H", Kind::integer},
    {"layout grid W", Kind::integer}, {"layout tile T", Kind::integer},
    {"layout tile H", Kind::integer}, {"layout tile W", Kind::integer},
    {"w's rank", Kind::integer},      {"w's extent 0", Kind::integer},
    {"w's extent 1", Kind::integer},  {"w's extent 2", Kind::integer},
    {"w's values", Kind::checksum},
};
constexpr size_t kTokens = 4;

std::string format(Kind kind, int64_t value) {
  switch (kind) {
    case Kind::element_type:
      return value == 4 ? "float32" : "float64";
    case Kind::masking:
      return to_string(Masking(value));
    case Kind::feature_map:
      return to_string(FeatureMap(value));
    case Kind::boolean:
      return value ? "yes" : "no";
    case Kind::real:
      return std::to_string(std::bit_cast<double>(value));
    case Kind::mixing:
      return to_string(MixingForm(value));
    case Kind::checksum:
      return "checksum " + std::to_string(uint64_t(value));
    case Kind::integer:
      break;
  }
  return std::to_string(value);
}

// FNV-1a over the bytes of w: equal w on every rank is part of the contract.
template <typename T>
uint64_t checksum(const T* data, int64_t count) {
  uint64_t hash = 1469598103934665603ull;
  const auto* bytes = reinterpret_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size_t(count) * sizeof(T); ++i)
    hash = (hash ^ bytes[i]) * 1099511628211ull;
  return hash;
}

void require_rank4(const char* name, const std::vector<int64_t>& shape, const char* hint) {
  if (shape.size() != 4)
    throw Error(std::string(name) + " has shape " + shape_to_string(shape) + "; expected " + hint);
}

}  // namespace

int64_t CallDescriptor::batch() const { return values[0]; }
int64_t CallDescriptor::heads() const { return values[1]; }
int64_t CallDescriptor::dk() const { return values[2]; }
int64_t CallDescriptor::dv() const { return values[3]; }
int64_t CallDescriptor::tokens() const { return values[kTokens]; }

template <typename T>
CallDescriptor describe_call(const Options& options, const TensorView<const T>& q,
                             const TensorView<const T>& v, const TensorView<const T>& w) {
  require_rank4("q", q.shape, "[B, N_r, H, Dk]: this rank's shard");
  require_rank4("v", v.shape, "[B, N_r, H, Dv]: this rank's shard");
  if (w.shape.empty() || w.shape.size() > 3)
    throw Error("w has shape " + shape_to_string(w.shape) +
                "; expected [M, M] or [H, M, M] (Toeplitz: [L + 1] or [H, L + 1])");
  const int64_t w_count = detail::checked_product(w.shape, "w's shape " + shape_to_string(w.shape));
  if (w_count > 0 && w.data == nullptr) throw Error("w is a null pointer");
  const auto& layout = options.layout;
  std::vector<int64_t> d = {q.shape[0],
                            q.shape[2],
                            q.shape[3],
                            v.shape[3],
                            q.shape[1],
                            int64_t(sizeof(T)),
                            int64_t(options.masking),
                            int64_t(options.feature_map),
                            options.normalize,
                            std::bit_cast<int64_t>(options.eps),
                            options.scale.has_value(),
                            std::bit_cast<int64_t>(options.scale.value_or(0.0)),
                            int64_t(options.mixing),
                            layout.rank(),
                            layout.grid()[0],
                            layout.grid()[1],
                            layout.grid()[2],
                            layout.tile()[0],
                            layout.tile()[1],
                            layout.tile()[2],
                            int64_t(w.shape.size())};
  for (size_t i = 0; i < 3; ++i) d.push_back(i < w.shape.size() ? w.shape[i] : 0);
  d.push_back(int64_t(checksum(w.data, w_count)));
  return {std::move(d)};
}

std::string disagreement(const std::vector<CallDescriptor>& ranks) {
  for (size_t r = 1; r < ranks.size(); ++r)
    for (size_t f = 0; f < std::size(kFields); ++f) {
      if (f == kTokens) continue;
      const int64_t mine = ranks[r].values[f], first = ranks[0].values[f];
      if (mine != first)
        return "rank " + std::to_string(r) + " disagrees with rank 0 on " + kFields[f].name + ": " +
               format(kFields[f].kind, mine) + " vs " + format(kFields[f].kind, first) +
               " (every rank must pass the same options, w and sizes B, H, Dk, Dv)";
    }
  return "";
}

template CallDescriptor describe_call<float>(const Options&, const TensorView<const float>&,
                                             const TensorView<const float>&,
                                             const TensorView<const float>&);
template CallDescriptor describe_call<double>(const Options&, const TensorView<const double>&,
                                              const TensorView<const double>&,
                                              const TensorView<const double>&);

size_t call_fields() { return std::size(kFields); }

}  // namespace mhla::distributed
