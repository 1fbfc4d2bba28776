"""The C++ operator and its baselines as ``torch.library`` custom ops, so ``torch.compile`` traces
through them.

``torch.compile`` cannot look inside the extension's functions or an ``autograd.Function`` that
calls them: it breaks the graph there (``fullgraph=True`` refuses). Registered as custom ops with
fake implementations that give the results' shapes and dtypes, each operator becomes one node of
the graph, forward and backward: ``mhla::forward``, ``mhla::varlen_forward``,
``mhla::linear_attention_forward`` and ``mhla::softmax_attention_forward``, each with its
``..._backward``. Layouts and options travel as plain values (a ``Geometry``'s rank, grid and
tile, the options' names), because an op's schema takes no extension objects.

Each op's forward, backward and second-order backward are its ``_operators.Operator``'s, as in
eager calls. Needs ``torch.library.custom_op`` (torch 2.4 and later); ``AVAILABLE`` says whether
it is there. Eager calls keep ``_operators``' autograd function: this path is for code being
compiled.
"""
import functools

import torch
from . import _core, _operators, _plan, _unpickle
from ._torch_forms.chunk import Geometry

AVAILABLE = _plan.CUSTOM_OPS


def _options(rank, grid, tile, *names):
    """The extension's Options for the op's plain values."""
    return _cached_options(rank, tuple(grid), tuple(tile), *names)


@functools.lru_cache(maxsize=64)
def _cached_options(rank, grid, tile, masking, feature_map, normalize, eps, scale, mixing, cuda_kernels):
    # A model calls with the same few.
    return _core.Options(_unpickle.layout(rank, grid, tile), masking=masking, feature_map=feature_map,
                         normalize=normalize, eps=eps, scale=scale, mixing=mixing,
                         cuda=_operators.cuda_kernels_of(cuda_kernels))


@functools.lru_cache(maxsize=64)
def _linear_options(masking, feature_map, normalize, eps, scale):
    return _core.LinearOptions(masking=masking, feature_map=feature_map, normalize=normalize, eps=eps, scale=scale)


def _summaries_like(q, v, w, rank, grid, tile, cuda_kernels):
    """An empty array of the saved summaries' shape ``[B, H, M, Dk, Dv + 1]`` in w's dtype, or of
    shape ``[0]`` where forward keeps no state (``_plan.keeps_state``)."""
    if not _plan.keeps_state(q, cuda_kernels, True):
        return w.new_empty(0)
    blocks = Geometry.make(rank, grid, tile).num_blocks
    return w.new_empty(q.shape[0], q.shape[2], blocks, q.shape[3], v.shape[3] + 1)


def _register(name, op, inputs, plain, settings_of, fake, state, devices=("cpu",)):
    """``mhla::<name>`` (the results ``(o, *state)``, o alone without state) and its
    ``..._backward`` from ``op``, for the tensors of ``devices``. ``inputs``: the tensors' names;
    ``plain``: the schema of the plain values after them; ``settings_of(*plain values)``: ``op``'s
    settings; ``fake(*inputs, *plain values)``: empty arrays of the results' shapes."""
    n = op.arity
    tensors = ", ".join(f"Tensor {x}" for x in inputs)
    results = ", ".join(["Tensor"] * (1 + state))
    state_names = "".join(f", Tensor state{i}" for i in range(state))
    backward_name = name.replace("forward", "backward")

    def forward_impl(*args):
        results = op.run(args[:n], settings_of(*args[n:]), True)
        return results if state else results[0]  # a one-result schema returns the tensor itself

    # The backward op takes (inputs, o, grad_o, *state, plain values), an order kept fixed:
    # graphs in torch's on-disk compile caches call an op by position, not by its schema.
    def backward_impl(*args):
        o, grad_o, saved = args[n], args[n + 1], args[n + 2:n + 2 + state]
        return op.grads(args[:n], o, saved, grad_o, settings_of(*args[n + 2 + state:]))

    forward = torch.library.custom_op(f"mhla::{name}", forward_impl, mutates_args=(), device_types=devices,
                                      schema=f"({tensors}, {plain}) -> ({results})")
    forward.register_fake(fake)
    backward = torch.library.custom_op(
        f"mhla::{backward_name}", backward_impl, mutates_args=(), device_types=devices,
        schema=f"({tensors}, Tensor o, Tensor grad_o{state_names}, {plain}) -> ({', '.join(['Tensor'] * n)})")
    backward.register_fake(lambda *args: tuple(torch.empty_like(t) for t in args[:n]))

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:n], *(output if state else (output,)))
        ctx.plain = inputs[n:]

    def formula(ctx, grad_o, *_grad_state):
        saved = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: the operator's second-order form
            grads = op.backward(saved[:n], saved[n], saved[n + 1:], grad_o, settings_of(*ctx.plain),
                                [t.requires_grad for t in saved[:n]])
        else:
            grads = backward(*saved[:n + 1], grad_o, *saved[n + 1:], *ctx.plain)
        return (*grads, *(None for _ in ctx.plain))

    forward.register_autograd(formula, setup_context=setup_context)
    return forward, backward


def _output_like(q, v):
    return q.new_empty(*q.shape[:3], v.shape[3])


_OPTIONS = "str masking, str feature_map, bool normalize, float eps, float? scale"

# MHLA runs on CUDA tensors too where the extension has the CUDA backend (on torch's current
# stream); the baselines and varlen are CPU-only in C++.
_MHLA_DEVICES = ("cpu", "cuda") if _core.has_cuda_backend else ("cpu",)

if AVAILABLE:
    # (o, summaries, mixed): the output and the state its backward reads.
    forward, backward = _register(
        "forward", _operators.MHLA, "qkvw", f"int rank, int[] grid, int[] tile, {_OPTIONS}, str mixing, int cuda_kernels",
        _options, lambda q, k, v, w, rank, grid, tile, *names: (
            _output_like(q, v), _summaries_like(q, v, w, rank, grid, tile, names[-1]),
            _summaries_like(q, v, w, rank, grid, tile, names[-1])), state=2, devices=_MHLA_DEVICES)
    varlen_forward, varlen_backward = _register(
        "varlen_forward", _operators.VARLEN, "qkvw", f"int[] cu_seqlens, int block, str mixing, {_OPTIONS}",
        lambda cu, block, mixing, masking, feature_map, normalize, eps, scale: (list(cu), dict(
            block=block, mixing=mixing, masking=masking, feature_map=feature_map, normalize=normalize, eps=eps,
            scale=scale)),
        lambda q, k, v, w, *plain: _output_like(q, v), state=0)
    linear_forward, linear_backward = _register(
        "linear_attention_forward", _operators.LINEAR, "qkv", _OPTIONS, _linear_options,
        lambda q, k, v, *names: _output_like(q, v), state=0)
    # (o, lse): the rows' log-sum-exp [B, H, N] in q's dtype.
    softmax_forward, softmax_backward = _register(
        "softmax_attention_forward", _operators.SOFTMAX, "qkv", "bool causal, float? scale",
        lambda causal, scale: dict(causal=causal, scale=scale),
        lambda q, k, v, causal, scale: (_output_like(q, v), q.new_empty(q.shape[0], q.shape[2], q.shape[1])),
        state=1)


def mhla_attention(q, k, v, w, geometry, plan, *, masking, feature_map, normalize, eps, scale, mixing, cuda_kernels=0):
    """``mhla.torch.mhla_attention`` through the custom op (CPU tensors, and CUDA tensors where the
    extension has the CUDA backend), options by name, tensors in the ``plan``'s dtypes (bfloat16
    and float16 q, k, v on the operator's own 16-bit paths with float32 w); the result comes back
    in q's dtype."""
    operands = (*(t.to(plan.operand_dtype) for t in (q, k, v)), w.to(plan.w_dtype))
    o, _, _ = forward(*operands, geometry.rank, list(geometry.grid), list(geometry.tile), masking, feature_map,
                      normalize, eps, scale, mixing, cuda_kernels)
    return o.to(q.dtype)


def varlen_attention(q, k, v, w, cu_seqlens, plan, *, block, mixing, masking, feature_map, normalize, eps, scale):
    """``mhla.torch.varlen_attention`` of CPU tensors through the custom op, options by name,
    ``cu_seqlens`` a list; tensors in the ``plan``'s dtypes."""
    o = varlen_forward(*(t.to(plan.operand_dtype) for t in (q, k, v, w)), list(cu_seqlens), block, mixing,
                       masking, feature_map, normalize, eps, scale)
    return o.to(q.dtype)


def linear_attention(q, k, v, plan, *, masking, feature_map, normalize, eps, scale):
    """``mhla.torch.linear_attention`` of CPU tensors through the custom op, options by name."""
    operands = (t.to(plan.operand_dtype) for t in (q, k, v))
    return linear_forward(*operands, masking, feature_map, normalize, eps, scale).to(q.dtype)


def softmax_attention(q, k, v, plan, *, causal, scale):
    """``mhla.torch.softmax_attention`` of CPU tensors through the custom op."""
    o, _ = softmax_forward(*(t.to(plan.operand_dtype) for t in (q, k, v)), causal, scale)
    return o.to(q.dtype)
