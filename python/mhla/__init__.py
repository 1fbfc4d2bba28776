"""MHLA (multi-head linear attention) on the CPU, for any DLPack tensor.

Functions take torch tensors, NumPy arrays or any object with ``__dlpack__``
(float32 or float64, C order, CPU memory) without copying them, and return
results of the same kind as their first argument. Shapes follow the operator:
``q, k [B, N, H, Dk]``, ``v [B, N, H, Dv]``, ``w [M, M]`` or ``[H, M, M]``
(Toeplitz: ``[L + 1]`` or ``[H, L + 1]``). Options are those of the C++
operator: ``masking`` ("none", "causal", "block_causal"), ``feature_map``
("identity", "relu", "elu1", the default), ``normalize``, ``eps``, ``scale`` and ``mixing``
("dense", "toeplitz"), as keywords (None: the operator's default) or as one
``options=mhla.Options(layout, masking=...)`` object; the enums are
``mhla.Masking``, ``mhla.FeatureMap`` and ``mhla.MixingForm``.

``forward`` returns o; ``forward(..., state=mhla.ForwardState())`` keeps what
backward needs in a state object handed to ``backward(..., state=)``, which
refuses a state of another call by name.

Streaming decoding is ``mhla.Decoder`` (prefill, step, snapshots), and packed
variable-length batches (``cu_seqlens``) are ``varlen_forward`` and
``varlen_backward``.

The operator's three phases are here too (``block_summaries``, ``mix_summaries``,
``read_out`` and their ``*_backward``, each returning fresh arrays), with
``plan_shards``, the way ranks split one sequence. For autograd and ``nn.Module``
layers see :mod:`mhla.torch`; for one sequence over several processes
:mod:`mhla.distributed`.
"""
try:
    # torch before the extension, where it is installed (the package imports it anyway): PyPI's torch
    # loads its own OpenMP runtime globally, and the extension, which binds its OpenMP symbols as it
    # loads (-z now), then runs on that one instead of the copy a wheel carries. Two runtimes in one
    # process take the cores from each other's parallel regions (docs/packaging.md).
    import torch  # noqa: F401
except ImportError:
    pass
from . import _convert, _core
from ._convert import like_input
from ._core import (CudaKernels, DecoderOptions, FeatureMap, ForwardState, Layout, LinearOptions, Masking, MixingForm, Options,
                    Shard, VarlenOptions, plan_shards, release_memory)
from .streaming import Decoder, varlen_backward, varlen_forward

__version__ = _core.__version__  # the C++ library's version (CMakeLists.txt's project())

__all__ = [
    "Layout",
    "Options",
    "CudaKernels",
    "LinearOptions",
    "Masking",
    "FeatureMap",
    "MixingForm",
    "forward",
    "backward",
    "ForwardState",
    "linear_attention_forward",
    "linear_attention_backward",
    "softmax_attention_forward",
    "softmax_attention_backward",
    "init_mixing",
    "init_toeplitz_mixing",
    "Decoder",
    "DecoderOptions",
    "varlen_forward",
    "varlen_backward",
    "VarlenOptions",
    "Shard",
    "plan_shards",
    "block_summaries",
    "mix_summaries",
    "read_out",
    "block_summaries_backward",
    "mix_summaries_backward",
    "read_out_backward",
    "release_memory",
]

forward = like_input(_core.forward)
backward = like_input(_core.backward)
linear_attention_forward = like_input(_core.linear_attention_forward)
linear_attention_backward = like_input(_core.linear_attention_backward)
softmax_attention_forward = like_input(_core.softmax_attention_forward)
softmax_attention_backward = like_input(_core.softmax_attention_backward)
block_summaries = like_input(_core.block_summaries)
mix_summaries = like_input(_core.mix_summaries)
read_out = like_input(_core.read_out)
block_summaries_backward = like_input(_core.block_summaries_backward)
mix_summaries_backward = like_input(_core.mix_summaries_backward)
read_out_backward = like_input(_core.read_out_backward)


def init_mixing(layout, *, transform="linear", sigma=1.0, threshold=1.5, causal=False, like=None):
    """Locality-biased ``[M, M]`` mixing matrix for ``layout`` (rows sum to 1).

    Returned as a NumPy array, or as the kind of ``like`` (e.g. a torch tensor).
    """
    buffer = _core.init_mixing(layout, transform=transform, sigma=sigma, threshold=threshold, causal=causal)
    return _convert.to_kind_of(like, buffer)


def init_toeplitz_mixing(length, *, transform="linear", sigma=1.0, threshold=1.5, like=None):
    """Toeplitz mixing vector ``[length + 1]``: ``w[d]`` for block distance ``d``, ``w[length]`` the tail."""
    buffer = _core.init_toeplitz_mixing(length, transform=transform, sigma=sigma, threshold=threshold)
    return _convert.to_kind_of(like, buffer)
