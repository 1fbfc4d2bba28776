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
plain torch ops (``mhla._pure_torch``: exact, every mode, torch's autograd,
bfloat16 and float16 computed in float32); ``backend="torch"`` asks for that
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
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.dlpack import from_dlpack

from . import _contract, _core, _custom_ops, _finite_results, _pure_torch, _wan_rotary
from ._torch_operands import operand as _operand, tensors as _tensors
from .streaming import Decoder, offsets

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


def set_finite_check(mode):
    """How the plain-torch path checks that finite inputs gave finite results; returns the mode
    it replaces. "auto" (the default): synchronously on the CPU; on other devices without waiting
    for the device, the error raised by a later call or by ``check_finite_results()``. "sync":
    synchronously everywhere (one wait for the device per call), naming the entry and its cause.
    "deferred": the deferred check everywhere. The C++ operator checks its own results."""
    return _finite_results.set_mode(mode)


def check_finite_results():
    """Waits for the device and raises the error of any deferred check (``set_finite_check``)."""
    _finite_results.report(wait=True)


def _second_order(inputs, needs, grad_outputs, recompute):
    """The gradients of a C++-backed function when autograd is asked to differentiate them again
    (``create_graph=True``): the function recomputed in plain torch ops and differentiated there,
    so that no second-order term goes missing. ``needs``: ctx.needs_input_grad for ``inputs``."""
    wanted = [t for t, n in zip(inputs, needs) if n]
    with torch.enable_grad():
        outputs = recompute(*inputs)
    grads = iter(torch.autograd.grad(outputs, wanted, grad_outputs, create_graph=True, allow_unused=True))
    return tuple(next(grads) if n else None for n in needs[:len(inputs)])


class _MHLAFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, w, options):
        operands = [_operand(t) for t in (q, k, v, w)]
        if not any(ctx.needs_input_grad[:4]):
            # Inference: nothing to keep (and bfloat16 mixes on its own products).
            return _tensors(_core.forward(*operands, options=options)[0])[0]
        o, summaries, mixed = _tensors(
            *_core.forward(*operands, options=options, save_summaries=True, save_mixed=True))
        # The block and mixed summaries are O(M Dk Dv) each: keeping them spares
        # backward a pass over k and v and the mix. The inputs themselves are kept, so
        # that a second-order backward can differentiate through them.
        ctx.save_for_backward(q, k, v, w, o, summaries, mixed)
        ctx.options = options
        return o

    @staticmethod
    def backward(ctx, grad_o):
        if torch.is_grad_enabled():
            options = ctx.options
            return (*_second_order(ctx.saved_tensors[:4], ctx.needs_input_grad, grad_o, lambda q, k, v, w:
                                   _pure_torch.mhla_attention(q, k, v, w, options.layout, **_names(options))),
                    None)
        q, k, v, w, o, summaries, mixed = (_operand(t) for t in ctx.saved_tensors)
        # The saved arrays cannot be stale here: only this context holds them, and torch refuses
        # to get here (its saved tensors' version counters) after q, k, v or w changed in place.
        # So backward skips the fingerprint check that mhla.backward runs on arrays from outside.
        grads = _tensors(*_core._backward_private_state(q, k, v, w, o, _operand(grad_o), summaries=summaries,
                                                        mixed=mixed, options=ctx.options))
        return (*grads, None)


class _VarlenFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, w, cu_seqlens, options):
        (o,) = _tensors(_core.varlen_forward(*(_operand(t) for t in (q, k, v, w)), cu_seqlens, **options))
        ctx.save_for_backward(q, k, v, w, o)
        ctx.cu_seqlens, ctx.options = cu_seqlens, options
        return o

    @staticmethod
    def backward(ctx, grad_o):
        if torch.is_grad_enabled():
            cu_seqlens, options = ctx.cu_seqlens, ctx.options
            return (*_second_order(ctx.saved_tensors[:4], ctx.needs_input_grad, grad_o, lambda q, k, v, w:
                                   varlen_attention(q, k, v, w, cu_seqlens, backend="torch", **options)), None, None)
        q, k, v, w, o = (_operand(t) for t in ctx.saved_tensors)
        grads = _tensors(*_core.varlen_backward(q, k, v, w, o, _operand(grad_o), ctx.cu_seqlens, **ctx.options))
        return (*grads, None, None)


class _LinearAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, options):
        (o,) = _tensors(_core.linear_attention_forward(*(_operand(t) for t in (q, k, v)), options=options))
        ctx.save_for_backward(q, k, v, o)
        ctx.options = options
        return o

    @staticmethod
    def backward(ctx, grad_o):
        if torch.is_grad_enabled():
            options = ctx.options
            return (*_second_order(ctx.saved_tensors[:3], ctx.needs_input_grad, grad_o, lambda q, k, v:
                                   _pure_torch.linear_attention(q, k, v, **_names(options))), None)
        q, k, v, o = (_operand(t) for t in ctx.saved_tensors)
        grads = _tensors(*_core.linear_attention_backward(q, k, v, o, _operand(grad_o), options=ctx.options))
        return (*grads, None)


class _SoftmaxAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, options):
        o, lse = _tensors(*_core.softmax_attention_forward(*(_operand(t) for t in (q, k, v)), **options))
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.options = options
        return o

    @staticmethod
    def backward(ctx, grad_o):
        if torch.is_grad_enabled():
            options = ctx.options
            # In query chunks: torch's fused attention kernels have no second derivative.
            return (*_second_order(ctx.saved_tensors[:3], ctx.needs_input_grad, grad_o, lambda q, k, v:
                                   _pure_torch.softmax_attention(q, k, v, fused=False, **options)), None)
        q, k, v, o, lse = (_operand(t) for t in ctx.saved_tensors)
        grads = _tensors(*_core.softmax_attention_backward(q, k, v, o, lse, _operand(grad_o), **ctx.options))
        return (*grads, None)


BACKENDS = ("cpp", "torch")


def _pure_torch_path(backend, *tensors):
    """Whether a call runs in plain torch ops: asked for with ``backend="torch"``, or by default
    when a tensor is not on the CPU (the C++ operator reads CPU memory only)."""
    if backend is None:
        return any(t.device.type != "cpu" for t in tensors)
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected None (by device), 'cpp' or 'torch'")
    return backend == "torch"


def _name(enum_value):
    """An options enum as the pure-torch path's string ("causal", "elu1", ...)."""
    return enum_value.name


def _names(options):
    """An ``Options`` / ``LinearOptions`` object as the pure-torch path's keywords."""
    names = dict(masking=_name(options.masking), feature_map=_name(options.feature_map),
                 normalize=options.normalize, eps=options.eps, scale=options.scale)
    if hasattr(options, "mixing"):
        names["mixing"] = _name(options.mixing)
    return names


_DEFAULTS = _core.Options(_core.Layout.sequence(1, 1))
_ENUM_NAMES = {field: tuple(enum.__members__)
               for field, enum in (("masking", _core.Masking), ("feature_map", _core.FeatureMap),
                                   ("mixing", _core.MixingForm))}


def _option_names(**given):
    """``mhla.Options``' fields as plain values, enums by name, None the operator's default; a
    ValueError names an unknown enum name. Pure Python, for compiled regions."""
    values = {}
    for field, value in given.items():
        value = getattr(_DEFAULTS, field) if value is None else value
        if field in _ENUM_NAMES:
            value = value if isinstance(value, str) else value.name
            if value not in _ENUM_NAMES[field]:
                raise ValueError(f"unknown {field} {value!r}; expected one of {', '.join(_ENUM_NAMES[field])}")
        values[field] = value
    return values


# Reduced-precision inputs the operator does not take (float16, and bfloat16
# for the baselines and varlen) are widened to float32 (differentiably, so
# their gradients come back in their own dtype), and the output is rounded back
# to q's dtype, by the extension's (widen, narrow) pair for each reduced dtype.
# mhla_attention hands bfloat16 to the operator itself.
_WIDENED = {
    torch.bfloat16: (_core.bfloat16_to_float32, _core.float32_to_bfloat16),
    torch.float16: (_core.float16_to_float32, _core.float32_to_float16),
}


def _compute_dtype(q):
    return torch.float32 if q.dtype in _WIDENED else q.dtype


class _Widen(torch.autograd.Function):
    """``x.float()`` for bfloat16 or float16 x, converted by the extension into recycled memory
    (with torch 1.13's casts a bfloat16 ``mhla_attention`` ran at 0.43x of float32 instead of
    0.84x: bench/reduced_precision_bench.py); the gradient is rounded back to x's dtype the same
    way."""

    @staticmethod
    def forward(ctx, x):
        widen, ctx.narrow = _WIDENED[x.dtype]
        ctx.dtype = x.dtype
        return from_dlpack(widen(_operand(x)))

    @staticmethod
    def backward(ctx, grad):
        if torch.is_grad_enabled():  # create_graph=True: a cast autograd differentiates again
            return grad.to(ctx.dtype)
        return from_dlpack(ctx.narrow(_operand(grad)))


class _Narrow(torch.autograd.Function):
    """``x.to(dtype)`` for float32 x and dtype bfloat16 or float16 (round to nearest, ties to
    even), by the extension."""

    @staticmethod
    def forward(ctx, x, dtype):
        ctx.widen, narrow = _WIDENED[dtype]
        return from_dlpack(narrow(_operand(x)))

    @staticmethod
    def backward(ctx, grad):
        if torch.is_grad_enabled():
            return grad.float(), None
        return from_dlpack(ctx.widen(_operand(grad))), None


def _to_float32(t):
    return _Widen.apply(t) if t.dtype in _WIDENED else t.float()


def _to_dtype(o, dtype):
    """The operator's float32 result in the caller's dtype."""
    if dtype in _WIDENED and o.dtype == torch.float32:
        return _Narrow.apply(o, dtype)
    return o.to(dtype)


def _widened(q, k, v):
    """q, k, v (one dtype: ``_contract``) in float32 when that dtype is a reduced one."""
    if q.dtype not in _WIDENED:
        return q, k, v
    return _to_float32(q), _to_float32(k), _to_float32(v)


def mhla_attention(q, k, v, w, layout, *, masking=None, feature_map=None, normalize=None, eps=None,
                   scale=None, mixing=None, backend=None):
    """MHLA of ``q, k [B, N, H, Dk]`` and ``v [B, N, H, Dv]`` with mixing ``w``; returns ``[B, N, H, Dv]``.

    ``w`` is ``[M, M]`` (shared) or ``[H, M, M]`` (per head), or with ``mixing="toeplitz"``
    ``[L + 1]`` / ``[H, L + 1]``; it is cast to q's dtype (float32 for bfloat16 and float16 q). ``layout`` is an ``mhla.Layout``.
    Options left as None take the operator's defaults (``mhla.Options``); enums may be given by name.
    ``backend``: None runs CPU tensors on the C++ operator and others in torch ops; "cpp" or "torch"
    chooses.
    """
    _contract.check_tensors(function="mhla::forward", q=q, k=k, v=v, w=w)
    if _pure_torch.compiling():
        # No extension object can be built in a compiled region: the options go on as names.
        names = _option_names(masking=masking, feature_map=feature_map, normalize=normalize, eps=eps, scale=scale,
                              mixing=mixing)
        geometry = _pure_torch.Geometry.of(layout)
        if _pure_torch_path(backend, q, k, v, w):
            return _pure_torch.mhla_attention(q, k, v, w, geometry, **names)
        if _custom_ops.AVAILABLE:  # the operator checks the call when the op runs
            return _custom_ops.mhla_attention(q, k, v, w, geometry, **names)
        # Before torch 2.4 the extension call below breaks the graph.
    # Built once: forward and backward get the same object, not strings to parse again.
    options = _core.Options(layout, masking=masking, feature_map=feature_map, normalize=normalize, eps=eps,
                            scale=scale, mixing=mixing)
    if _pure_torch_path(backend, q, k, v, w):
        _pure_torch.check_call(q, k, v, w, options)
        return _pure_torch.mhla_attention(q, k, v, w, layout, **_names(options))
    if q.dtype == torch.bfloat16 and k.dtype == v.dtype == q.dtype:
        # The operator's own bfloat16 path (float32 w and saved summaries).
        return _MHLAFunction.apply(q, k, v, w.to(torch.float32), options)
    return _to_dtype(_MHLAFunction.apply(*_widened(q, k, v), w.to(_compute_dtype(q)), options), q.dtype)


def varlen_attention(q, k, v, w, cu_seqlens, *, block, mixing=None, masking=None, feature_map=None,
                     normalize=None, eps=None, scale=None, backend=None):
    """MHLA of S sequences packed in ``q, k [1, total, H, Dk]``, ``v [1, total, H, Dv]``; returns ``[1, total, H, Dv]``.

    Sequence ``s`` holds tokens ``cu_seqlens[s] .. cu_seqlens[s + 1] - 1`` (a list or an integer
    tensor) and is its own 1D problem in blocks of ``block`` tokens; no token reads another
    sequence. Dense ``w [M, M]`` / ``[H, M, M]`` gives sequence ``s`` its top-left corner (M covers
    the longest sequence); ``mixing="toeplitz"`` takes ``[L + 1]`` / ``[H, L + 1]`` for any length.
    Differentiable in q, k, v and w. ``backend`` as for ``mhla_attention``.
    """
    _contract.check_tensors(function="mhla::varlen_forward", q=q, k=k, v=v, w=w)
    if _pure_torch_path(backend, q, k, v, w):
        cu = offsets(cu_seqlens)
        mixing = "dense" if mixing is None else mixing
        _pure_torch.check_packing(q, w, cu, block, mixing)
        options = dict(masking=masking, feature_map=feature_map, normalize=normalize, eps=eps, scale=scale)

        def sequence(a, b):
            # An ordinary call: the sequence's own layout, the corner of a dense w it reads, its checks.
            layout = _core.Layout.sequence(b - a, block)
            m = layout.num_blocks
            corner = w if mixing == "toeplitz" else w[..., :m, :m]
            return mhla_attention(q[:, a:b], k[:, a:b], v[:, a:b], corner, layout, mixing=mixing, backend="torch",
                                  **options)

        return torch.cat([sequence(a, b) for a, b in zip(cu[:-1], cu[1:]) if b > a], dim=1)
    options = dict(block=block, mixing=mixing, masking=masking, feature_map=feature_map, normalize=normalize,
                   eps=eps, scale=scale)
    return _to_dtype(_VarlenFunction.apply(*_widened(q, k, v), w.to(_compute_dtype(q)), offsets(cu_seqlens),
                                           options), q.dtype)


def linear_attention(q, k, v, *, masking=None, feature_map=None, normalize=None, eps=None, scale=None,
                     backend=None):
    """Vanilla linear attention (one global summary; MHLA with a single block), same shapes as ``mhla_attention``."""
    _contract.check_tensors(function="mhla::linear_attention_forward", q=q, k=k, v=v)
    options = _core.LinearOptions(masking=masking, feature_map=feature_map, normalize=normalize, eps=eps,
                                  scale=scale)
    if _pure_torch_path(backend, q, k, v):
        n = q.shape[1] if q.dim() == 4 else 1
        check = _core.Options(_core.Layout.sequence(max(n, 1), max(n, 1)), masking=options.masking,
                              feature_map=options.feature_map, normalize=options.normalize, eps=options.eps,
                              scale=options.scale)
        _pure_torch.check_call(q, k, v, q.new_ones(1, 1), check, "mhla::linear_attention_forward")
        return _pure_torch.linear_attention(q, k, v, **_names(options))
    return _to_dtype(_LinearAttentionFunction.apply(*_widened(q, k, v), options), q.dtype)


def softmax_attention(q, k, v, *, causal=False, scale=None, backend=None):
    """``softmax(q k^T * scale) v`` in tiles (never N x N), same shapes as ``mhla_attention``; in torch ops
    (``torch.nn.functional.scaled_dot_product_attention`` where torch has it) for tensors not on the CPU."""
    _contract.check_tensors(function="mhla::softmax_attention_forward", q=q, k=k, v=v)
    if _pure_torch_path(backend, q, k, v):
        n = q.shape[1] if q.dim() == 4 else 1
        check = _core.Options(_core.Layout.sequence(max(n, 1), max(n, 1)), normalize=False, scale=scale)
        _pure_torch.check_call(q, k, v, q.new_ones(1, 1), check, "mhla::softmax_attention_forward")
        return _pure_torch.softmax_attention(q, k, v, causal=causal, scale=scale)
    return _to_dtype(_SoftmaxAttentionFunction.apply(*_widened(q, k, v), dict(causal=causal, scale=scale)), q.dtype)


# The layers' semantics: the paper's (default), or the authors' public code's, for porting
# their checkpoints (docs/authors-compat.md).
VARIANTS = ("paper", "authors_vision", "authors_video", "authors_lm")


def _initial_mixing(layout, *, causal, init, sigma, threshold):
    """The locality-biased ``[M, M]`` matrix of ``mhla.init_mixing``, as a torch tensor."""
    return from_dlpack(_core.init_mixing(layout, transform=init, sigma=sigma, threshold=threshold, causal=causal))


def _per_head(matrix, heads):
    """A contiguous copy of ``matrix`` to own as a parameter; ``[heads, M, M]`` copies when ``heads`` is given."""
    if heads is None:
        return matrix.clone(memory_format=torch.contiguous_format)
    return matrix.expand(heads, *matrix.shape).clone(memory_format=torch.contiguous_format)


def _corner_size(covered, blocks):
    """The side of the top-left corner a mixing module returns: all ``covered`` blocks, or ``blocks``."""
    m = covered if blocks is None else blocks
    if not 1 <= m <= covered:
        raise ValueError(f"the mixing matrix covers {covered} blocks; {m} were asked for")
    return m


class MixingMatrix(nn.Module):
    """A learnable ``[M, M]`` (or per-head ``[H, M, M]``) mixing matrix that is always valid.

    ``W = softmax(logits)`` along each row (over ``b <= i`` only when causal), so every
    entry is non-negative and every row sums to 1 whatever the optimiser does. The
    logits start at ``log(W0)`` of the locality-biased ``mhla.init_mixing``, with entries
    below ``floor`` raised to it (a zero would be ``-inf`` and could never learn), so the
    initial W is W0 up to that floor. Calling the module with ``blocks=m`` returns the
    top-left ``m x m`` corner, renormalised (shorter sequences in ``MHLA1d``).
    """

    def __init__(self, layout, *, heads=None, causal=False, init="linear", sigma=1.0, threshold=1.5,
                 floor=1e-4):
        super().__init__()
        w0 = _initial_mixing(layout, causal=causal, init=init, sigma=sigma, threshold=threshold)
        self.logits = nn.Parameter(_per_head(torch.log(w0.clamp_min(floor)), heads))
        self.causal = causal
        self.blocks = w0.shape[0]

    def forward(self, blocks=None):
        m = _corner_size(self.blocks, blocks)
        logits = self.logits[..., :m, :m]
        if self.causal:
            above = torch.ones(m, m, dtype=torch.bool, device=logits.device).triu(1)
            logits = logits.masked_fill(above, float("-inf"))
        return torch.softmax(logits, dim=-1)

    def extra_repr(self):
        return f"blocks={self.blocks}, shape={tuple(self.logits.shape)}, causal={self.causal}"


class RMSNorm(nn.Module):
    """``x / rms(x) * weight`` over the last dimension (here: each head's features)."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class FreeMixingMatrix(nn.Module):
    """A mixing matrix that is its own parameter, as in the authors' code (``variant="authors_*"``).

    Unconstrained (``clamp=None``: the vision layers; the operator then runs unnormalised, where any
    sign is allowed), or clamped into ``[low, high]`` whenever it is read (the language-model layer:
    ``(1e-5, 1)``; entries outside get no gradient, as with ``torch.clamp``). It starts at the
    locality-biased ``mhla.init_mixing`` matrix, transposed when ``transpose_init`` (the authors'
    vision init normalises columns where ``init_mixing`` normalises rows).
    """

    def __init__(self, layout, *, heads=None, causal=False, init="linear", sigma=1.0, threshold=1.5,
                 transpose_init=False, clamp=None):
        super().__init__()
        w0 = _initial_mixing(layout, causal=causal, init=init, sigma=sigma, threshold=threshold)
        self.weight = nn.Parameter(_per_head(w0.t() if transpose_init else w0, heads))
        self.clamp = clamp
        self.blocks = w0.shape[0]

    def forward(self, blocks=None):
        m = _corner_size(self.blocks, blocks)
        w = self.weight[..., :m, :m]
        return w if self.clamp is None else w.clamp(*self.clamp)

    def extra_repr(self):
        return f"blocks={self.blocks}, shape={tuple(self.weight.shape)}, clamp={self.clamp}"


def authors_vision_attention(q, k, v, w, layout, *, eps=1e-6, backend=None):
    """The attention of the authors' vision (classification, DiT, video) layers, differentiable.

    Features ``phi(x) = relu(x) + eps``; each query block i reads ``sum_b W[i, b] S_b`` unscaled, and
    the normaliser of the query at position p of block i is ``sum_b W[i, b] phi(q_{b,p})^T z_b + eps``:
    it mixes the queries at the same position p of the other blocks, where the paper (and
    ``mhla_attention``) uses ``phi(q_{i,p})^T sum_b W[i, b] z_b``. Every block must hold the same
    number of tokens, as that code assumes. ``w`` may have any sign (``[M, M]`` or ``[H, M, M]``).
    """
    _contract.check_tensors(function="mhla::forward", q=q, k=k, v=v, w=w)
    blocks, positions, block_size = _block_positions(layout, q.device)
    phi_q, phi_k = torch.relu(q) + eps, torch.relu(k) + eps
    w = w.to(q.dtype)
    numerator = mhla_attention(phi_q, phi_k, v, w, layout, feature_map="identity", normalize=False, scale=1.0,
                               backend=backend)
    batch, tokens, heads, _ = q.shape
    z = phi_k.new_zeros(batch, layout.num_blocks, heads, phi_k.shape[-1]).index_add(1, blocks, phi_k)
    own = (phi_q * z[:, blocks]).sum(-1)  # phi(q_t)^T z_{b(t)}: [B, N, H]
    by_position = _scatter_by_position(own, blocks, positions, layout.num_blocks, block_size)
    mixed = torch.einsum("ib,nbph->niph" if w.dim() == 2 else "hib,nbph->niph", w, by_position) + eps
    return numerator / mixed[:, blocks, positions].unsqueeze(-1)


def authors_video_attention(q, k, v, w, layout, cos, sin, *, eps=1e-6, backend=None):
    """The attention of the authors' video (Wan2.1) layer, differentiable.

    Features ``phi(x) = relu(x) + eps``, then Wan's 3D rotary embedding (``cos``, ``sin`` broadcast
    against ``q [B, N, H, D]``, as diffusers' ``rotary_emb`` or ``_wan_rotary.tables``) on the
    features: each query block i reads ``sum_b W[i, b] S_b`` of ``S_b = sum_{s in b} rot(phi(k_s)) v_s^T``,
    unscaled and with no normaliser. ``w`` may have any sign (``[M, M]`` or ``[H, M, M]``). Half and
    bfloat16 inputs are computed in float32, as their layer does, and come back in their dtype.
    """
    _contract.check_tensors(function="mhla::forward", q=q, k=k, v=v, w=w)
    dtype = q.dtype
    if dtype in (torch.float16, torch.bfloat16):
        q, k, v = q.float(), k.float(), v.float()
    features = [_wan_rotary.rotate(torch.relu(x) + eps, cos, sin) for x in (q, k)]
    o = mhla_attention(*features, v, w.to(q.dtype), layout, feature_map="identity", normalize=False, scale=1.0,
                       backend=backend)
    return o.to(dtype)


def _scatter_by_position(values, blocks, positions, num_blocks, block_size):
    """``values [B, N, H]`` of the tokens laid out as ``[B, M, C, H]`` by (block, position in block)."""
    out = values.new_zeros(values.shape[0], num_blocks, block_size, values.shape[2])
    out[:, blocks, positions] = values
    return out


def block_order(layout):
    """Token indices in block-major order: the authors' vision code holds tokens as ``[B, M, C, dim]``
    (blocks, then tokens inside a block), which is ``x[:, block_order(layout)].view(B, M, C, dim)``
    of this package's row-major ``x [B, N, dim]``; ``y[:, block_order(layout)] = y_theirs.flatten(1, 2)``
    goes back."""
    blocks, _, _ = _block_positions(layout, "cpu")
    return torch.sort(blocks, stable=True).indices


def _block_positions(layout, device):
    """Each token's block and its position inside the block (in token order), on ``device``, and
    the block size; a ValueError unless all blocks hold the same number of tokens. Torch ops and
    Python ints only, so a compiled layer traces it (``layout`` may be a ``Geometry``)."""
    geometry = _pure_torch.Geometry.of(layout)
    axes = slice(3 - geometry.rank, 3)
    grid, tile = geometry.grid[axes], geometry.tile[axes]
    size = geometry.block_size
    if any(g % t for g, t in zip(grid, tile)):
        smallest = math.prod(g % t or t for g, t in zip(grid, tile))
        raise ValueError(f"the authors' normaliser needs blocks of equal size; a {'x'.join(map(str, grid))} grid "
                         f"in {'x'.join(map(str, tile))} tiles has blocks of {smallest} to {size} tokens (make the "
                         "grid a multiple of the tile)")
    # Token t's slot b * size + position: the slot numbers, put in token order.
    slots = _pure_torch.ungroup(torch.arange(geometry.num_blocks * size, device=device).view(1, -1, 1, size, 1),
                                geometry).flatten()
    return slots // size, slots % size, size


class _MHLALayer(nn.Module):
    """What the 1D, 2D and 3D layers share; subclasses give the layout and the positional conv."""

    def __init__(self, dim, heads, *, layout, causal, head_dim=None, qk_norm=False, gate=False, pos_conv=None,
                 per_head_mixing=False, mixing_init="linear", feature_map="elu1", bias=True, variant="paper",
                 backend=None):
        super().__init__()
        _pure_torch_path(backend)  # names an unknown backend now, not at the first forward
        if variant not in VARIANTS:
            raise ValueError(f"unknown variant {variant!r}; expected one of {', '.join(VARIANTS)}")
        if variant == "authors_vision" and causal:
            raise ValueError("variant='authors_vision' is the authors' non-causal vision layer; use 'authors_lm' "
                             "for their causal language-model layer")
        if variant == "authors_lm" and not causal:
            raise ValueError("variant='authors_lm' is the authors' causal language-model layer; pass causal=True")
        if variant == "authors_video" and len(getattr(self, "grid", ())) != 3:
            raise ValueError("variant='authors_video' is the authors' Wan2.1 video layer: build it as MHLA3d")
        if variant == "authors_video" and (qk_norm or gate or pos_conv):
            raise ValueError("variant='authors_video' has its own q/k RMSNorm and SiLU gate and no positional "
                             "conv; drop qk_norm, gate and pos_conv")
        if dim <= 0 or heads <= 0:
            raise ValueError(f"dim and heads must be positive, got dim={dim}, heads={heads}")
        if head_dim is None:
            if dim % heads != 0:
                raise ValueError(f"dim={dim} is not divisible by heads={heads}; pass head_dim")
            head_dim = dim // heads
        if pos_conv is not None and (not isinstance(pos_conv, int) or pos_conv <= 0 or pos_conv % 2 == 0):
            raise ValueError(f"pos_conv is the kernel size of the positional conv: a positive odd int, got {pos_conv!r}")
        inner = heads * head_dim
        self.dim, self.heads, self.head_dim = dim, heads, head_dim
        self.feature_map = feature_map
        self.masking = "causal" if causal else "none"
        self.q_proj = nn.Linear(dim, inner, bias=bias)
        self.k_proj = nn.Linear(dim, inner, bias=bias)
        self.v_proj = nn.Linear(dim, inner, bias=bias)
        self.out_proj = nn.Linear(inner, dim, bias=bias)
        self.q_norm = RMSNorm(head_dim) if qk_norm else None
        self.k_norm = RMSNorm(head_dim) if qk_norm else None
        self.gate_proj = nn.Linear(dim, inner, bias=bias) if gate else None
        self.pos_conv = self._make_pos_conv(inner, pos_conv) if pos_conv else None
        self.variant = variant
        self.backend = backend
        self.normalize = variant not in ("authors_lm", "authors_video")
        mixing_heads = heads if per_head_mixing else None
        if variant == "paper":
            self.mixing = MixingMatrix(layout, heads=mixing_heads, causal=causal, init=mixing_init)
        elif variant in ("authors_vision", "authors_video"):
            self.feature_map = "relu+eps"
            self.mixing = FreeMixingMatrix(layout, heads=mixing_heads, init=mixing_init, transpose_init=True)
            if variant == "authors_video":
                self._build_authors_video(dim, inner, bias)
        else:
            self.mixing = FreeMixingMatrix(layout, heads=mixing_heads, causal=True, init=mixing_init,
                                           clamp=(1e-5, 1.0))

    def _build_authors_video(self, dim, inner, bias):
        # Their q/k RMSNorm spans the whole width; the output is RMS-normalised per head, then
        # SiLU-gated. The rotary tables are Wan's for the layer's grid (float64; cast where used).
        self.q_norm, self.k_norm = RMSNorm(inner), RMSNorm(inner)
        self.gate_proj = nn.Linear(dim, inner, bias=bias)
        self.out_norm = RMSNorm(self.head_dim)
        cos, sin = _wan_rotary.tables(self.grid, self.head_dim)
        self.register_buffer("rotary_cos", cos.unsqueeze(1), persistent=False)
        self.register_buffer("rotary_sin", sin.unsqueeze(1), persistent=False)

    def forward(self, x):
        self._check_input(x)
        batch, tokens, _ = x.shape
        q, k, v = self._project(x)
        if _pure_torch_path(self.backend, x) and self.variant in ("paper", "authors_lm"):
            # In torch ops on plain Python values, so torch.compile traces the whole layer. The
            # operator's checks are not needed: the layer makes q, k, v and w consistent itself.
            geometry = self._geometry(tokens)
            o = _pure_torch.mhla_attention(q, k, v, self.mixing(geometry.num_blocks), geometry,
                                           masking=self.masking, feature_map=self.feature_map,
                                           normalize=self.normalize)
        else:
            # Compiled, the operator takes the layout as plain values.
            layout = self._geometry(tokens) if _pure_torch.compiling() else self._layout(tokens)
            o = self.attend(q, k, v, self.mixing(layout.num_blocks), layout)
        o = o.reshape(batch, tokens, -1)
        if self.pos_conv is not None:
            o = o + self._positional(v.reshape(batch, tokens, -1))
        return self._output(x, o)

    def _check_input(self, x):
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.dim:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"{type(self).__name__} expects x of shape [B, N, {self.dim}], got {shape}")

    def _project(self, x):
        """q, k, v ``[B, N, H, D]`` of ``x [B, N, dim]`` (with the q/k norms)."""
        split = (*x.shape[:2], self.heads, self.head_dim)
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.variant == "authors_video":
            return self.q_norm(q).view(split), self.k_norm(k).view(split), v.view(split)
        q, k, v = q.view(split), k.view(split), v.view(split)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v

    def _output(self, x, o):
        """The gate and the output projection of the attention result ``o [B, N, H * D]``."""
        if self.variant == "authors_video":
            o = self.out_norm(o.unflatten(-1, (self.heads, self.head_dim))).flatten(2) * F.silu(self.gate_proj(x))
        elif self.gate_proj is not None:
            o = o * torch.sigmoid(self.gate_proj(x))
        return self.out_proj(o)

    def attend(self, q, k, v, w, layout):
        """The attention step: ``[B, N, H, D]`` in and out. The operator's, here."""
        if self.variant == "authors_vision":
            return authors_vision_attention(q, k, v, w, layout, backend=self.backend)
        if self.variant == "authors_video":
            return authors_video_attention(q, k, v, w, layout, self.rotary_cos, self.rotary_sin, backend=self.backend)
        return mhla_attention(q, k, v, w, layout, masking=self.masking, feature_map=self.feature_map,
                              normalize=self.normalize, backend=self.backend)

    def _positional(self, v):
        # Depthwise conv over the token grid, channels first: [B, N, C] -> [B, C, *grid] and back.
        grid = self._grid(v.shape[1])
        out = self.pos_conv(v.transpose(1, 2).reshape(v.shape[0], v.shape[2], *grid))
        return out.flatten(2).transpose(1, 2)


class MHLA1d(_MHLALayer):
    """MHLA over sequences of up to ``max_tokens`` tokens in blocks of ``block_size``.

    ``causal=True`` makes token t read only tokens s <= t (language models); the
    positional conv then looks only backwards. Shorter sequences use the top-left
    corner of the mixing matrix, which for a causal layer is exactly the prefix.
    """

    def __init__(self, dim, heads, *, block_size, max_tokens, causal=False, **options):
        if block_size <= 0 or max_tokens <= 0:
            raise ValueError(f"block_size and max_tokens must be positive, got {block_size} and {max_tokens}")
        self.block_size, self.max_tokens = block_size, max_tokens
        super().__init__(dim, heads, layout=_core.Layout.sequence(max_tokens, block_size), causal=causal,
                         **options)

    def _geometry(self, tokens):
        if not 1 <= tokens <= self.max_tokens:
            raise ValueError(f"MHLA1d was built for 1..{self.max_tokens} tokens, got {tokens}")
        return _pure_torch.Geometry.sequence(tokens, self.block_size)

    def _layout(self, tokens):
        self._geometry(tokens)
        return _core.Layout.sequence(tokens, self.block_size)

    def new_cache(self, batch=1):
        """A cache for generating ``batch`` sequences token by token with ``decode``.

        It holds a float32 copy of the current mixing matrix: make a new cache after the weights change.
        """
        if self.masking != "causal":
            raise ValueError("MHLA1d.new_cache needs a causal layer (causal=True): decoding reads no later tokens")
        with torch.no_grad():
            w = self.mixing().to(torch.float32).contiguous()
        # The state lives where the layer's weights are (the C++ decoder's for CPU weights).
        backend = self.backend if self.backend is not None else ("torch" if w.device.type != "cpu" else "cpp")
        decoder = Decoder(w, heads=self.heads, dk=self.head_dim, dv=self.head_dim, block=self.block_size,
                          batch=batch, feature_map=self.feature_map, normalize=self.normalize, backend=backend)
        return MHLA1dCache(decoder)

    @torch.no_grad()
    def decode(self, x, cache):
        """The next tokens ``x [B, T, dim]`` of every sequence in ``cache``; returns ``[B, T, dim]``.

        The result equals ``forward`` on each whole sequence so far, at the new positions, at
        O(1) cost per token (a prompt on empty sequences is prefilled in blocks). The attention
        runs in float32, as the decoder does.
        """
        self._check_input(x)
        if not isinstance(cache, MHLA1dCache):
            raise TypeError(f"cache must come from new_cache(), not {type(cache).__name__}")
        batch, tokens, _ = x.shape
        if batch != cache.batch:
            raise ValueError(f"the cache holds {cache.batch} sequences, x has {batch}")
        if tokens == 0:
            raise ValueError(f"MHLA1d.decode needs at least one new token per sequence; x has shape {tuple(x.shape)}")
        q, k, v = self._project(x)
        q32, k32, v32 = (t.to(torch.float32).contiguous() for t in (q, k, v))
        decoder = cache.decoder
        if tokens > 1 and all(decoder.position(s) == 0 for s in range(batch)):
            parts = [decoder.prefill(s, q32[s:s + 1], k32[s:s + 1], v32[s:s + 1]) for s in range(batch)]
            o = torch.cat(parts, dim=0)
        else:
            token = [[t[:, i:i + 1].contiguous() for t in (q32, k32, v32)] for i in range(tokens)]
            parts = [decoder.step(*qkv) for qkv in token]
            o = torch.cat(parts, dim=1)
        o = o.to(x.dtype).reshape(batch, tokens, -1)
        if self.pos_conv is not None:
            o = o + cache.positional(self.pos_conv, v.reshape(batch, tokens, -1))
        return self._output(x, o)

    def _grid(self, tokens):
        return (tokens,)

    def _make_pos_conv(self, channels, kernel):
        # Causal: pad on the left only, so position t sees t-kernel+1 .. t.
        return _CausalConv1d(channels, kernel) if self.masking == "causal" else \
            nn.Conv1d(channels, channels, kernel, padding=kernel // 2, groups=channels)


class MHLA1dCache:
    """What a causal ``MHLA1d`` keeps between ``decode`` calls: the attention's streaming decoder
    (``mhla.Decoder``) and the last inputs of the causal positional conv, per sequence."""

    def __init__(self, decoder):
        self.decoder = decoder
        self._history = None  # [B, channels, kernel - 1], zeros before the first token (the conv's padding)

    @property
    def batch(self):
        return self.decoder.options.batch

    def position(self, seq=0):
        """Tokens seen by sequence ``seq``."""
        return self.decoder.position(seq)

    def reset(self, seq):
        """Empties sequence ``seq``; the others keep their state."""
        self.decoder.reset(seq)
        if self._history is not None:
            self._history[seq].zero_()

    def positional(self, conv, v):
        """The causal depthwise conv of ``v [B, T, channels]`` continuing the history; ``[B, T, channels]``."""
        v = v.transpose(1, 2)
        if self._history is None:
            self._history = v.new_zeros(v.shape[0], v.shape[1], conv.kernel_size[0] - 1)
        window = torch.cat([self._history.to(v.dtype), v], dim=2)
        out = F.conv1d(window, conv.weight, conv.bias, groups=conv.groups)
        self._history = window[:, :, window.shape[2] - self._history.shape[2]:]
        return out.transpose(1, 2)


class _CausalConv1d(nn.Conv1d):
    def __init__(self, channels, kernel):
        super().__init__(channels, channels, kernel, groups=channels)

    def forward(self, x):
        return super().forward(F.pad(x, (self.kernel_size[0] - 1, 0)))


class _GridLayer(_MHLALayer):
    """A layer over a fixed token grid; subclasses name the axes, the Layout factory and the conv."""

    def __init__(self, dim, heads, *, grid, tile, **options):
        self.grid = tuple(grid)
        rank = len(self._axes)
        if len(self.grid) != rank or len(tuple(tile)) != rank:
            axes = ", ".join(self._axes)
            tiles = ", ".join("t" + a.lower() for a in self._axes)
            raise ValueError(f"{type(self).__name__} needs grid=({axes}) and tile=({tiles}), got {grid} and {tile}")
        self.layout = type(self)._make_layout(*self.grid, *tile)
        self.geometry = _pure_torch.Geometry.of(self.layout)
        super().__init__(dim, heads, layout=self.layout, causal=False, **options)

    def _geometry(self, tokens):
        if tokens != self.geometry.num_tokens:
            raise ValueError(f"{type(self).__name__} was built for a {'x'.join(map(str, self.grid))} grid "
                             f"({self.geometry.num_tokens} tokens), got {tokens} tokens")
        return self.geometry

    def _layout(self, tokens):
        self._geometry(tokens)
        return self.layout

    def _grid(self, tokens):
        return self.grid

    def _make_pos_conv(self, channels, kernel):
        return self._conv(channels, channels, kernel, padding=kernel // 2, groups=channels)


class MHLA2d(_GridLayer):
    """MHLA over a ``grid = (H, W)`` of image tokens (row-major) in tiles ``tile = (th, tw)``.

    Any grid works, square or not, divisible by the tile or not (edge tiles are
    smaller). ``pos_conv=k`` adds a depthwise ``k x k`` conv of v (LePE-style).
    """

    _axes = ("H", "W")
    _make_layout = _core.Layout.grid2d
    _conv = nn.Conv2d


class MHLA3d(_GridLayer):
    """MHLA over video tokens on a ``grid = (T, H, W)`` in tiles ``tile = (tt, th, tw)``."""

    _axes = ("T", "H", "W")
    _make_layout = _core.Layout.grid3d
    _conv = nn.Conv3d
