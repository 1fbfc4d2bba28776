"""The C++ extension's operators as autograd sees them, each defined once for both ways torch calls it.

An ``Operator`` says three things: how the extension's forward runs (the output and the state its
backward reads), how its backward runs from that state, and the same operator in plain torch ops.
From these come the eager path (calling the ``Operator``: one ``autograd.Function`` serves every
operator) and the ``torch.library`` custom ops of ``_custom_ops`` that ``torch.compile`` traces, so
both compute the same arrays. Eager calls do not go through the custom ops: their dispatch costs
more at small shapes (docs/python.md).

The extension has no second derivatives. A backward asked to build its own graph
(``create_graph=True``) differentiates the plain-torch form instead, so no second-order term goes
missing.
"""
from dataclasses import dataclass
from typing import Callable

import torch

from . import _core, _plan
from ._torch_forms import chunk, lean
from ._torch_operands import operand, stream_of, tensors


@dataclass(frozen=True)
class Operator:
    arity: int            # the differentiable inputs, which come first among the arguments
    run: Callable         # (inputs, settings, save) -> (o, *state); the state only if save
    grads: Callable       # (inputs, o, state, grad_o, settings) -> the inputs' gradients
    recompute: Callable   # (inputs, settings) -> o in plain torch ops

    def __call__(self, *inputs, settings):
        return _Eager.apply(self, settings, *inputs)

    def backward(self, inputs, o, state, grad_o, settings, needs):
        """The gradients of ``inputs`` (None where ``needs`` is false)."""
        if not torch.is_grad_enabled():
            return self.grads(inputs, o, state, grad_o, settings)
        wanted = [t for t, n in zip(inputs, needs) if n]
        with torch.enable_grad():
            recomputed = self.recompute(inputs, settings)
        grads = iter(torch.autograd.grad(recomputed, wanted, grad_o, create_graph=True, allow_unused=True))
        return tuple(next(grads) if n else None for n in needs)


class _Eager(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op, settings, *inputs):
        save = any(ctx.needs_input_grad[2:])
        o, *state = op.run(inputs, settings, save)
        if save:
            # The inputs themselves are kept, so that a second-order backward can differentiate
            # through them.
            ctx.save_for_backward(*inputs, o, *state)
            ctx.op, ctx.settings = op, settings
        return o

    @staticmethod
    def backward(ctx, grad_o):
        op, saved = ctx.op, ctx.saved_tensors
        grads = op.backward(saved[:op.arity], saved[op.arity], saved[op.arity + 1:], grad_o, ctx.settings,
                            ctx.needs_input_grad[2:])
        return (None, None, *grads)


def cuda_kernels_of(bits):
    """The ``mhla.CudaKernels`` of ``_plan.cuda_kernel_bits``' int."""
    return _core.CudaKernels(**{name: bool(bits >> i & 1) for i, name in enumerate(_plan.CUDA_KERNELS)})


def _mhla_run(inputs, options, save):
    operands = [operand(t) for t in inputs]
    stream = stream_of(inputs[0])  # CUDA tensors: torch's current stream
    bits = _plan.cuda_kernel_bits(name for name in _plan.CUDA_KERNELS if getattr(options.cuda, name))
    if not _plan.keeps_state(inputs[0], bits, save):
        # Inference, or a backward that recomputes its own state: nothing to keep (and bfloat16 mixes
        # on its own products).
        o, = tensors(_core.forward(*operands, options=options, stream=stream))
        if not save:
            return (o,)
        # The state's places in the results, kept empty (two arrays: a custom op's results may not alias).
        return o, inputs[3].new_empty(0), inputs[3].new_empty(0)
    # The block and mixed summaries are O(M Dk Dv) each: keeping them spares backward a pass over
    # k and v and the mix. torch holds them (a custom op's results are tensors), and the extension
    # reads them back through a ForwardState over them.
    return tensors(*_core._forward_into_arrays(*operands, options=options, stream=stream))


def _mhla_grads(inputs, o, state, grad_o, options):
    operands = [operand(t) for t in (*inputs, o, grad_o)]
    if not state[0].numel():  # forward kept none: backward recomputes it
        return tensors(*_core.backward(*operands, options=options, stream=stream_of(o)))
    # The arrays cannot be stale here: only autograd holds them, and torch refuses to get here
    # (its saved tensors' version counters) after q, k, v or w changed in place.
    summaries, mixed = (operand(t) for t in state)
    return tensors(*_core._backward_from_arrays(*operands, summaries=summaries, mixed=mixed, options=options,
                                                stream=stream_of(o)))


MHLA = Operator(
    arity=4, run=_mhla_run, grads=_mhla_grads,
    recompute=lambda inputs, options: chunk.mhla_attention(*inputs, options.layout,
                                                                 **chunk.keywords(options)))

# Settings: (cu_seqlens, the keyword options of _core.varlen_forward).
VARLEN = Operator(
    arity=4,
    run=lambda inputs, settings, save: tensors(_core.varlen_forward(*(operand(t) for t in inputs), settings[0],
                                                                    **settings[1])),
    grads=lambda inputs, o, state, grad_o, settings: tensors(*_core.varlen_backward(
        *(operand(t) for t in (*inputs, o, grad_o)), settings[0], **settings[1])),
    recompute=lambda inputs, settings: lean.varlen_attention(*inputs, settings[0], **settings[1]))

# Settings: a _core.LinearOptions.
LINEAR = Operator(
    arity=3,
    run=lambda inputs, options, save: tensors(_core.linear_attention_forward(*(operand(t) for t in inputs),
                                                                             options=options)),
    grads=lambda inputs, o, state, grad_o, options: tensors(*_core.linear_attention_backward(
        *(operand(t) for t in (*inputs, o, grad_o)), options=options)),
    recompute=lambda inputs, options: lean.linear_attention(*inputs, **chunk.keywords(options)))

# Settings: dict(causal=..., scale=...). The state is the rows' log-sum-exp.
SOFTMAX = Operator(
    arity=3,
    run=lambda inputs, settings, save: tensors(*_core.softmax_attention_forward(*(operand(t) for t in inputs),
                                                                                **settings)),
    grads=lambda inputs, o, state, grad_o, settings: tensors(*_core.softmax_attention_backward(
        *(operand(t) for t in (*inputs, o, *state, grad_o)), **settings)),
    # In query chunks: torch's fused attention kernels have no second derivative.
    recompute=lambda inputs, settings: chunk.softmax_attention(*inputs, fused=False, **settings))
