#include "train/embedding.hpp"

#include "mhla/error.hpp"

namespace mhla::train {

template <typename T>
TokenEmbedding<T>::TokenEmbedding(const std::string& name, int64_t vocab_, int64_t dim_, Rng& rng)
    : vocab(vocab_), dim(dim_), table(name + ".table", {vocab_, dim_}, /*decay=*/false) {
  fill_normal(table, 0.02, rng);
}

template <typename T>
void TokenEmbedding<T>::forward(const int32_t* tokens, int64_t rows, T* y) const {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t id = tokens[r];
    if (id < 0 || id >= vocab)
      throw Error("token " + std::to_string(id) + " at position " + std::to_string(r) +
                  " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    for (int64_t j = 0; j < dim; ++j) y[r * dim + j] = table.value[size_t(id * dim + j)];
  }
}

template <typename T>
void TokenEmbedding<T>::backward(const int32_t* tokens, const T* dy, int64_t rows) {
  // Serial scatter-add: repeated tokens then always add in the same order.
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < dim; ++j) table.grad[size_t(tokens[r] * dim + j)] += dy[r * dim + j];
}

template <typename T>
PositionEmbedding<T>::PositionEmbedding(const std::string& name, int64_t tokens_, int64_t dim_,
                                        Rng& rng)
    : tokens(tokens_), dim(dim_), table(name + ".table", {tokens_, dim_}, /*decay=*/false) {
  fill_normal(table, 0.02, rng);
}

template <typename T>
void PositionEmbedding<T>::add_to(T* x, int64_t batch) const {
  const int64_t n = tokens * dim;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < n; ++i) x[b * n + i] += table.value[size_t(i)];
}

template <typename T>
void PositionEmbedding<T>::backward(const T* dx, int64_t batch) {
  const int64_t n = tokens * dim;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < n; ++i) table.grad[size_t(i)] += dx[b * n + i];
}

template class TokenEmbedding<float>;
template class TokenEmbedding<double>;
template class PositionEmbedding<float>;
template class PositionEmbedding<double>;

}  // namespace mhla::train
