#pragma once
// Token lookup and learned absolute positions.
#include "train/parameter.hpp"

namespace mhla::train {

template <typename T>
class TokenEmbedding {
 public:
  TokenEmbedding() = default;
  TokenEmbedding(const std::string& name, int64_t vocab, int64_t dim, Rng& rng);

  // tokens [rows] -> y [rows, dim]; a token outside [0, vocab) is an mhla::Error.
  void forward(const int32_t* tokens, int64_t rows, T* y) const;
  void backward(const int32_t* tokens, const T* dy, int64_t rows);

  void collect(ParameterList<T>& out) { out.push_back(&table); }
  int64_t vocab = 0, dim = 0;
  Parameter<T> table;  // [vocab, dim]
};

// y[b, t] += p[t]: one learned vector per position.
template <typename T>
class PositionEmbedding {
 public:
  PositionEmbedding() = default;
  PositionEmbedding(const std::string& name, int64_t tokens, int64_t dim, Rng& rng);

  void add_to(T* x, int64_t batch) const;  // x [batch, tokens, dim]
  void backward(const T* dx, int64_t batch);

  void collect(ParameterList<T>& out) { out.push_back(&table); }
  int64_t tokens = 0, dim = 0;
  Parameter<T> table;  // [tokens, dim]
};

}  // namespace mhla::train
