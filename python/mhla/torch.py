"""PyTorch autograd functions and ``nn.Module`` layers on the mhla operator.

Functions (differentiable in every input, including the mixing matrix):
``mhla_attention``, ``varlen_attention`` (packed sequences, ``cu_seqlens``),
``linear_attention``, ``softmax_attention``. Tensors are ``[B, N, H, D]``,
float32 or float64 (bfloat16 and float16 too). CPU tensors run on the C++
operator; non-contiguous inputs are made contiguous first, as any torch op
would. bfloat16 ``mhla_attention`` runs on the operator's bfloat16 path
(block products on bfloat16 operands where the CPU has AVX512-BF16, float32
sums, float32 w); other bfloat16 and float16 inputs run through float32
copies. Tensors on any other device (CUDA, MPS, ...) run the same operator in
plain torch ops (``mhla._torch_forms.lean``: exact, every mode, its backward
written by hand; float16 computed in float32); ``backend="torch"`` asks for that
path on the CPU too, ``backend="cpp"`` for the C++ operator. Results come
back in the input's dtype, gradients included.

Layers take ``x [B, N, dim]`` and return ``[B, N, dim]``:

- ``MHLA1d``: sequences (language models), causal or not, blocks of ``block_size``;
  a causal one also generates token by token from a cache (``new_cache``, ``decode``);
- ``MHLA2d``: image tokens on an ``H x W`` grid (DeiT/DiT style), any grid and tile;
- ``MHLA3d``: video tokens on a ``T x H x W`` grid.

Each has q/k/v/output projections, optional RMSNorm on q and k, an optional
sigmoid output gate, an optional depthwise-convolution positional term on v
(CPE/LePE) and a learnable mixing matrix (``MixingMatrix``) that is
non-negative and row-normalised by construction, initialised with a locality
bias.
"""
from ._authors import authors_video_attention, authors_vision_attention, block_order
from ._torch_functions import (check_finite_results, linear_attention, mhla_attention, set_finite_check,
                               softmax_attention, varlen_attention)
from ._torch_layers import MHLA1d, MHLA1dCache, MHLA2d, MHLA3d
from ._torch_mixing import FreeMixingMatrix, MixingMatrix, RMSNorm

__all__ = [
    "mhla_attention",
    "varlen_attention",
    "linear_attention",
    "softmax_attention",
    "MixingMatrix",
    "FreeMixingMatrix",
    "authors_vision_attention",
    "authors_video_attention",
    "block_order",
    "RMSNorm",
    "MHLA1d",
    "MHLA2d",
    "MHLA3d",
    "MHLA1dCache",
    "set_finite_check",
    "check_finite_results",
]
