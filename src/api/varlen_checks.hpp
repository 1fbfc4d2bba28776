#pragma once
// The checks of mhla::varlen_forward that read no tensor data, for the plain-torch path of
// mhla.torch.varlen_attention (python/src/varlen_bindings.cpp): its packed calls are refused
// by these very checks, word for word; w's values are checked by each sequence's own call.
#include <cstdint>
#include <vector>

#include "mhla/varlen.hpp"

namespace mhla::detail {

// Throws mhla::Error for a packed call whose shapes, options or offsets varlen_forward refuses.
void check_varlen_shapes(const VarlenOptions& options, const std::vector<int64_t>& cu_seqlens,
                         const std::vector<int64_t>& q_shape, const std::vector<int64_t>& k_shape,
                         const std::vector<int64_t>& v_shape, const std::vector<int64_t>& w_shape);

}  // namespace mhla::detail
