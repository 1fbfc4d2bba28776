"""The chunked form (``chunk``) in the fewest torch ops: the path ``mhla.torch`` runs in plain
torch, outside compiled regions. Each op is a kernel launch on a GPU and a pass over its
tensors, so the forward and the backward are written by hand as one autograd Function
(bench/torch_op_count.py counts them):

- q's and k's blocks are read as strided views of the tokens by the feature map's first ops,
  which write phi into one buffer (no copy of the tokens first); its last op runs on both;
- phi's derivative multiplies the gradient as it is written to grad_q and grad_k in token
  order;
- v is regrouped with a column of ones, so that the normalisers ride along every product:
  ``phi(K_b)^T [V_b | 1]`` is ``[S_b | z_b]``, one mix mixes both, and ``phi(q) [S~ | z~]``
  gives the numerators and the denominators together;
- the read-out ``y * (1 / (den + eps))``, the C++ operator's, writes o in token order;
- the unnormalised scale rides on w (``M x M`` or ``L + 1`` entries, not ``N x Dv``);
- the mix's gradient is two products by hand for a shared dense W, and autograd's on the mix
  redone in the backward for every other form of w (Toeplitz, per head), so that those are
  differentiated by the code that mixes them;
- the finite-result checks take one reduction per call and per backward on a GPU (one
  ``_foreach_norm`` for the group of tensors, ``_finite_results``).

A backward asked for a graph of its own (``create_graph=True``) differentiates ``chunk``'s
form instead, which torch differentiates again. The answers are ``chunk``'s up to rounding
(python/tests/test_torch_forms.py compares them in float64 on every mode).
"""
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from . import chunk
from .. import _core, _finite_results
from .chunk import Geometry


class Call(NamedTuple):
    """One call's settings, as plain values."""
    geometry: Geometry
    masking: str
    feature_map: str
    normalize: bool
    eps: float
    scale: object  # a float, or None for 1 / sqrt(Dk)
    mixing: str
    function: str


def _features(views, feature_map, dtype):
    """phi of q's and k's blocks (``views``, strided views of the tokens) in one new buffer
    ``[2, *shape]`` of ``dtype`` (``chunk.feature``'s values: exp(min(x, 0)) + max(x, 0) for
    "elu1"). Its first ops read the views and write the buffer, with no copy of the tokens first;
    tokens of another dtype are copied into the buffer first (an ``out=`` op writes its inputs'
    dtype only), and phi's ops then run on the whole buffer in place."""
    phi = torch.empty((2,) + views[0].shape, dtype=dtype, device=views[0].device)
    if views[0].dtype != dtype or feature_map == "identity":
        for x, out in zip(views, phi):
            out.copy_(x)
        sources, parts = (phi,), lambda buffer: (buffer,)
    else:
        sources, parts = views, tuple
    if feature_map == "elu1":
        below = torch.empty_like(phi)
        for x, out in zip(sources, parts(below)):
            torch.clamp(x, max=0, out=out)
        below.exp_()
    if feature_map != "identity":
        for x, out in zip(sources, parts(phi)):
            torch.clamp(x, min=0, out=out)
    if feature_map == "elu1":
        phi.add_(below)
    return phi


def _feature_derivative(phi, feature_map):
    """phi's derivative from its values, None for "identity": elu1's is exp(x) = phi below 0 and
    1 above (``min(phi, 1)``), relu's 1 where phi > 0 (0 at 0, as torch's relu)."""
    if feature_map == "elu1":
        return phi.clamp(max=1)
    if feature_map == "relu":
        return phi > 0
    return None


def _block_major(x9, lead):
    """``block_view``'s ``[*lead, B, c0, c1, c2, H, t0, t1, t2, D]`` with B moved after the block
    counts: ``[*lead, c0, c1, c2, B, H, t0, t1, t2, D]``, the order of this module's block-major
    tensors ``[*lead, M, B, H, C, D]``, whose summaries ``[M, B H Dk E]`` w mixes in one product
    for any batch size."""
    first = len(lead)
    return x9.permute(*range(first), first + 1, first + 2, first + 3, first, *range(first + 4, first + 9))


def _blocks(x, geometry, lead=()):
    """``[*lead, B, N, H, D]`` in block-major order, a view (of a padded copy when ragged)."""
    return _block_major(chunk.block_view(x, geometry), lead)


def _nine(x, geometry, lead=()):
    """A contiguous block-major ``[*lead, M, B, H, C, E]`` tensor (any view of it with those
    elements) as the nine-dim shape ``_blocks`` gives."""
    b, h, e = x.shape[-4], x.shape[-3], x.shape[-1]
    return x.view(*lead, *geometry.counts, b, h, *geometry.tile, e)


def _tokens(write, lead, b, h, d, geometry, dtype, device):
    """A new ``[*lead, B, N, H, D]`` tensor whose tokens ``write(view)`` fills through the
    block-major nine-dim view (one strided write)."""
    return chunk.tokens_from_blocks(lambda view: write(_block_major(view, lead)), (*lead, b), h, d, geometry, dtype,
                                    device)


def _mix(s, w, call, m, b, h):
    """The mixed summaries ``[M, B, H, E]`` of s ``[M, B, H, E]`` (contiguous): one product for a
    shared dense w, ``chunk.mix`` on a [B, M, ...] view for the other forms."""
    if call.mixing == "dense" and w.dim() == 2:
        return torch.mm(chunk.read_by_masking(w.to(s.dtype), call.masking), s.view(m, -1)).view_as(s)
    return chunk.mix(s.transpose(0, 1), w, call.masking, call.mixing).transpose(0, 1)


class Saved(NamedTuple):
    """What the backward reads of a forward: intermediates of its own making (autograd frees them
    after the backward, as it frees any saved tensor)."""
    phi: torch.Tensor           # [2, M B H, C, Dk]: phi(q), phi(k)
    v1: torch.Tensor            # [M B H, C, E]: v and the column of ones
    summaries: torch.Tensor     # [M B H, Dk, E]
    mixed: torch.Tensor         # [M B H, Dk, E]: the summaries mixed
    y: torch.Tensor             # [M B H, C, E]: the read-out's numerators and denominators
    r: torch.Tensor             # [M B H, C]: 1 / (den + eps), None unnormalised
    scores: torch.Tensor        # [M B H, C, C]: the causal in-block scores, masked; None otherwise


def _dtypes(dtype, device):
    """The products' dtype and the sums' (float32 for bfloat16 products)."""
    compute = chunk.compute_dtype(dtype, device)
    return compute, torch.float32 if compute == torch.bfloat16 else compute


def _mixing(w, call, wide, device, dk):
    """w in the sums' dtype on the call's device, times the unnormalised scale."""
    if w.dtype != wide or w.device != device:
        w = w.to(device=device, dtype=wide)
    return w if call.normalize else w * (1.0 / math.sqrt(dk) if call.scale is None else call.scale)


def _forward(q, k, v, w, call, mixing_check):
    """o, and what the backward reads (``Saved``); ``mixing_check`` is ``chunk.check_w``'s."""
    g = call.geometry
    dtype = q.dtype
    compute, wide = _dtypes(dtype, q.device)
    b, _, h, dk = q.shape
    dv = v.shape[-1]
    m, size = g.num_blocks, g.block_size
    mbh = m * b * h
    causal, normalize = call.masking == "causal", call.normalize
    valid = chunk.cached_slot_valid(g, q.device)

    # phi(q) and phi(k) in blocks, in one buffer [2, M B H, C, Dk].
    phi = _features((_blocks(q, g), _blocks(k, g)), call.feature_map, compute).view(2, mbh, size, dk)
    phi_q, phi_k = phi[0], phi[1]

    # v in blocks [M B H, C, E], normalised with a column of ones (zero at padding slots).
    e = dv + 1 if normalize else dv
    v_view = _blocks(v, g)
    if normalize and dtype == compute:
        v1 = F.pad(v_view, (0, 1), value=1.0)
    else:
        v1 = torch.empty(*v_view.shape[:-1], e, dtype=compute, device=q.device)
        v1[..., :dv].copy_(v_view)
        if normalize:
            v1[..., dv].fill_(1)
    v1 = v1.view(mbh, size, e)
    if normalize and valid is not None:
        v1.view(m, b, h, size, e)[..., dv].mul_(valid.view(m, 1, 1, size))

    summaries = torch.bmm(phi_k.transpose(1, 2), v1)  # [S_b | z_b]: [M B H, Dk, E]
    w = _mixing(w.detach(), call, wide, q.device, dk)
    mixed = _mix(summaries.view(m, b, h, dk * e), w, call, m, b, h).reshape(mbh, dk, e)
    y = torch.bmm(phi_q, mixed)
    scores = None
    if causal:
        # Within block i, W[i, i] phi(q_t) . phi(k_j) for j <= t, in [C, C] scores per block.
        scores = torch.bmm(phi_q, phi_k.transpose(1, 2))
        factor = _diagonal_factor(chunk.diagonal(w, call.mixing, m), m, h, compute)
        scores.view(m, b, h, size, size).mul_(chunk.triangle(size, q.device) * factor)
        y.baddbmm_(scores, v1)

    y9 = _nine(y.view(m, b, h, size, e), g)
    if normalize:
        divisor = y[..., dv].to(wide) + call.eps
        if valid is not None:  # padding rows divide by at least 1: no 0 / 0 reaches a gradient
            divisor.view(m, b, h, size).add_((~valid).view(m, 1, 1, size))
        r = divisor.reciprocal()
        r9 = _nine(r.view(m, b, h, size, 1), g)

        def read_out(view):  # o = y * (1 / (den + eps)), written in token order
            torch.mul(y9[..., :dv], r9, out=view)

        o = _tokens(read_out, (), b, h, dv, g, dtype, q.device)
    else:
        divisor = r = r9 = None
        o = _tokens(lambda view: view.copy_(y9), (), b, h, dv, g, dtype, q.device)

    def denominator_entry():  # the read-out in the products' dtype, before o's rounding
        return chunk.read_out_entry(_tokens(read_out, (), b, h, dv, g, compute, q.device))

    _finite_results.check_results(
        {"o": o}, dict(q=q, k=k, v=v),
        chunk.non_finite_message(call.function, call.feature_map, normalize, call.eps, dk, dtype),
        denominator=(divisor, r) if normalize else (), earlier=False,
        denominator_entry=denominator_entry if normalize else None, mixing=mixing_check)
    return o, Saved(phi, v1, summaries, mixed, y, r, scores)


def _diagonal_factor(diag, m, h, dtype):
    """W's diagonal (``chunk.diagonal``) as a factor of [M, B, H, ., .] tensors: ``[M, 1, 1 or H, 1, 1]``."""
    return chunk.block_diagonal(diag, m, h).transpose(0, 1).to(dtype)


def _backward(q, k, v, w, o, grad_o, saved, call, needs):
    g = call.geometry
    compute, wide = _dtypes(q.dtype, q.device)
    phi, v1 = saved.phi, saved.v1
    phi_q, phi_k = phi[0], phi[1]
    b, _, h, dk = q.shape
    dv = v.shape[-1]
    m, size = g.num_blocks, g.block_size
    mbh, e = m * b * h, v1.shape[-1]
    causal = call.masking == "causal"

    # The gradient of [y | den]: (grad_o r | -(grad_o r . y) r), in blocks [M B H, C, E]; y, not
    # o, whose rounding to a 16-bit dtype would not cancel in grad_q as y does.
    grad_y = torch.empty(mbh, size, e, dtype=compute, device=q.device)
    grad_y9 = _nine(grad_y.view(m, b, h, size, e), g)
    grad_o9 = _blocks(grad_o, g)
    if call.normalize:
        torch.mul(grad_o9, _nine(saved.r.view(m, b, h, size, 1), g), out=grad_y9[..., :dv])
        dot = (grad_y[..., :dv] * saved.y[..., :dv]).sum(-1)
        torch.mul(dot, saved.r, out=grad_y[..., dv]).neg_()
    else:
        grad_y9.copy_(grad_o9)

    grad_mixed = torch.bmm(phi_q.transpose(1, 2), grad_y)  # [M B H, Dk, E]
    grad_phi = torch.empty_like(phi)
    torch.bmm(grad_y, saved.mixed.transpose(1, 2), out=grad_phi[0])
    diag_grad = None
    if causal:
        diag = chunk.diagonal(_mixing(w.detach(), call, wide, q.device, dk), call.mixing, m)
        scores, factor = saved.scores, _diagonal_factor(diag, m, h, compute)
        grad_scores = torch.bmm(grad_y, v1.transpose(1, 2)).view(m, b, h, size, size)
        grad_scores.mul_(chunk.triangle(size, q.device))
        # W[i, i]'s gradient, sum phi(q_t) . ((grad_scores o triangle) phi(K))_t, and phi(q)'s term.
        across = torch.bmm(grad_scores.view(mbh, size, size), phi_k)
        per_head = diag.dim() == 2
        diag_grad = torch.sum((across * phi_q).view(m, b, h, size * dk), dim=(1, 3) if per_head else (1, 2, 3),
                              dtype=wide)
        diag_grad = diag_grad.t() if per_head else diag_grad
        grad_phi[0].view(m, b, h, size, dk).addcmul_(across.view(m, b, h, size, dk), factor)
        # phi(k)'s term (W[i, i] grad_scores)^T phi(q), with W[i, i] scaling phi(q), C x Dk a block,
        # not the C x C scores.
        scaled_q = (phi_q.view(m, b, h, size, dk) * factor).view(mbh, size, dk)
    grad_s, grad_w = _mix_gradients(grad_mixed.view(m, b, h, dk * e), saved.summaries.view(m, b, h, dk * e), w,
                                    diag_grad, call, wide, dk)
    grad_s = grad_s.reshape(mbh, dk, e)
    torch.bmm(v1, grad_s.transpose(1, 2), out=grad_phi[1])
    grad_v1 = torch.bmm(phi_k, grad_s)
    if causal:
        grad_phi[1].baddbmm_(grad_scores.view(mbh, size, size).transpose(1, 2), scaled_q)
        grad_v1.baddbmm_(scores.transpose(1, 2), grad_y)

    def write_grad_qk(view):  # grad_phi times phi's derivative, written in token order
        grad_phi9 = _nine(grad_phi.view(2, m, b, h, size, dk), g, (2,))
        derivative = _feature_derivative(phi, call.feature_map)
        if derivative is None:
            view.copy_(grad_phi9)
        else:
            torch.mul(grad_phi9, _nine(derivative.view(2, m, b, h, size, dk), g, (2,)), out=view)

    grad_qk = _tokens(write_grad_qk, (2,), b, h, dk, g, q.dtype, q.device) if needs[0] or needs[1] else None
    grad_v = _tokens(lambda view: view.copy_(_nine(grad_v1.view(m, b, h, size, e), g)[..., :dv]), (), b, h, dv, g,
                     v.dtype, v.device) if needs[2] else None
    grads = [grad_qk[0] if needs[0] else None, grad_qk[1] if needs[1] else None, grad_v,
             grad_w.to(w.dtype) if needs[3] else None]
    backward = call.function.replace("forward", "backward")
    given = {name: t for name, t in zip(("grad_q", "grad_k", "grad_v", "grad_w"), grads) if t is not None}
    if given:
        _finite_results.check_results(
            given, dict(q=q, k=k, v=v, o=o, grad_o=grad_o),
            chunk.non_finite_message(backward, call.feature_map, call.normalize, call.eps, dk, q.dtype))
    return grads


def _mix_gradients(grad_mixed, summaries, w, diag_grad, call, wide, dk):
    """The gradients of the summaries ``[M, B, H, E]`` and of w from the mixed summaries' and (causal)
    from W's diagonal's, ``diag_grad``: by hand for a shared dense W (two products), by autograd on
    the mix redone for every other form of w."""
    m, b, h = summaries.shape[:3]
    if call.mixing == "dense" and w.dim() == 2:
        w_eff = _mixing(w.detach(), call, wide, summaries.device, dk)
        flat = grad_mixed.reshape(m, -1)
        grad_s = torch.mm(chunk.read_by_masking(w_eff.to(flat.dtype), call.masking).t(), flat)
        grad_w = chunk.read_by_masking(torch.mm(flat, summaries.reshape(m, -1).t()), call.masking).to(wide)
        if diag_grad is not None:
            grad_w.diagonal().add_(diag_grad)
        if not call.normalize:
            grad_w = grad_w * (1.0 / math.sqrt(dk) if call.scale is None else call.scale)
        return grad_s.view_as(summaries), grad_w
    with torch.enable_grad():
        s_req = summaries.detach().requires_grad_()
        w_req = w.detach().requires_grad_()
        w_eff = _mixing(w_req, call, wide, summaries.device, dk)
        outputs, grads = [_mix(s_req, w_eff, call, m, b, h)], [grad_mixed]
        if diag_grad is not None:
            outputs.append(chunk.diagonal(w_eff, call.mixing, m))
            grads.append(diag_grad)
    # A mix may read no summary (Toeplitz causal with one block): no graph reaches it, its gradient is 0.
    return (torch.zeros_like(x) if grad is None else grad for x, grad in zip(
        (s_req, w_req), torch.autograd.grad(outputs, (s_req, w_req), grads, allow_unused=True)))


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, w, call, mixing_check):
        o, saved = _forward(q, k, v, w, call, mixing_check)
        ctx.call = call
        ctx.save_for_backward(q, k, v, w, o, *saved)
        return o

    @staticmethod
    def backward(ctx, grad_o):
        q, k, v, w, o, *saved = ctx.saved_tensors
        needs = ctx.needs_input_grad[:4]
        if torch.is_grad_enabled():
            return (*_differentiable_backward(q, k, v, w, grad_o, ctx.call, needs), None, None)
        # grad_o may be a broadcast (o.sum()'s): its blocks are read through views all the same.
        return (*_backward(q, k, v, w, o, grad_o, Saved(*saved), ctx.call, needs), None, None)


def _differentiable_backward(q, k, v, w, grad_o, call, needs):
    """The gradients as a graph (``create_graph=True``), through ``chunk``'s form."""
    inputs = [t for t, need in zip((q, k, v, w), needs) if need]
    with torch.enable_grad():
        o = chunk.mhla_attention(q, k, v, w, call.geometry, masking=call.masking, feature_map=call.feature_map,
                                 normalize=call.normalize, eps=call.eps, scale=call.scale, mixing=call.mixing,
                                 function=call.function)
    grads = iter(torch.autograd.grad(o, inputs, grad_o, create_graph=True))
    return [next(grads) if need else None for need in needs]


def mhla_attention(q, k, v, w, layout, *, masking="none", feature_map="elu1", normalize=True, eps=1e-6,
                   scale=None, mixing="dense", function="mhla::forward"):
    """``chunk.mhla_attention``'s call and answers, in the fewest ops (``chunk``'s own form when
    compiling, where the compiler fuses the ops itself, and on meta tensors)."""
    if chunk.compiling() or q.device.type == "meta":
        return chunk.mhla_attention(q, k, v, w, layout, masking=masking, feature_map=feature_map,
                                    normalize=normalize, eps=eps, scale=scale, mixing=mixing, function=function)
    geometry = Geometry.of(layout)
    mixing_check = chunk.check_w(q, k, v, w, geometry, masking, feature_map, normalize, eps, scale, mixing, function)
    call = Call(geometry, masking, feature_map, normalize, eps, scale, mixing, function)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, w)):
        return _Attention.apply(q, k, v, w, call, mixing_check)
    return _forward(q, k, v, w, call, mixing_check)[0]


def varlen_attention(q, k, v, w, cu_seqlens, *, block, mixing=None, masking=None, feature_map=None, normalize=None,
                     eps=None, scale=None):
    """``mhla.torch.varlen_attention`` in torch ops: ``cu_seqlens`` a list of offsets, options
    left None the operator's defaults. Each sequence is an ordinary call: its own layout, the
    corner of a dense w it reads, its checks."""
    options = dict(masking=masking, feature_map=feature_map, normalize=normalize, eps=eps, scale=scale)
    _core._check_varlen_call(*(list(t.shape) for t in (q, k, v, w)), cu_seqlens, block=block, mixing=mixing,
                             **options)
    mixing = "dense" if mixing is None else mixing

    def sequence(a, b):
        layout = _core.Layout.sequence(b - a, block)
        corner = w if mixing == "toeplitz" else w[..., :layout.num_blocks, :layout.num_blocks]
        q_s, k_s, v_s = q[:, a:b], k[:, a:b], v[:, a:b]
        call = _core.Options(layout, mixing=mixing, **options)
        chunk.check_call(q_s, k_s, v_s, corner, call)
        return mhla_attention(q_s, k_s, v_s, corner, layout, **chunk.keywords(call))

    return torch.cat([sequence(a, b) for a, b in zip(cu_seqlens[:-1], cu_seqlens[1:]) if b > a], dim=1)


def linear_attention(q, k, v, *, masking="none", feature_map="elu1", normalize=True, eps=1e-6, scale=None,
                     block=64, function="mhla::linear_attention_forward"):
    """Linear attention (one global summary) in torch ops: MHLA with one block, or causal in blocks
    of ``block`` tokens with every weight 1 (Toeplitz w = [1])."""
    n = q.shape[1]
    one = torch.ones(1, dtype=torch.float32, device=q.device)
    if masking == "causal":
        layout = _core.Layout.sequence(n, min(block, n))
        return mhla_attention(q, k, v, one, layout, masking="causal", feature_map=feature_map,
                              normalize=normalize, eps=eps, scale=scale, mixing="toeplitz", function=function)
    return mhla_attention(q, k, v, one.view(1, 1), _core.Layout.sequence(n, n), feature_map=feature_map,
                          normalize=normalize, eps=eps, scale=scale, function=function)
