#include "train/rotary.hpp"

#include <cmath>
#include <vector>

#include "mhla/error.hpp"

namespace mhla::train {

template <typename T>
void rotate_positions(T* x, int64_t batch, int64_t tokens, int64_t heads, int64_t head_dim,
                      bool inverse) {
  if (head_dim % 2 != 0)
    throw Error("rotary position embeddings need an even head dimension, got " +
                std::to_string(head_dim));
  const int64_t pairs = head_dim / 2;
  std::vector<double> frequency(static_cast<size_t>(pairs));
  for (int64_t j = 0; j < pairs; ++j)
    frequency[size_t(j)] = std::pow(10000.0, -2.0 * double(j) / double(head_dim));
  const double sign = inverse ? -1.0 : 1.0;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < pairs; ++j) {
      const double angle = sign * double(t) * frequency[size_t(j)];
      const T c = T(std::cos(angle)), s = T(std::sin(angle));
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t h = 0; h < heads; ++h) {
          T* pair = x + ((b * tokens + t) * heads + h) * head_dim + 2 * j;
          const T a = pair[0], e = pair[1];
          pair[0] = c * a - s * e;
          pair[1] = s * a + c * e;
        }
    }
}

template void rotate_positions(float*, int64_t, int64_t, int64_t, int64_t, bool);
template void rotate_positions(double*, int64_t, int64_t, int64_t, int64_t, bool);

}  // namespace mhla::train
