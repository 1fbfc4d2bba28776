#pragma once
// A row added to each row of a gradient tile as it is scattered, before phi'
// applies: the rank-one terms of the backward (a block's dz in every row of
// dphi(K), dy[Dv] z~^T in dphi(Q)) ride on the scatter's pass instead of one
// of their own.
namespace mhla::cpu {

// values scaled by scales[r] for row r (by 1, an exact add, without scales);
// no bias without values.
template <typename T>
struct RowBias {
  const T* values = nullptr;
  const T* scales = nullptr;
};

}  // namespace mhla::cpu
