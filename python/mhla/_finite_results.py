"""The plain-torch path's half of the promise of docs/bad-input.md: finite inputs give a finite
result or a named error, never silent NaN, infinity or zeros, and a mixing matrix that the
operator refuses (not finite; negative in the normalized mode) is refused here too.

The C++ kernels note whether what they write is finite; here torch ops do the same after the
fact: each forward looks at o and the read-out's denominators (an overflowed denominator turns o
into a silent 0), each backward at the gradients this operator contributes (``watch``). Only
when something is not finite are the inputs looked at (non-finite inputs propagate, as in any
torch op), and the error is the C++ operator's own text (``_core._non_finite_message``,
``_core._check_call``).

Reading an answer back waits for the device. On the CPU that costs nothing, so the check is
synchronous there. On other devices a wait per call would stall the stream, so by default
(mode "auto") each tensor's largest magnitude is taken on the device (one op for the group) and
copied to pinned memory behind an event, to be tested on the host once it has arrived; a later
call, or ``report(wait=True)`` (``mhla.torch.check_finite_results``), raises the error once that
event has passed, and never waits for it otherwise. Mode "sync" gives
the synchronous check (the entry and the cause named) on every device, "deferred" the deferred
one on every device (on the CPU its answer is at hand at once, so it is reported by the next call).

Meta tensors hold no values and are not checked. Under ``torch.compile`` the plain-torch path is
not checked: a data-dependent error cannot be traced into a graph.
"""
import collections
import math

import torch

from . import _core

MODES = ("auto", "sync", "deferred")
_mode = "auto"
# (answer, event or None, message()) per deferred check, oldest first.
_pending = collections.deque()
# Past this many unread answers the oldest is waited for: the device is that many calls behind.
_MAX_PENDING = 256


def set_mode(mode):
    """Chooses the check's mode (``MODES``); returns the one it replaces."""
    global _mode
    if mode not in MODES:
        raise ValueError(f"unknown finite-check mode {mode!r}; expected one of {', '.join(MODES)}")
    previous, _mode = _mode, mode
    return previous


def _skipped(t):
    compiler = getattr(torch, "compiler", None)
    compiling = compiler is not None and hasattr(compiler, "is_compiling") and compiler.is_compiling()
    return compiling or t.device.type == "meta"


def _deferred(device):
    return _mode == "deferred" or (_mode == "auto" and device.type != "cpu")


def _uses_norms(device):
    """Whether the check takes the group's largest magnitudes in one op (``_foreach_norm``: one
    kernel launch for all its tensors on a GPU). On the CPU, where nothing is launched, each
    tensor's ``aminmax`` is the faster pass (vectorised; the inf-norm is not, at a tenth of its
    speed: bench/finite_check_bench.py)."""
    return device.type != "cpu"


def _parts(tensors):
    """Per tensor, 0-dim tensors that are all finite exactly when it is: NaN propagates into a
    maximum and a minimum (and a norm), infinity is its own extreme, and extremes of finite
    entries never overflow. ``isfinite(t).all()`` costs two ops and a boolean tensor per tensor."""
    tensors = [t.detach() for t in tensors]
    if tensors and _uses_norms(tensors[0].device):
        return [(n,) for n in torch._foreach_norm(tensors, math.inf)]
    # torch 1.13's CPU aminmax has no float16 kernel; a float32 sum of float16 values cannot
    # overflow (65504 N stays below float32's range), so it is finite exactly when they are.
    return [(t.sum(dtype=torch.float32),) if t.dtype == torch.float16 else tuple(torch.aminmax(t))
            for t in tensors]


def _finite_now(tensors):
    """Whether every entry is finite, read back at once (a wait for the device)."""
    return all(math.isfinite(float(x)) for part in _parts(tensors) for x in part)


def report(wait=False):
    """Raises the first deferred error whose answer has arrived (all of them with ``wait``)."""
    while _pending:
        answer, event, message = _pending[0]
        if event is not None:
            if not wait and len(_pending) <= _MAX_PENDING and not event.query():
                return
            event.synchronize()
        _pending.popleft()
        error = message(answer)
        if error is not None:
            _pending.clear()  # one error for a run of failing calls: the first names the call
            raise ValueError(error)


def _defer(answer, message):
    """Keeps the device tensor ``answer`` (one copy to pinned memory on a GPU) for a later
    ``report``, which raises ``message(answer on the host)`` unless that is None: the test runs
    on the host once the values have arrived, so the device runs no op of it."""
    if answer.device.type == "cuda":
        kept = torch.empty(answer.shape, dtype=answer.dtype, pin_memory=True)
        kept.copy_(answer, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
    else:
        kept, event = answer, None
    _pending.append((kept, event, message))


def check_results(results, inputs, message, denominator=(), earlier=True, denominator_entry=None, mixing=None):
    """Raises ``message(entry, what, magnitudes)`` if a tensor of ``results`` (or of the read-out's
    ``denominator``: tensors finite exactly where the read-out can be) is not finite while every
    tensor of ``inputs`` is (dicts by name); first the deferred errors of earlier calls that have
    arrived, unless ``earlier`` is False (the call's own ``check_mixing`` has just reported them).
    Where only the denominator is flagged, the synchronous check names ``denominator_entry()``'s
    entry, if given: the entry the C++ read-out, which multiplies by the denominator's
    reciprocal, would have written infinite. ``mixing``: what ``check_mixing`` returned, whose
    deferred check travels in this one's answer."""
    results = {name: t.detach() for name, t in results.items()}
    first = next(iter(results.values()))
    if _skipped(first):
        return
    if earlier:
        report()
    checked = list(results.values()) + list(denominator)
    if _deferred(first.device):
        names = ", ".join(results)
        # Words, not the tensors: the report must not keep the call's memory alive.
        if denominator:
            names += " (or the read-out's denominator)"
        what = (f"{names} of a call whose check was deferred on {first.device} "
                "(mhla.torch.set_finite_check('sync') names the entry)")
        parts = _parts(checked + list(inputs.values()))
        count = sum(len(part) for part in parts[:len(checked)])
        extremes = [x.view(1) for part in parts for x in part]
        total = len(extremes)
        w, validate = mixing if mixing is not None else (None, None)
        # The report keeps w's shape and dtype, not w: its values travel in the answer.
        w_shape, w_dtype = (None, None) if w is None else (tuple(w.shape), w.dtype)
        answer = torch.cat(extremes + ([] if w is None else [w.reshape(-1)]))
        del w, extremes, parts

        def error(answer):
            if w_shape is not None:
                refused = _refusal(answer[total:].view(w_shape).to(w_dtype), validate)
                if refused is not None:
                    return refused
            finite = [math.isfinite(x) for x in answer[:total].tolist()]
            return message(None, what, []) if all(finite[count:]) and not all(finite[:count]) else None

        # One answer per call: the extremes and w's values (small) in one tensor, one copy to the host.
        _defer(answer, error)
        return
    if _finite_now(checked) or not _finite_now(inputs.values()):
        return
    entry = None
    for name, t in results.items():
        flat = (~torch.isfinite(t)).flatten().nonzero()
        if len(flat):
            index = int(flat[0])
            entry = (name, list(t.shape), index, float(t.flatten()[index]))
            break
    if entry is None and denominator_entry is not None:
        entry = denominator_entry()
    magnitudes = [(name, float(t.detach().abs().max())) for name, t in inputs.items()]
    raise ValueError(message(entry, "", magnitudes))


def _refusal(values, validate):
    """The operator's error for w's ``values`` (on the host), or None."""
    try:
        validate(values)
    except ValueError as error:
        return str(error)
    return None


def check_mixing(w, validate):
    """Refuses a mixing matrix the operator refuses (an entry it reads not finite, or negative in
    the normalized mode): ``validate(values)`` raises the operator's own error for w's values (a
    CPU copy). Checked here when the check is synchronous; otherwise returns what the call's
    ``check_results`` takes as ``mixing``, to check w's values with its results on the host."""
    if _skipped(w):
        return None
    report()
    if not _deferred(w.device):
        validate(w.detach())
        return None
    # A copy on the CPU, where the answer is at hand at once: w may change before the report.
    return w.detach().clone() if w.device.type == "cpu" else w.detach(), validate


class _Watch:
    """What the two watch functions of one call share: the backward's message and the upstream
    gradient, which the output's watch sees first."""

    def __init__(self, message):
        self.message, self.o, self.grad_o = message, None, None


class _WatchOutput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, watch, o):
        ctx.watch = watch
        ctx.save_for_backward(o)
        return o.view_as(o)

    @staticmethod
    def backward(ctx, grad_o):
        ctx.watch.o, ctx.watch.grad_o = ctx.saved_tensors[0], grad_o
        return None, grad_o


class _WatchInputs(torch.autograd.Function):
    """The identity on q, k, v, w; its backward sees exactly the gradients this operator gives
    them, checks them, and passes them on unchanged (differentiably: second-order gradients flow)."""

    @staticmethod
    def forward(ctx, watch, q, k, v, w):
        ctx.watch = watch
        ctx.save_for_backward(q, k, v)
        return q.view_as(q), k.view_as(k), v.view_as(v), w.view_as(w)

    @staticmethod
    def backward(ctx, *grads):
        watch = ctx.watch
        given = {name: g for name, g in zip(("grad_q", "grad_k", "grad_v", "grad_w"), grads) if g is not None}
        if given and watch.grad_o is not None:
            q, k, v = ctx.saved_tensors
            inputs = dict(q=q, k=k, v=v, o=watch.o, grad_o=watch.grad_o)
            check_results(given, {n: t.detach() for n, t in inputs.items()}, watch.message)
        watch.o = watch.grad_o = None
        return (None, *grads)


def watch(q, k, v, w, message):
    """``(q, k, v, w, finish)``: the inputs to compute with, and ``finish(o)`` for the output, so
    that the backward's gradients are checked as the C++ backward checks its own (``message`` as
    for ``check_results``). Nothing is watched without autograd, or where nothing is checked."""
    if not torch.is_grad_enabled() or _skipped(q) or not any(t.requires_grad for t in (q, k, v, w)):
        return q, k, v, w, lambda o: o
    state = _Watch(message)
    q, k, v, w = _WatchInputs.apply(state, q, k, v, w)
    return q, k, v, w, lambda o: _WatchOutput.apply(state, o)
