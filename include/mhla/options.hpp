#pragma once
// Options shared by MHLA and the linear-attention baseline.
#include <optional>
#include <string>

#include "mhla/layout.hpp"
#include "mhla/modes.hpp"

namespace mhla {

// How a query reads a summary: the options every linear form shares (the
// operator, the phases, packed sequences, linear attention and the decoder).
struct ReadoutOptions {
  // elu+1 is positive, so the normaliser cannot vanish; the layers and the
  // mhla program default to it as well.
  FeatureMap feature_map = FeatureMap::elu1;
  // normalized:   o_t = phi(q_t)^T S / (phi(q_t)^T z + eps)
  // unnormalized: o_t = scale * phi(q_t)^T S
  bool normalize = true;
  double eps = 1e-6;
  std::optional<double> scale;  // unnormalized mode only; default Dk^-1/2
};

struct LinearAttentionOptions : ReadoutOptions {
  Masking masking = Masking::none;
};

// How the M x M mixing matrix W is given.
enum class MixingForm {
  dense,     // w [M, M] shared or [H, M, M] per head: W[i, b] = w[i, b]
  toeplitz,  // w [L + 1] shared or [H, L + 1] per head: W[i, b] = w[min(i - b, L)] for b <= i,
             // the last entry being the tail for every distance >= L. Independent of M, so
             // causal sequences of any length share one parameter vector. Causal and
             // block-causal masking only.
};

// The CUDA kernel families a call may run (docs/cuda.md); calls on the CPU
// ignore them. Each is off by default until it has passed its tests on a
// GPU. They are options of the call, so a forward and its backward (and a
// ForwardState's record) agree on them.
struct CudaKernels {
  // bfloat16 calls (and float16 ones, with float16_tensor_cores) on the
  // bfloat16-state kernels, whose backward recomputes its state and reads none
  // of a ForwardState's arrays; otherwise the split-operand tensor-core kernels.
  bool bf16_state = false;
  // float16 calls on the tensor-core kernels; otherwise in float32 on
  // widened copies with the float kernels.
  bool float16_tensor_cores = false;
  // float32 calls on the tensor-core kernels, every operand split into two
  // bfloat16 halves (16 of float32's 24 significant bits, sums in float);
  // otherwise one thread per result.
  bool float32_tensor_cores = false;
};

struct Options : LinearAttentionOptions {
  TokenLayout layout;  // token grid and block tile; its token count must equal N
  MixingForm mixing = MixingForm::dense;
  CudaKernels cuda{};
};

const char* to_string(FeatureMap phi);
const char* to_string(Masking masking);
const char* to_string(MixingForm form);

// The inverses of to_string, for bindings and command lines: an unknown name is
// an mhla::Error listing the valid ones ("unknown masking 'x'; expected none,
// causal or block_causal").
FeatureMap parse_feature_map(const std::string& name);
Masking parse_masking(const std::string& name);
MixingForm parse_mixing_form(const std::string& name);

}  // namespace mhla
