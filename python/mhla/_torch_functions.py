"""``mhla.torch``'s functions ``mhla_attention``, ``varlen_attention``, ``linear_attention``,
``softmax_attention`` and the finite-result check's settings (see ``mhla.torch``). Each call follows
its ``_plan.plan``: the C++ operator (``_operators``, or its custom op in compiled regions) or the
plain-torch path."""
import torch
from torch.utils.dlpack import from_dlpack

from . import _contract, _core, _custom_ops, _finite_results, _operators, _plan
from ._torch_forms import chunk, lean
from ._torch_operands import operand as _operand
from .streaming import offsets


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


def _needs_grad(*tensors):
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


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


# Reduced-precision inputs the baselines and varlen do not take (bfloat16 and
# float16) are widened to float32 (differentiably, so their gradients come
# back in their own dtype), and the output is rounded back to q's dtype, by
# the extension's (widen, narrow) pair for each reduced dtype. mhla_attention
# hands both to the operator itself.
_WIDENED = {
    torch.bfloat16: (_core.bfloat16_to_float32, _core.float32_to_bfloat16),
    torch.float16: (_core.float16_to_float32, _core.float32_to_float16),
}


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


def _crossing(plan, *tensors):
    """The tensors in the plan's operand dtype, reduced ones widened by the extension."""
    if plan.operand_dtype == torch.float32:
        return tuple(_to_float32(t) for t in tensors)
    return tuple(t.to(plan.operand_dtype) for t in tensors)


def mhla_attention(q, k, v, w, layout, *, masking=None, feature_map=None, normalize=None, eps=None,
                   scale=None, mixing=None, backend=None, cuda_kernels=None):
    """MHLA of ``q, k [B, N, H, Dk]`` and ``v [B, N, H, Dv]`` with mixing ``w``; returns ``[B, N, H, Dv]``.

    ``w`` is ``[M, M]`` (shared) or ``[H, M, M]`` (per head), or with ``mixing="toeplitz"``
    ``[L + 1]`` / ``[H, L + 1]``; it is cast to q's dtype (float32 for bfloat16 and float16 q). ``layout`` is an ``mhla.Layout``.
    Options left as None take the operator's defaults (``mhla.Options``); enums may be given by name.
    ``backend``: None runs CPU tensors on the C++ operator and others in torch ops; "cpp" or "torch"
    chooses. ``cuda_kernels`` names the CUDA kernel families the C++ operator may run this call on
    (any of "bf16_state", "float16_tensor_cores", "float32_tensor_cores"; ``mhla.CudaKernels``);
    CPU calls and the torch path ignore it. A CUDA call that names neither runs where the measured
    table (``mhla._cuda_dispatch``, written by bench/gpu_check.py on a GPU) says it is fastest: no
    GPU has written it yet, so such calls take the torch path.
    """
    _contract.check_tensors(function="mhla::forward", q=q, k=k, v=v, w=w)
    plan = _plan.plan("mhla", (q, k, v, w), backend=backend,
                      cuda_kernels=None if cuda_kernels is None else _plan.cuda_kernel_bits(cuda_kernels),
                      needs_grad=_needs_grad(q, k, v, w), masking=_option_names(masking=masking)["masking"])
    if chunk.compiling():
        # No extension object can be built in a compiled region: the options go on as names.
        names = _option_names(masking=masking, feature_map=feature_map, normalize=normalize, eps=eps, scale=scale,
                              mixing=mixing)
        geometry = chunk.Geometry.of(layout)
        if plan.path == "torch":
            return chunk.mhla_attention(q, k, v, w, geometry, **names)
        if plan.path == "custom_op":  # the operator checks the call when the op runs
            return _custom_ops.mhla_attention(q, k, v, w, geometry, plan, **names, cuda_kernels=plan.cuda_kernels)
        # Before torch 2.4 the extension call below breaks the graph.
    # Built once: forward and backward get the same object, not strings to parse again.
    options = _core.Options(layout, masking=masking, feature_map=feature_map, normalize=normalize, eps=eps,
                            scale=scale, mixing=mixing, cuda=_operators.cuda_kernels_of(plan.cuda_kernels))
    if plan.path == "torch":
        chunk.check_call(q, k, v, w, options)
        return lean.mhla_attention(q, k, v, w, layout, **chunk.keywords(options))
    # bfloat16 and float16 q, k, v run on the operator's own 16-bit paths (float32 w and saved summaries).
    o = _operators.MHLA(*_crossing(plan, q, k, v), w.to(plan.w_dtype), settings=options)
    return _to_dtype(o, q.dtype)


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
    plan = _plan.plan("varlen", (q, k, v, w), backend=backend)
    if plan.path == "custom_op":
        return _custom_ops.varlen_attention(q, k, v, w, offsets(cu_seqlens), plan, block=block, **_option_names(
            mixing=mixing, masking=masking, feature_map=feature_map, normalize=normalize, eps=eps, scale=scale))
    options = dict(block=block, mixing=mixing, masking=masking, feature_map=feature_map, normalize=normalize,
                   eps=eps, scale=scale)
    if plan.path == "torch":
        return lean.varlen_attention(q, k, v, w, offsets(cu_seqlens), **options)
    return _to_dtype(_operators.VARLEN(*_crossing(plan, q, k, v), w.to(plan.w_dtype),
                                       settings=(offsets(cu_seqlens), options)), q.dtype)


def linear_attention(q, k, v, *, masking=None, feature_map=None, normalize=None, eps=None, scale=None,
                     backend=None):
    """Vanilla linear attention (one global summary; MHLA with a single block), same shapes as ``mhla_attention``."""
    _contract.check_tensors(function="mhla::linear_attention_forward", q=q, k=k, v=v)
    plan = _plan.plan("linear", (q, k, v), backend=backend)
    if plan.path == "custom_op":
        return _custom_ops.linear_attention(q, k, v, plan, **_option_names(
            masking=masking, feature_map=feature_map, normalize=normalize, eps=eps, scale=scale))
    options = _core.LinearOptions(masking=masking, feature_map=feature_map, normalize=normalize, eps=eps,
                                  scale=scale)
    if plan.path == "torch":
        n = q.shape[1] if q.dim() == 4 else 1
        check = _core.Options(_core.Layout.sequence(max(n, 1), max(n, 1)), masking=options.masking,
                              feature_map=options.feature_map, normalize=options.normalize, eps=options.eps,
                              scale=options.scale)
        chunk.check_call(q, k, v, q.new_ones(1, 1), check, "mhla::linear_attention_forward")
        return lean.linear_attention(q, k, v, **chunk.keywords(options))
    return _to_dtype(_operators.LINEAR(*_crossing(plan, q, k, v), settings=options), q.dtype)


def softmax_attention(q, k, v, *, causal=False, scale=None, backend=None):
    """``softmax(q k^T * scale) v`` in tiles (never N x N), same shapes as ``mhla_attention``; in torch ops
    (``torch.nn.functional.scaled_dot_product_attention`` where torch has it) for tensors not on the CPU."""
    _contract.check_tensors(function="mhla::softmax_attention_forward", q=q, k=k, v=v)
    plan = _plan.plan("softmax", (q, k, v), backend=backend)
    if plan.path == "custom_op":
        return _custom_ops.softmax_attention(q, k, v, plan, causal=causal, scale=scale)
    if plan.path == "torch":
        n = q.shape[1] if q.dim() == 4 else 1
        check = _core.Options(_core.Layout.sequence(max(n, 1), max(n, 1)), normalize=False, scale=scale)
        chunk.check_call(q, k, v, q.new_ones(1, 1), check, "mhla::softmax_attention_forward")
        return chunk.softmax_attention(q, k, v, causal=causal, scale=scale)
    return _to_dtype(_operators.SOFTMAX(*_crossing(plan, q, k, v), settings=dict(causal=causal, scale=scale)),
                     q.dtype)
