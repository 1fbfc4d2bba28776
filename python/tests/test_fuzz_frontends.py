"""Differential fuzzing of the Python front ends (mhla.forward/backward on NumPy
and torch, and mhla.torch.mhla_attention with autograd on both of its paths: the
C++ operator and the plain-torch one): random shapes, dtypes, memory orders and
keyword arguments, consistent or with one flaw.

Every call must end in exactly one of two ways: a finite result equal to the
spec reference (mhla._torch_forms.naive, plain torch in float64), or one ValueError,
TypeError or MemoryError with a message. A flawed call that succeeds, any other
exception, a mismatch, or a non-finite result for finite input is a failure. A
flawed mhla.torch call must also be refused with the same words on the other path.
MHLA_PY_FUZZ_CASES sets the number of cases (default 400); the tally is printed.
"""
import collections
import math
import os

import numpy as np
import pytest
import torch

import mhla
import mhla.torch as mt
from mhla._torch_forms import naive as ref

CASES = int(os.environ.get("MHLA_PY_FUZZ_CASES", "400"))
NAMED = (ValueError, TypeError, MemoryError)
NOT_REPRESENTABLE = "is not finite although every input is finite"


def random_layout(rng):
    rank = rng.integers(1, 4)
    if rank == 1:
        n = int(rng.integers(1, 30))
        return mhla.Layout.sequence(n, int(rng.integers(1, n + 1)))
    if rank == 2:
        gh, gw = (int(x) for x in rng.integers(1, 7, size=2))
        return mhla.Layout.grid2d(gh, gw, int(rng.integers(1, gh + 1)), int(rng.integers(1, gw + 1)))
    g = [int(x) for x in rng.integers(1, 4, size=3)]
    return mhla.Layout.grid3d(*g, *(int(rng.integers(1, e + 1)) for e in g))


class Call:
    """One random call: consistent, then maybe one flaw."""

    FLAWS = ["k head dim", "v tokens", "w size", "w rank", "empty batch", "layout tokens", "negative w", "nan w",
             "float16 q", "int64 v", "dtype mix", "fortran order", "not a tensor", "unknown masking",
             "unknown feature map", "bad eps", "scale with normalize", "causal on a grid", "toeplitz without mask",
             "q rank 3"]

    def __init__(self, seed):
        rng = np.random.default_rng(seed)
        self.seed = seed
        self.layout = random_layout(rng)
        rank = self.layout.rank
        self.kwargs = dict(masking=str(rng.choice(["none", "block_causal"] + (["causal"] if rank == 1 else []))),
                           feature_map=str(rng.choice(["identity", "relu", "elu1"])),
                           normalize=bool(rng.random() < 0.75))
        if not self.kwargs["normalize"] and rng.random() < 0.3:
            self.kwargs["scale"] = float(rng.uniform(0.1, 2))
        toeplitz = self.kwargs["masking"] != "none" and rng.random() < 0.3
        if toeplitz:
            self.kwargs["mixing"] = "toeplitz"
        self.dtype = np.float32 if rng.random() < 0.5 else np.float64
        self.api = str(rng.choice(["numpy", "torch", "autograd", "autograd-torch"]))
        b, h = int(rng.integers(1, 3)), int(rng.integers(1, 4))
        dk, dv, n, m = int(rng.integers(1, 6)), int(rng.integers(1, 6)), self.layout.num_tokens, self.layout.num_blocks
        per_head = rng.random() < 0.4
        length = int(rng.integers(0, 5))
        w_shape = ([h] if per_head else []) + ([length + 1] if toeplitz else [m, m])
        identity_normalized = self.kwargs["feature_map"] == "identity" and self.kwargs["normalize"]
        low = 0.05 if identity_normalized else -1.0
        magnitude = float(rng.choice([1, 1, 1, 1, 1, 1e-3, 1e3, 1e19 if self.dtype == np.float32 else 1e155]))
        self.q = (rng.uniform(low, 1, (b, n, h, dk)) * magnitude).astype(self.dtype)
        self.k = (rng.uniform(low, 1, (b, n, h, dk)) * magnitude).astype(self.dtype)
        self.v = rng.uniform(-1, 1, (b, n, h, dv)).astype(self.dtype)
        self.w = rng.uniform(0.05 if self.kwargs["normalize"] else -1, 1, w_shape).astype(self.dtype)
        self.grad_o = rng.uniform(-1, 1, (b, n, h, dv)).astype(self.dtype)
        self.flaw = None
        if rng.random() < 0.5:
            for _ in range(32):
                flaw = str(rng.choice(self.FLAWS))
                with np.errstate(over="ignore"):  # casting 1e19 to float16 is part of the point
                    applied = self._apply(flaw, rng)
                if applied:
                    self.flaw = flaw
                    break

    def _apply(self, flaw, rng):
        kw = self.kwargs
        if flaw == "k head dim":
            self.k = np.concatenate([self.k, self.k[..., :1]], axis=-1)
        elif flaw == "v tokens":
            self.v = np.concatenate([self.v, self.v[:, :1]], axis=1)
        elif flaw == "w size":
            if kw.get("mixing") == "toeplitz":
                return False  # any Toeplitz length is valid
            self.w = np.pad(self.w, [(0, 0)] * (self.w.ndim - 2) + [(0, 1), (0, 1)], constant_values=0.5)
        elif flaw == "w rank":
            self.w = self.w[None, None]
        elif flaw == "empty batch":
            self.q, self.k, self.v, self.grad_o = (x[:0] for x in (self.q, self.k, self.v, self.grad_o))
        elif flaw == "layout tokens":
            self.layout = mhla.Layout.sequence(self.layout.num_tokens + 1, 1)
        elif flaw == "negative w":
            if not kw["normalize"]:
                return False
            self.w.reshape(-1)[-1 if kw.get("mixing") == "toeplitz" else -self.w.shape[-1]] = -0.5
        elif flaw == "nan w":
            self.w.reshape(-1)[0] = np.nan
        elif flaw == "float16 q":
            self.q = self.q.astype(np.float16)
        elif flaw == "int64 v":
            self.v = self.v.astype(np.int64)
        elif flaw == "dtype mix":
            self.k = self.k.astype(np.float64 if self.dtype == np.float32 else np.float32)
        elif flaw == "fortran order":
            if self.api.startswith("autograd") or self.q.ndim != 4 or self.q.size < 2 or self.q.flags.f_contiguous:
                return False  # torch autograd makes operands contiguous, as torch ops do
            self.q = np.asfortranarray(self.q)
        elif flaw == "not a tensor":
            self.v = self.v.tolist()
        elif flaw == "unknown masking":
            kw["masking"] = "sideways"
        elif flaw == "unknown feature map":
            kw["feature_map"] = "softmax"
        elif flaw == "bad eps":
            kw["eps"] = float(rng.choice([-1e-3, math.nan]))
        elif flaw == "scale with normalize":
            if not kw["normalize"]:
                return False
            kw["scale"] = 0.5
        elif flaw == "causal on a grid":
            if self.layout.rank == 1:
                return False
            kw["masking"] = "causal"
        elif flaw == "toeplitz without mask":
            if kw.get("mixing") != "toeplitz":
                return False
            kw["masking"] = "none"
        elif flaw == "q rank 3":
            self.q = self.q[0]
        return True

    def __repr__(self):
        return (f"seed {self.seed}: {self.api}, {self.layout!r}, {self.kwargs}, {np.dtype(self.dtype).name}, "
                f"q {getattr(self.q, 'shape', None)} v {np.shape(self.v)} w {self.w.shape}, flaw {self.flaw}")


def as_torch(x):
    return torch.from_numpy(x) if isinstance(x, np.ndarray) else x


BACKENDS = {"autograd": "cpp", "autograd-torch": "torch"}


def run(call, api=None):
    """Runs the call through its front end (``api``, call.api by default); returns (o, grads) as
    float64 torch tensors."""
    kw = dict(call.kwargs)
    api = api or call.api
    if api in BACKENDS:
        q, k, v, w = (as_torch(x) for x in (call.q, call.k, call.v, call.w))
        leaves = [t.clone().requires_grad_() if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                  for t in (q, k, v, w)]
        o = mt.mhla_attention(*leaves, call.layout, backend=BACKENDS[api], **kw)
        o.backward(as_torch(call.grad_o))
        return o.detach().double(), [t.grad.double() for t in leaves]
    convert = as_torch if api == "torch" else (lambda x: x)
    q, k, v, w, g = (convert(x) for x in (call.q, call.k, call.v, call.w, call.grad_o))
    o = mhla.forward(q, k, v, w, layout=call.layout, **kw)
    grads = mhla.backward(q, k, v, w, o, g, layout=call.layout, **kw)
    return as_torch(np.asarray(o) if api == "numpy" else o).double(), [
        as_torch(np.asarray(x) if api == "numpy" else x).double() for x in grads]


def other_path_refuses_alike(call, error):
    """A flawed mhla.torch call: the other backend's error must be the same, word for word."""
    other = {"autograd": "autograd-torch", "autograd-torch": "autograd"}.get(call.api)
    if other is None:
        return
    try:
        run(call, other)
    except NAMED as other_error:
        assert (type(other_error), str(other_error)) == (type(error), str(error)), \
            f"{call}: {call.api} says {error!r}, {other} says {other_error!r}"
        return
    raise AssertionError(f"{call}: {call.api} refused it ({error}), {other} accepted it")


def reference(call):
    q, k, v, w = (torch.from_numpy(np.asarray(x, dtype=np.float64)).requires_grad_() for x in
                  (call.q, call.k, call.v, call.w))
    o = ref.mhla_attention(q, k, v, w, call.layout, **call.kwargs)
    o.backward(torch.from_numpy(call.grad_o.astype(np.float64)))
    return o.detach(), [t.grad for t in (q, k, v, w)]


def relative_error(got, want):
    return float((got - want).abs().max() / max(float(want.abs().max()), 1.0))


def check(call, tally):
    try:
        o, grads = run(call)
    except NAMED as error:
        message = str(error)
        assert message, f"{call}: {type(error).__name__} without a message"
        if call.flaw is None:
            assert NOT_REPRESENTABLE in message, f"{call}: consistent call refused: {message}"
            tally["named error: consistent, result not representable"] += 1
        else:
            other_path_refuses_alike(call, error)
            tally[f"named error: {call.flaw}"] += 1
        return
    assert call.flaw is None, f"{call}: flawed input was accepted"
    for name, got in zip(["o", "grad_q", "grad_k", "grad_v", "grad_w"], [o] + grads):
        assert torch.isfinite(got).all(), f"{call}: non-finite {name} returned without an error"
    want_o, want_grads = reference(call)
    tol = 2e-3 if call.dtype == np.float32 else 1e-8
    for name, got, want in zip(["o", "grad_q", "grad_k", "grad_v", "grad_w"], [o] + grads, [want_o] + want_grads):
        if not torch.isfinite(want).all():
            break  # the float64 reference itself overflowed: nothing to compare
        err = relative_error(got, want)
        assert err <= (tol if name == "o" else 10 * tol), f"{call}: {name} differs from the reference by {err}"
    tally[f"success: consistent, {call.api}"] += 1


def test_every_call_ends_in_a_reference_result_or_a_named_error(capsys):
    tally = collections.Counter()
    for seed in range(1, CASES + 1):
        check(Call(seed), tally)
    successes = sum(n for kind, n in tally.items() if kind.startswith("success"))
    with capsys.disabled():
        print(f"\nPython fuzzing: {CASES} cases: {successes} succeeded and matched the reference, "
              f"{CASES - successes} named errors, 0 failures")
        for kind, n in sorted(tally.items()):
            print(f"  {kind:60s} {n}")
    # Both kinds of outcome must have been exercised, or the fuzzer tests nothing.
    assert successes > CASES // 5 and CASES - successes > CASES // 5
