"""The MHLA operator in plain torch ops, for tensors on any device.

``mhla.torch`` runs it for tensors that are not on the CPU (and on the CPU with
``backend="torch"``); gradients come from torch's autograd. Every mode of the
operator's contract (docs/operator.md): 1D/2D/3D layouts with ragged edge
blocks, causal (1D) and block-causal masking, dense or Toeplitz, shared or
per-head mixing, the three feature maps, normalized or not. bfloat16 inputs
keep bfloat16 operands in the products, which sum in float32 and round their
results to bfloat16, with the normalisers' ``z_b`` and its mix in float32
(on a CPU whose torch matmul sums bfloat16 in bfloat16, as 1.13's does, they
compute in float32); float16 inputs compute in float32. The result is rounded
back once.

Memory: the tokens are regrouped as ``[B, M, H, C, D]`` (C the largest block,
edge blocks padded with masked rows), the block and mixed summaries are
``[B, M, H, Dk, Dv]``, and causal masking adds the in-block scores
``[B, M, H, C, C]``: ``O(N (Dk + Dv) + M Dk Dv + N C H)``, never ``N x N``.
Toeplitz mixing is applied as shifted and prefix sums of the summaries, so it
forms no ``M x M`` matrix either.
"""
import math
from typing import NamedTuple, Tuple

import torch
import torch.nn.functional as F

from .. import _core, _finite_results, _unpickle

_REDUCED = (torch.bfloat16, torch.float16)


def _cpu_sums_bfloat16_products_in_float32():
    """Whether torch's CPU matmul sums bfloat16 products in float32 (torch 2.x), not in bfloat16
    (1.13, whose error grows with the length of the sum): 1 plus 256 products of 2^-9 is 1.5, not 1."""
    x = torch.full((1, 257), 2.0 ** -9, dtype=torch.bfloat16)
    x[0, 0] = 1
    return float(x @ torch.ones(257, 1, dtype=torch.bfloat16)) == 1.5


_CPU_BFLOAT16_PRODUCTS = _cpu_sums_bfloat16_products_in_float32()


def compute_dtype(dtype, device):
    """The dtype of the products: bfloat16 keeps float32's range, so its products take bfloat16
    operands (float32 sums; tensor cores on a GPU) wherever the matmul sums in float32; float16's
    could overflow, so it computes in float32, as does bfloat16 where the sums would be bfloat16."""
    if dtype == torch.bfloat16 and (torch.device(device).type != "cpu" or _CPU_BFLOAT16_PRODUCTS):
        return dtype
    return torch.float32 if dtype in _REDUCED else dtype


def feature(x, feature_map):
    """phi of ``x``: "identity", "relu" or "elu1" (elu(x) + 1)."""
    if feature_map == "elu1":
        # exp(x) for x <= 0, x + 1 above, as the C++ kernels compute it: F.elu(x) + 1 cancels
        # for x << 0 (exp(-20) - 1 + 1 keeps 8 of float64's 16 digits), and exp is taken of
        # min(x, 0), so that it cannot overflow; the derivative is 1 at 0 from both terms' sum.
        return torch.exp(x.clamp(max=0)) + torch.relu(x)
    if feature_map == "relu":
        return torch.relu(x)
    return x


class Geometry(NamedTuple):
    """A token layout as plain Python values: ``mhla.Layout``'s rank, grid and tile (three entries
    each, leading ones for 1D and 2D; tiles clamped to the grid), the block counts along each axis,
    and the token, block and largest-block sizes. Code under ``torch.compile`` reads these fields,
    no extension object. Made by ``of`` or ``sequence``."""
    rank: int
    grid: Tuple[int, int, int]
    tile: Tuple[int, int, int]
    counts: Tuple[int, int, int]
    num_tokens: int
    num_blocks: int
    block_size: int  # the first block's: a whole tile along every axis

    @staticmethod
    def make(rank, grid, tile):
        grid = tuple(int(g) for g in grid)
        tile = tuple(min(int(t), g) for t, g in zip(tile, grid))
        counts = tuple(-(-g // t) for g, t in zip(grid, tile))
        return Geometry(rank, grid, tile, counts, grid[0] * grid[1] * grid[2], counts[0] * counts[1] * counts[2],
                        tile[0] * tile[1] * tile[2])

    @staticmethod
    def of(layout):
        return layout if isinstance(layout, Geometry) else Geometry.make(layout.rank, layout.grid, layout.tile)

    @staticmethod
    def sequence(tokens, block):
        return Geometry.make(1, (1, 1, tokens), (1, 1, block))


def compiling():
    compiler = getattr(torch, "compiler", None)
    return compiler is not None and hasattr(compiler, "is_compiling") and compiler.is_compiling()


def _padded(geometry):
    """Whether an edge block is ragged: the grid is not a whole number of tiles along some axis."""
    return any(c * t != g for c, t, g in zip(geometry.counts, geometry.tile, geometry.grid))


def block_view(x, geometry):
    """``[*lead, N, H, D]`` as ``[*lead, c0, c1, c2, H, t0, t1, t2, D]``: block ``(c0, c1, c2)``'s
    tokens at tile offsets ``(t0, t1, t2)``, a view of x (of a copy padded with zero tokens to
    whole tiles when an edge block is ragged)."""
    lead, (h, d) = x.shape[:-3], x.shape[-2:]
    counts, tile, grid = geometry.counts, geometry.tile, geometry.grid
    if _padded(geometry):  # F.pad's list runs from the last dim: (h, d) unpadded, then axes 2, 1, 0
        ends = [p for axis in (2, 1, 0) for p in (0, counts[axis] * tile[axis] - grid[axis])]
        x = F.pad(x.view(*lead, *grid, h, d), [0, 0, 0, 0] + ends)
    x = x.view(*lead, counts[0], tile[0], counts[1], tile[1], counts[2], tile[2], h, d)
    first = len(lead)
    return x.permute(*range(first), *(first + a for a in (0, 2, 4, 6, 1, 3, 5, 7)))


def tokens_from_blocks(write, lead, h, d, geometry, dtype, device):
    """A new ``[*lead, N, H, D]`` tensor whose tokens ``write(view)`` fills, ``view`` its
    ``block_view`` (one strided write, where ``group``'s inverse is a copy more)."""
    counts, tile, grid = geometry.counts, geometry.tile, geometry.grid
    whole = [c * t for c, t in zip(counts, tile)]
    out = torch.empty(*lead, *whole, h, d, dtype=dtype, device=device)
    write(block_view(out.view(*lead, whole[0] * whole[1] * whole[2], h, d),
                     Geometry.make(geometry.rank, whole, tile)))
    if _padded(geometry):
        out = out[(slice(None),) * len(lead) + (slice(grid[0]), slice(grid[1]), slice(grid[2]))]
    return out.reshape(*lead, geometry.num_tokens, h, d)


def group(x, geometry):
    """``[B, N, H, D]`` -> ``[B, M, H, C, D]``: block b's tokens at slots ``[:, b, h, :]`` in
    row-major order within its tile, ragged edge blocks padded with zero tokens to a whole tile
    (``slot_valid`` marks the real ones). The grid is padded to whole tiles and split into
    (block, position) axes, so the regrouping is one strided copy (two with padding), and its
    gradient another: a gather by token index is a slower kernel on a GPU, and its gradient an
    atomic scatter."""
    b, _, h, d = x.shape
    return block_view(x, geometry).reshape(b, geometry.num_blocks, h, geometry.block_size, d)


def ungroup(y, geometry):
    """``group``'s inverse: ``[B, M, H, C, D]`` -> ``[B, N, H, D]`` in token order, the padding
    slots dropped."""
    b, _, h, _, d = y.shape
    counts, tile, grid = geometry.counts, geometry.tile, geometry.grid
    y = y.view(b, *counts, h, *tile, d).permute(0, 1, 5, 2, 6, 3, 7, 4, 8)
    if _padded(geometry):
        y = y.reshape(b, *(c * t for c, t in zip(counts, tile)), h, d)[:, :grid[0], :grid[1], :grid[2]]
    return y.reshape(b, geometry.num_tokens, h, d)


def slot_valid(geometry, device):
    """``[M, C]``: which of ``group``'s slots hold a token; None where no block is ragged."""
    if not _padded(geometry):
        return None
    # Along each axis, [count, tile]: whether block index i, offset j lies inside the grid.
    inside = [(torch.arange(c, device=device).view(-1, 1) * t + torch.arange(t, device=device)) < g
              for c, t, g in zip(geometry.counts, geometry.tile, geometry.grid)]
    counts, tile = geometry.counts, geometry.tile
    valid = (inside[0].view(counts[0], 1, 1, tile[0], 1, 1) & inside[1].view(1, counts[1], 1, 1, tile[1], 1)
             & inside[2].view(1, 1, counts[2], 1, 1, tile[2]))
    return valid.reshape(geometry.num_blocks, geometry.block_size)


_KEPT = {}  # (what, its arguments, device) -> a mask: a model calls with the same few layouts and blocks


def _kept(what, make, *args, device):
    """``make(*args, device)``, kept (at most 64 masks); traced into the graph, not kept, under
    torch.compile."""
    if compiling():
        return make(*args, device)
    key = (what, args, str(device))
    if key not in _KEPT:
        if len(_KEPT) >= 64:
            _KEPT.clear()
        _KEPT[key] = make(*args, device)
    return _KEPT[key]


def cached_slot_valid(geometry, device):
    """``slot_valid``, kept."""
    return _kept("slot_valid", slot_valid, geometry, device=device)


def _shift_blocks(x, d):
    """``x[:, i - d]`` at block i (zeros for i < d), along dim 1."""
    if d == 0:
        return x
    m = x.shape[1]
    if d >= m:
        return torch.zeros_like(x)
    return torch.cat([x.new_zeros(x.shape[0], d, *x.shape[2:]), x[:, :m - d]], dim=1)


def read_by_masking(w, masking):
    """Dense w with the entries the masking does not read zeroed: row i reads b < i when causal
    (its own block acting inside it), b <= i when block-causal."""
    if masking == "causal":
        return torch.tril(w, -1)
    if masking == "block_causal":
        return torch.tril(w)
    return w


def _mix_dense(x, w, masking):
    """``sum_b W[i, b] x_b`` over the blocks the masking lets row i read (causal: b < i, its own
    block acting inside it; block-causal: b <= i). x ``[B, M, H, E]``, w ``[M, M]`` or ``[H, M, M]``."""
    w = read_by_masking(w.to(x.dtype), masking)
    if w.dim() == 2:  # one batched product over [B, M, H E] (an einsum costs more to dispatch)
        return torch.matmul(w, x.flatten(2)).view_as(x)
    return torch.einsum("hib,zbhe->zihe", w, x)


def _mix_toeplitz(x, w, masking):
    """The same for Toeplitz w ``[L + 1]`` or ``[H, L + 1]``: ``W[i, b] = w[min(i - b, L)]``, as
    ``sum_d w[d] x_{i-d}`` over the near distances and ``w[L]`` times a prefix sum for the rest,
    in w's dtype (a bfloat16 x is summed in float32: these are running sums, not one product)."""
    dtype, x = x.dtype, x.to(w.dtype)
    length = w.shape[-1] - 1
    first = 1 if masking == "causal" else 0

    def weight(d):  # w[d], broadcast over [B, M, H, E]
        return w[d] if w.dim() == 1 else w[:, d].view(1, 1, -1, 1)

    out = torch.zeros_like(x)
    for d in range(first, length):
        out = out + weight(d) * _shift_blocks(x, d)
    tail = max(length, first)
    return (out + weight(length) * _shift_blocks(torch.cumsum(x, dim=1), tail)).to(dtype)


def block_diagonal(diag, blocks, heads):
    """``diagonal``'s ``[M]`` or ``[H, M]`` as a factor of ``[B, M, H, ., .]`` tensors."""
    return diag.view(1, blocks, 1, 1, 1) if diag.dim() == 1 else diag.t().reshape(1, blocks, heads, 1, 1)


def _lower_triangle(size, device):
    return torch.ones(size, size, dtype=torch.bool, device=device).tril()


def triangle(size, device):
    """The ``[C, C]`` boolean lower triangle (``j <= t``), kept."""
    return _kept("triangle", _lower_triangle, size, device=device)


def mix(x, w, masking, mixing):
    """``_mix_dense`` or ``_mix_toeplitz``, as ``mixing`` names the form of w."""
    return (_mix_toeplitz if mixing == "toeplitz" else _mix_dense)(x, w, masking)


def diagonal(w, mixing, blocks):
    """``W[i, i]`` per block: ``[M]`` or ``[H, M]``."""
    if mixing == "toeplitz":
        return w[..., :1].expand(*w.shape[:-1], blocks)
    return torch.diagonal(w, dim1=-2, dim2=-1)


# The range a result of each dtype overflows, as the C++ operator names it: bfloat16 has float32's.
_RANGE_OF = {torch.float64: "float64", torch.float32: "float32", torch.bfloat16: "float32",
             torch.float16: "float16"}


def non_finite_message(function, feature_map, normalize, eps, dk, dtype):
    """``_finite_results``' message for this call: the C++ operator's words, built on failure only.
    An infinite float16 result (computed in float32, then rounded) is one beyond float16's range,
    named as the C++ operator names it, with its remedy for a forward or a backward."""
    def message(entry, what, magnitudes):
        if dtype == torch.float16 and entry is not None and math.isinf(entry[3]):
            name, shape, index, _ = entry
            element = f"{name}[{', '.join(map(str, _unravel(index, shape)))}]"
            remedy = "scale grad_o down (a smaller loss scale)" if "backward" in function else "rescale q, k or v"
            return _core._float16_range_message(function, element, remedy)
        options = _core.Options(_core.Layout.sequence(1, 1), feature_map=feature_map, normalize=normalize,
                                eps=eps)
        return _core._non_finite_message(function, entry, what, magnitudes, options, dk, _RANGE_OF[dtype])
    return message


def _unravel(flat, shape):
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return index[::-1]


def check_w(q, k, v, w, geometry, masking, feature_map, normalize, eps, scale, mixing, function):
    """Refuses w's values as the C++ entry point ``function`` refuses them (``_finite_results``;
    returns its deferred check, for ``check_results``' ``mixing``)."""
    shapes = [list(t.shape) for t in (q, k, v, w)]  # not the tensors: a deferred report outlives them

    def validate(values):
        options = _core.Options(_unpickle.layout(geometry.rank, geometry.grid, geometry.tile), masking=masking,
                                feature_map=feature_map, normalize=normalize, eps=eps, scale=scale, mixing=mixing)
        values = values.to(torch.float64 if values.dtype == torch.float64 else torch.float32).contiguous()
        _core._check_call(*shapes, values, options, function)

    return _finite_results.check_mixing(w, validate)


def mhla_attention(q, k, v, w, layout, *, masking="none", feature_map="elu1", normalize=True, eps=1e-6,
                   scale=None, mixing="dense", function="mhla::forward"):
    """MHLA of ``q, k [B, N, H, Dk]``, ``v [B, N, H, Dv]`` with mixing ``w`` on q's device, in torch
    ops; returns ``[B, N, H, Dv]`` in q's dtype. ``layout``: an ``mhla.Layout`` or a ``Geometry``;
    the shapes and options as validated by ``check_call``. w's values and the results are checked
    here (``_finite_results``), with the errors of the C++ entry point ``function``."""
    geometry = Geometry.of(layout)
    backward = function.replace("forward", "backward")
    q, k, v, w, finish = _finite_results.watch(
        q, k, v, w, non_finite_message(backward, feature_map, normalize, eps, q.shape[-1], q.dtype))

    mixing_check = check_w(q, k, v, w, geometry, masking, feature_map, normalize, eps, scale, mixing, function)
    inputs = dict(q=q, k=k, v=v)
    dtype = q.dtype
    compute = compute_dtype(dtype, q.device)
    # Sums that are not one product (the normalisers' z_b, Toeplitz mixing) are float32.
    wide = torch.float32 if compute == torch.bfloat16 else compute
    # Every tensor of a call is on q's device (mhla.torch's contract); w takes the sums' dtype.
    q, k, v, w = q.to(compute), k.to(compute), v.to(compute), w.to(device=q.device, dtype=wide)
    m, size, heads = geometry.num_blocks, geometry.block_size, q.shape[2]
    valid = cached_slot_valid(geometry, q.device)
    phi_q = feature(group(q, geometry), feature_map)  # [B, M, H, C, Dk]
    phi_k = feature(group(k, geometry), feature_map)
    if valid is not None:  # padding slots add nothing
        phi_k = phi_k * valid.view(1, m, 1, size, 1).to(compute)
    values = group(v, geometry)
    # S_b = phi(K_b)^T V_b [B, M, H, Dk, Dv] and z_b = sum phi(K_b) [B, M, H, Dk], each mixed.
    summaries = phi_k.transpose(-1, -2) @ values
    mixed = mix(summaries.flatten(3), w, masking, mixing).view_as(summaries)
    mixed_sums = mix(phi_k.sum(3, dtype=wide), w, masking, mixing)
    y = phi_q @ mixed  # [B, M, H, C, Dv]
    den = (phi_q @ mixed_sums.to(compute).unsqueeze(-1)).squeeze(-1)  # [B, M, H, C]
    if masking == "causal":
        # W[i, i] sum_{j in i, j <= t} phi(q_t) . phi(k_j) [v_j | 1], in [C, C] scores per block.
        scores = phi_q @ phi_k.transpose(-1, -2)  # [B, M, H, C, C]
        scores = scores * (triangle(size, q.device) * block_diagonal(diagonal(w, mixing, m), m, heads)).to(compute)
        y = y + scores @ values
        den = den.to(wide) + scores.sum(-1, dtype=wide)
    denominators = ()
    if normalize:
        if valid is not None:  # padding rows divide by at least 1: no 0 / 0 reaches a gradient
            den = den + (~valid).view(1, m, 1, size).to(den.dtype)
        # One rounding of den + eps to the products' dtype (a bfloat16 den adds eps in float32).
        divisor = (den + eps).to(compute).unsqueeze(-1)
        o = y / divisor
        denominators = read_out_denominators(divisor)
    else:
        o = (scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])) * y
    o = ungroup(o, geometry).to(dtype)
    _finite_results.check_results(
        {"o": o}, inputs, non_finite_message(function, feature_map, normalize, eps, q.shape[-1], dtype),
        denominator=denominators, earlier=False, mixing=mixing_check,
        denominator_entry=(lambda: read_out_entry(ungroup(y * divisor.reciprocal(), geometry))) if normalize else None)
    return finish(o)


def read_out_denominators(divisor):
    """Tensors finite exactly where the C++ read-out, ``y * (1 / divisor)``, can be: the divisor
    and its reciprocal (not where the divisor is infinite or NaN, zero, or so small that its
    reciprocal overflows: a subnormal denominator, whose products have lost their precision)."""
    return divisor, divisor.reciprocal()


def read_out_entry(o):
    """The first entry of ``o`` (as the C++ read-out computes it) that is not finite, as
    ``_finite_results`` names entries, or None."""
    o = o.detach()
    flat = (~torch.isfinite(o)).flatten().nonzero()
    if not len(flat):
        return None
    index = int(flat[0])
    return ("o", list(o.shape), index, float(o.flatten()[index]))


def keywords(options):
    """An extension ``Options`` / ``LinearOptions`` object as this module's keywords ("causal",
    "elu1", ...)."""
    names = dict(masking=options.masking.name, feature_map=options.feature_map.name, normalize=options.normalize,
                 eps=options.eps, scale=options.scale)
    if hasattr(options, "mixing"):
        names["mixing"] = options.mixing.name
    return names


def check_call(q, k, v, w, options, function="mhla::forward"):
    """The operator's named errors for this call's shapes and options (``_contract`` has checked
    the tensors' types, devices and dtypes; ``mhla_attention`` checks w's values)."""
    _core._check_call(list(q.shape), list(k.shape), list(v.shape), list(w.shape), None, options, function)


def softmax_attention(q, k, v, *, causal=False, scale=None, chunk=1024, fused=True):
    """``softmax(q k^T * scale) v`` in torch ops: SDPA where torch has it (2.x) and ``fused``, else
    in query chunks of ``chunk`` rows (never N x N; differentiable twice)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    o = _softmax_outputs(q, k, v, causal, scale, chunk, fused)
    dtype = _RANGE_OF[q.dtype]

    def message(entry, what, magnitudes):
        return _core._softmax_overflow_message("mhla::softmax_attention_forward", magnitudes, scale, dtype)

    # Scores beyond the range turn rows into NaN: named, in the C++ baseline's words.
    _finite_results.check_results({"o": o}, dict(q=q, k=k, v=v), message)
    return o


def _softmax_outputs(q, k, v, causal, scale, chunk, fused):
    sdpa = getattr(F, "scaled_dot_product_attention", None) if fused else None
    if sdpa is not None:
        try:
            o = sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, scale=scale)
            return o.transpose(1, 2)
        except TypeError:  # torch 2.0: no scale argument
            pass
    n = q.shape[1]
    outputs = []
    for first in range(0, n, chunk):
        rows = q[:, first:first + chunk]
        scores = torch.einsum("znhd,zmhd->zhnm", rows, k) * scale
        if causal:
            query = torch.arange(first, first + rows.shape[1], device=q.device).view(-1, 1)
            key = torch.arange(n, device=q.device).view(1, -1)
            scores = scores.masked_fill(key > query, float("-inf"))
        outputs.append(torch.einsum("zhnm,zmhe->znhe", torch.softmax(scores, dim=-1), v))
    return torch.cat(outputs, dim=1)

