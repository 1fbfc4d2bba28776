#pragma once
// Rotary position embeddings (Su et al., RoFormer): in every head, the pair
// (x[2j], x[2j+1]) of the token at position t is turned by the angle
// t * 10000^(-2j/head_dim). A rotation is orthogonal, so the backward pass is
// the same rotation by the opposite angle.
#include <cstdint>

namespace mhla::train {

// x [batch, tokens, heads, head_dim], contiguous, rotated in place; position =
// token index. inverse: turn by -angle (the gradient of the forward rotation).
// head_dim must be even.
template <typename T>
void rotate_positions(T* x, int64_t batch, int64_t tokens, int64_t heads, int64_t head_dim,
                      bool inverse);

}  // namespace mhla::train
