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
(mode "auto") the whole test runs on the device and its one-byte answer is copied to pinned
memory behind an event; a later call, or ``report(wait=True)`` (``mhla.torch.check_finite_results``),
raises the error once that event has passed, and never waits for it otherwise. Mode "sync" gives
the synchronous check (the entry and the cause named) on every device, "deferred" the deferred
one on every device (on the CPU its answer is at hand at once, so it is reported by the next call).

Meta tensors hold no values and are not checked. Under ``torch.compile`` the plain-torch path is
not checked: a data-dependent error cannot be traced into a graph.
"""
import collections

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


def _all_finite(tensors):
    """One device boolean: every entry of every tensor is finite. Through the extremes: NaN
    propagates into ``aminmax`` (documented), infinity is an extreme, and finite entries never
    overflow a minimum: exact, in one reduction per tensor without temporaries
    (``isfinite(t).all()`` costs about 20x that on a CPU, for its boolean tensor). The group's
    extremes are then tested together: ``x * 0`` is 0 for finite x and NaN otherwise, so their
    sum is 0 exactly when all are finite (four small ops for the group, whatever its size)."""
    extremes = [e for t in tensors for e in _extremes(t)]
    return torch.stack(extremes).mul(0).sum().eq(0)


def _extremes(t):
    if t.dtype == torch.float16 and t.device.type == "cpu":
        # torch 1.13's CPU aminmax has no float16 kernel; a float32 sum of float16 values cannot
        # overflow (65504 N stays below float32's range), so it is finite exactly when they are.
        return (t.sum(dtype=torch.float32),)
    return torch.aminmax(t)


def report(wait=False):
    """Raises the first deferred error whose answer has arrived (all of them with ``wait``)."""
    while _pending:
        answer, event, message = _pending[0]
        if event is not None:
            if not wait and len(_pending) <= _MAX_PENDING and not event.query():
                return
            event.synchronize()
        _pending.popleft()
        if bool(answer):
            _pending.clear()  # one error for a run of failing calls: the first names the call
            raise ValueError(message())


def _defer(failed, message):
    """Keeps the device boolean ``failed`` for a later ``report``."""
    if failed.device.type == "cuda":
        answer = torch.empty((), dtype=torch.bool, pin_memory=True)
        answer.copy_(failed, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
    else:
        answer, event = failed, None
    _pending.append((answer, event, message))


def check_results(results, inputs, message, denominator=None, earlier=True, denominator_entry=None):
    """Raises ``message(entry, what, magnitudes)`` if a tensor of ``results`` (or the read-out's
    ``denominator``) is not finite while every tensor of ``inputs`` is (dicts by name); first
    the deferred errors of earlier calls that have arrived, unless ``earlier`` is False (the
    call's own ``check_mixing`` has just reported them). Where only the denominator is flagged,
    the synchronous check names ``denominator_entry()``'s entry, if given: the entry the C++
    read-out, which multiplies by the denominator's reciprocal, would have written infinite."""
    results = {name: t.detach() for name, t in results.items()}
    first = next(iter(results.values()))
    if _skipped(first):
        return
    if earlier:
        report()
    checked = list(results.values()) + ([] if denominator is None else [denominator])
    if _deferred(first.device):
        names = ", ".join(results)
        # Words, not the tensors: the report must not keep the call's memory alive.
        if denominator is not None:
            names += " (or the read-out's denominator)"
        what = (f"{names} of a call whose check was deferred on {first.device} "
                "(mhla.torch.set_finite_check('sync') names the entry)")
        failed = ~_all_finite(checked) & _all_finite(list(inputs.values()))
        _defer(failed, lambda: message(None, what, []))
        return
    if bool(_all_finite(checked)) or not bool(_all_finite(list(inputs.values()))):
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


def check_mixing(w, read, normalize, validate):
    """Refuses a mixing matrix the operator refuses: an entry of ``w`` where ``read`` (a boolean
    mask, or None for all) is not finite, or negative when ``normalize``. ``validate(values)``
    raises the operator's own error for w's values (a CPU copy)."""
    if _skipped(w):
        return
    report()
    if not _deferred(w.device):
        validate(w.detach())
        return
    w = w.detach()
    refused = ~torch.isfinite(w) | (w < 0) if normalize else ~torch.isfinite(w)
    if read is not None:
        refused = refused & read
    # w is small: a copy is kept, so that the report gives the operator's own words.
    kept = w.clone()

    def message():
        try:
            validate(kept.cpu())
        except ValueError as error:
            return str(error)
        return "w holds a value that is not finite or is negative"

    _defer(refused.any(), message)


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
