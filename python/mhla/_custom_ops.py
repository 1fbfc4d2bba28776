"""The C++ operator as ``torch.library`` custom ops, so ``torch.compile`` traces through it.

``torch.compile`` cannot look inside the extension's functions or ``autograd.Function`` classes
that call them: it breaks the graph there (``fullgraph=True`` refuses). Registered as custom ops
(``mhla::forward`` and ``mhla::backward``) with fake implementations that give the results'
shapes and dtypes, the operator becomes one node of the graph, forward and backward. The layout
and options travel as plain values (a ``Geometry``'s rank, grid and tile, and the options' names),
because an op's schema takes no extension objects.

Needs ``torch.library.custom_op`` (torch 2.4 and later); ``AVAILABLE`` says whether it is there.
Eager calls keep ``mhla.torch``'s autograd functions: this path is for code being compiled.
"""
import functools
from typing import List, Optional, Tuple

import torch
from . import _core, _unpickle
from ._pure_torch import Geometry
from ._torch_operands import operand, tensors

AVAILABLE = hasattr(torch.library, "custom_op") and hasattr(torch.library, "register_autograd")

Tensor = torch.Tensor


@functools.lru_cache(maxsize=64)
def _options(rank, grid, tile, masking, feature_map, normalize, eps, scale, mixing):
    """The extension's Options for these plain values; a model calls with the same few."""
    return _core.Options(_unpickle.layout(rank, grid, tile), masking=masking, feature_map=feature_map,
                         normalize=normalize, eps=eps, scale=scale, mixing=mixing)


def _summaries_like(q, v, w, rank, grid, tile):
    """An empty array of the saved summaries' shape ``[B, H, M, Dk, Dv + 1]`` in w's dtype."""
    blocks = Geometry.make(rank, grid, tile).num_blocks
    return w.new_empty(q.shape[0], q.shape[2], blocks, q.shape[3], v.shape[3] + 1)


if AVAILABLE:
    @torch.library.custom_op("mhla::forward", mutates_args=(), device_types="cpu")
    def forward(q: Tensor, k: Tensor, v: Tensor, w: Tensor, rank: int, grid: List[int], tile: List[int],
                masking: str, feature_map: str, normalize: bool, eps: float, scale: Optional[float],
                mixing: str) -> Tuple[Tensor, Tensor, Tensor]:
        """``(o, summaries, mixed)``: the output and the state its backward reads."""
        options = _options(rank, tuple(grid), tuple(tile), masking, feature_map, normalize, eps, scale, mixing)
        return tensors(*_core.forward(operand(q), operand(k), operand(v), operand(w), options=options,
                                      save_summaries=True, save_mixed=True))

    @forward.register_fake
    def _(q, k, v, w, rank, grid, tile, masking, feature_map, normalize, eps, scale, mixing):
        return (q.new_empty(*q.shape[:3], v.shape[3]), _summaries_like(q, v, w, rank, grid, tile),
                _summaries_like(q, v, w, rank, grid, tile))

    @torch.library.custom_op("mhla::backward", mutates_args=(), device_types="cpu")
    def backward(q: Tensor, k: Tensor, v: Tensor, w: Tensor, o: Tensor, grad_o: Tensor, summaries: Tensor,
                 mixed: Tensor, rank: int, grid: List[int], tile: List[int], masking: str, feature_map: str,
                 normalize: bool, eps: float, scale: Optional[float],
                 mixing: str) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(grad_q, grad_k, grad_v, grad_w)`` from the state ``forward`` returned."""
        options = _options(rank, tuple(grid), tuple(tile), masking, feature_map, normalize, eps, scale, mixing)
        # The state is forward's own, passed on by the autograd formula below: as in mhla.torch's
        # autograd function, no fingerprint check is needed.
        return tensors(*_core._backward_private_state(
            *(operand(t) for t in (q, k, v, w, o, grad_o)), summaries=operand(summaries),
            mixed=operand(mixed), options=options))

    @backward.register_fake
    def _(q, k, v, w, o, grad_o, summaries, mixed, *options):
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(w)

    def _setup_context(ctx, inputs, output):
        q, k, v, w, *options = inputs
        o, summaries, mixed = output
        ctx.save_for_backward(q, k, v, w, o, summaries, mixed)
        ctx.options = options

    def _backward_formula(ctx, grad_o, _grad_summaries, _grad_mixed):
        q, k, v, w, o, summaries, mixed = ctx.saved_tensors
        grads = backward(q, k, v, w, o, grad_o, summaries, mixed, *ctx.options)
        return (*grads, *(None for _ in ctx.options))

    torch.library.register_autograd("mhla::forward", _backward_formula, setup_context=_setup_context)


def mhla_attention(q, k, v, w, geometry, *, masking, feature_map, normalize, eps, scale, mixing):
    """``mhla.torch.mhla_attention`` of CPU tensors through the custom op, options by name. As there,
    bfloat16 q, k, v run on the operator's bfloat16 path (float32 w), float16 through float32
    copies, and the result comes back in q's dtype."""
    if q.dtype == torch.bfloat16 and k.dtype == v.dtype == q.dtype:
        operands = (q, k, v, w.to(torch.float32))
    else:
        compute = torch.float32 if q.dtype == torch.float16 else q.dtype
        operands = (q.to(compute), k.to(compute), v.to(compute), w.to(compute))
    o, _, _ = forward(*operands, geometry.rank, list(geometry.grid), list(geometry.tile), masking, feature_map,
                      normalize, eps, scale, mixing)
    return o.to(q.dtype)
