"""One contract on both paths of mhla.torch: the C++ operator (backend="cpp") and the plain-torch
path (backend="torch", what tensors on a GPU run) give the same result or the same named error for
every kind of bad input of docs/bad-input.md, never silent NaN, infinity or zeros for finite
input, and second-order gradients on both (or, with context parallelism, an error by name).

The torch path's deferred check (the default on devices other than the CPU) is tested here on the
CPU with set_finite_check("deferred"), where its answer is at hand at once."""
import math

import pytest
import torch

import mhla
import mhla.torch as mt

L = mhla.Layout
BACKENDS = ("cpp", "torch")


def outcome(call):
    """("ok", result) or (error type, message) of ``call()``."""
    try:
        return "ok", call()
    except (ValueError, TypeError) as error:
        return type(error).__name__, str(error)


def same_outcome(make_call):
    """Runs ``make_call(backend)()`` on both paths; asserts that they agree; returns the outcome."""
    got = [outcome(make_call(backend)) for backend in BACKENDS]
    (kind, value), (other_kind, other_value) = got
    assert kind == other_kind, got
    if kind == "ok":
        for a, b in zip(value if isinstance(value, tuple) else (value,),
                        other_value if isinstance(other_value, tuple) else (other_value,)):
            assert torch.isfinite(a).all() and torch.isfinite(b).all()
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    else:
        assert value == other_value, got
    return kind, value


def seq(n=8, block=4):
    return L.sequence(n, block)


def rand(*shape, dtype=torch.float64, seed=0, low=0.0, high=1.0):
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(*shape, dtype=dtype, generator=gen) * (high - low) + low


def qkvw(n=8, heads=2, dk=3, dv=4, m=2, dtype=torch.float64):
    return rand(1, n, heads, dk, dtype=dtype, seed=1), rand(1, n, heads, dk, dtype=dtype, seed=2), \
        rand(1, n, heads, dv, dtype=dtype, seed=3), torch.full((m, m), 0.5, dtype=dtype)


def forward_call(q, k, v, w, layout, **options):
    return lambda backend: lambda: mt.mhla_attention(q, k, v, w, layout, backend=backend, **options)


# ---- where the paths used to disagree: silent NaN and zeros on the torch path ----

def test_a_w_row_that_reads_nothing_with_eps_zero_is_an_error_on_both_paths():
    q = k = v = torch.randn(1, 4, 1, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    w = torch.tensor([[0., 0.], [1., 1.]], dtype=torch.float64)
    kind, message = same_outcome(forward_call(q, k, v, w, seq(4, 2), eps=0.0))
    assert kind == "ValueError" and "is not finite although every input is finite" in message
    assert "eps = 0 with all-zero features gives 0 / 0" in message


def test_an_overflowing_denominator_is_an_error_not_silent_zeros():
    x = torch.full((1, 4, 1, 2), 1e19)
    v = torch.randn(1, 4, 1, 2, generator=torch.Generator().manual_seed(0))
    kind, message = same_outcome(forward_call(x, x, v, torch.ones(1, 1), seq(4, 4)))
    assert kind == "ValueError" and "not finite although every input is finite" in message
    assert "|q| <= 1e+19" in message and "overflows float32" in message


# ---- results that are not representable (docs/bad-input.md) ----

def _unrepresentable_cases():
    g = torch.Generator().manual_seed(4)
    half = torch.full((1, 16, 2, 4), 0.5)
    big19, big30 = torch.full((1, 16, 2, 4), 1e19), torch.full((1, 16, 2, 4), 1e30)
    w = torch.as_tensor(mhla.init_mixing(seq(16, 4)))
    zero = torch.zeros(1, 8, 2, 3, dtype=torch.float64)
    minus = torch.full((1, 8, 2, 3), -1.0)
    k_cancel = torch.tensor([1.0, -1.0], dtype=torch.float64).view(1, 2, 1, 1)
    one = torch.ones(1, 2, 1, 1, dtype=torch.float64)
    vmax = torch.full((1, 16, 2, 4), 3e38)
    return {
        "float32 q, k at 1e19, elu1": (big19, big19, half, w, seq(16, 4), {}),
        "float32 q, k at 1e19, small v (denominator only)": (big19, big19, half * 2e-3, w, seq(16, 4), {}),
        "float32 q, k at 1e30": (big30, big30, half, w, seq(16, 4), {}),
        "bfloat16 q, k at 1e30": (big30.bfloat16(), big30.bfloat16(), half.bfloat16(), w, seq(16, 4), {}),
        "v near float32's maximum": (half, half, vmax, w, seq(16, 4), {}),
        "unnormalized overflow": (big19, big19, half, w, seq(16, 4), dict(normalize=False)),
        "eps = 0 with all-zero relu features": (minus, minus, torch.rand(1, 8, 2, 4, generator=g), w[:2, :2] * 0 + .5,
                                                seq(8, 4), dict(feature_map="relu", eps=0.0)),
        "eps = 0, float64 zeros": (zero, zero, torch.rand(1, 8, 2, 4, dtype=torch.float64, generator=g),
                                   torch.full((2, 2), .5, dtype=torch.float64), seq(8, 4),
                                   dict(feature_map="relu", eps=0.0)),
        "identity features whose sums cancel": (one, k_cancel, one, torch.ones(1, 1, dtype=torch.float64),
                                                seq(2, 2), dict(feature_map="identity", eps=0.0)),
    }


UNREPRESENTABLE = _unrepresentable_cases()


@pytest.mark.parametrize("name", UNREPRESENTABLE)
def test_unrepresentable_results_are_the_same_named_error_on_both_paths(name, reduction):
    q, k, v, w, layout, options = UNREPRESENTABLE[name]
    kind, message = same_outcome(forward_call(q, k, v, w, layout, **options))
    assert kind == "ValueError", (name, message)
    assert "is not finite although every input is finite" in message, message


def test_non_finite_inputs_propagate_on_both_paths():
    q, k, v, w = qkvw()
    v = v.clone()
    v[0, 3, 1, 2] = math.nan
    for backend in BACKENDS:
        assert torch.isnan(mt.mhla_attention(q, k, v, w, seq(), backend=backend)).any()


def test_overflowing_gradients_are_the_same_named_error_on_both_paths():
    # den = 1e-200, o = 1: grad_o = 1e200 gives grad_v = grad_o / den = inf.
    def call(backend):
        def run():
            q = torch.full((1, 1, 1, 1), 1e-200, dtype=torch.float64, requires_grad=True)
            k, v = (torch.ones(1, 1, 1, 1, dtype=torch.float64, requires_grad=True) for _ in range(2))
            w = torch.ones(1, 1, dtype=torch.float64, requires_grad=True)
            o = mt.mhla_attention(q, k, v, w, seq(1, 1), feature_map="identity", eps=0.0, backend=backend)
            return torch.autograd.grad(o, (q, k, v, w), torch.full_like(o, 1e200))
        return run
    kind, message = same_outcome(call)
    assert kind == "ValueError" and message.startswith("mhla::backward: grad_"), message
    assert "not finite although every input is finite" in message


# ---- every other kind of bad input of docs/bad-input.md ----

def _bad_inputs():
    q, k, v, w = qkvw()
    return {
        "k's head dim": (q, k[..., :2], v, w, seq(), {}),
        "v's tokens": (q, k, v[:, :7], w, seq(), {}),
        "an empty batch": (q[:0], k[:0], v[:0], w, seq(), {}),
        "q of rank 3": (q[0], k, v, w, seq(), {}),
        "w of the wrong size": (q, k, v, torch.full((3, 3), .5, dtype=torch.float64), seq(), {}),
        "layout of other N": (q, k, v, w, seq(9, 4), {}),
        "causal on a grid": (q, k, v, torch.full((4, 4), .5, dtype=torch.float64), L.grid2d(2, 4, 1, 2),
                             dict(masking="causal")),
        "toeplitz without masking": (q, k, v, w[0], seq(), dict(mixing="toeplitz")),
        "integer q": (q.long(), k, v, w, seq(), {}),
        "mixed dtypes": (q, k.float(), v, w, seq(), {}),
        "integer w": (q, k, v, torch.ones(2, 2, dtype=torch.int64), seq(), {}),
        "not a tensor": (q, k, v.tolist(), w, seq(), {}),
        "negative w": (q, k, v, torch.tensor([[.5, .5], [-.5, 1.]], dtype=torch.float64), seq(), {}),
        "NaN w": (q, k, v, torch.tensor([[math.nan, .5], [.5, .5]], dtype=torch.float64), seq(), {}),
        "infinite per-head w": (q, k, v, torch.tensor([[[.5, .5], [.5, math.inf]]] * 2, dtype=torch.float64),
                                seq(), {}),
        "negative toeplitz w": (q, k, v, torch.tensor([.5, -1.], dtype=torch.float64), seq(),
                                dict(masking="causal", mixing="toeplitz")),
        "negative eps": (q, k, v, w, seq(), dict(eps=-1.0)),
        "NaN eps": (q, k, v, w, seq(), dict(eps=math.nan)),
        "scale in the normalized mode": (q, k, v, w, seq(), dict(scale=0.5)),
        "unknown masking": (q, k, v, w, seq(), dict(masking="sideways")),
        "unknown feature map": (q, k, v, w, seq(), dict(feature_map="softmax")),
        "k on another device": (q, k.to("meta"), v, w, seq(), {}),
        "w on another device": (q, k, v, w.to("meta"), seq(), {}),
    }


BAD_INPUTS = _bad_inputs()


@pytest.mark.parametrize("name", BAD_INPUTS)
def test_every_kind_of_bad_input_gets_the_same_named_error_on_both_paths(name):
    q, k, v, w, layout, options = BAD_INPUTS[name]
    kind, message = same_outcome(forward_call(q, k, v, w, layout, **options))
    assert kind in ("ValueError", "TypeError"), (name, message)
    assert message


def test_a_negative_weight_the_masking_never_reads_is_accepted_on_both_paths():
    q, k, v, _ = qkvw()
    w = torch.tensor([[.5, -1.], [.5, .5]], dtype=torch.float64)  # W[0, 1]: above the diagonal
    kind, _ = same_outcome(forward_call(q, k, v, w, seq(), masking="causal"))
    assert kind == "ok"


def test_devices_are_one_per_call_on_the_torch_path():
    q, k, v, w = qkvw()
    meta = q.to("meta")
    with pytest.raises(ValueError, match=r"mhla::forward: k is on cpu but q is on meta; pass every tensor"):
        mt.mhla_attention(meta, k, v, w, seq())  # the torch path: q is not on the CPU
    with pytest.raises(ValueError, match=r"w is on cpu but q is on meta"):
        mt.mhla_attention(meta, k.to("meta"), v.to("meta"), w, seq())
    with pytest.raises(ValueError, match=r"mhla::varlen_forward: v is on meta but q is on cpu"):
        mt.varlen_attention(q, k, v.to("meta"), w, [0, 8], block=4)
    with pytest.raises(ValueError, match=r"mhla::linear_attention_forward: k is on meta but q is on cpu"):
        mt.linear_attention(q, meta, v)


def test_the_layers_refuse_a_mixing_matrix_the_operator_refuses_on_both_paths():
    torch.manual_seed(0)
    layer = mt.MHLA2d(8, 2, grid=(4, 4), tile=(2, 2)).double()
    with torch.no_grad():
        layer.mixing.logits[1, 2] = math.nan
    x = torch.randn(2, 16, 8, dtype=torch.float64)
    messages = []
    for backend in BACKENDS:
        layer.backend = backend
        with pytest.raises(ValueError) as error:
            layer(x)
        messages.append(str(error.value))
    assert messages[0] == messages[1] and "w[1, 0] is not finite (" in messages[0], messages


def test_the_torch_decoder_takes_float32_as_the_cpp_decoder_does():
    w = torch.full((2, 2), 0.5)
    for backend in BACKENDS:
        decoder = mhla.Decoder(w, heads=1, dk=2, dv=2, block=2, backend=backend)
        q = torch.rand(1, 1, 1, 2, dtype=torch.float64)
        with pytest.raises(TypeError, match=r"q has dtype float64; the decoder computes in float32 \(convert"):
            decoder.step(q, q, q)
        with pytest.raises(TypeError, match=r"has dtype float64; the decoder computes in float32"):
            decoder.prefill(0, q, q, q)


# ---- the deferred check ----

@pytest.fixture(params=["extremes", "norms"])
def reduction(request, monkeypatch):
    """Each of the check's reductions: the CPU's aminmax per tensor, and the one _foreach_norm of a
    group that other devices take."""
    monkeypatch.setattr(mhla._finite_results, "_uses_norms", lambda device: request.param == "norms")


@pytest.fixture
def deferred(reduction):
    previous = mt.set_finite_check("deferred")
    yield
    mt.set_finite_check(previous)
    mhla._finite_results._pending.clear()


def test_a_deferred_error_is_raised_by_the_next_call_or_the_explicit_check(deferred):
    q, k, v, w, layout, options = UNREPRESENTABLE["float32 q, k at 1e19, elu1"]
    good = [t.float() for t in qkvw()]
    mt.mhla_attention(q, k, v, w, layout, backend="torch", **options)  # no wait for the answer: no error yet
    with pytest.raises(ValueError, match=r"^mhla::forward: o \(or the read-out's denominator\) of a call whose "
                                         r"check was deferred on cpu .*not finite although every input is finite: "
                                         r"the normalized read-out"):
        mt.mhla_attention(*good, seq(), backend="torch")
    mt.mhla_attention(*good, seq(), backend="torch")  # reported once
    mt.mhla_attention(q, k, v, w, layout, backend="torch", **options)
    with pytest.raises(ValueError, match="of a call whose check was deferred"):
        mt.check_finite_results()
    mt.check_finite_results()


def test_a_deferred_mixing_check_gives_the_operators_words(deferred):
    q, k, v, w = BAD_INPUTS["negative w"][:4]
    mt.mhla_attention(q, k, v, w, seq(), backend="torch")
    with pytest.raises(ValueError, match=r"^mhla::forward: w\[1, 0\] = -0.500000 is negative"):
        mt.check_finite_results()


def test_the_deferred_mixing_check_refuses_what_the_operator_reads_as_it_was_at_the_call(deferred):
    q, k, v, _ = (t.float() for t in qkvw())
    m = seq().num_blocks
    w = torch.rand(m, m) + 0.1
    w[0, 1] = float("nan")  # above the diagonal: causal masking never reads it
    mt.mhla_attention(q, k, v, w, seq(), masking="causal", backend="torch")
    w[1, 0] = -1.0  # after the call: not what the call read
    mt.check_finite_results()
    mt.mhla_attention(q, k, v, w, seq(), masking="causal", backend="torch")
    with pytest.raises(ValueError, match=r"^mhla::forward: w\[1, 0\] = -1.000000 is negative"):
        mt.check_finite_results()


def test_the_deferred_check_keeps_no_tensor_of_the_call_alive(deferred):
    import weakref
    q, k, v, w = (t.float() for t in qkvw())
    refs = [weakref.ref(t) for t in (q, k, v, w)]
    o = mt.mhla_attention(q, k, v, w, seq(), backend="torch")
    out = weakref.ref(o)
    del q, k, v, w, o
    assert all(r() is None for r in refs + [out])


def test_unknown_finite_check_modes_are_named():
    with pytest.raises(ValueError, match="unknown finite-check mode 'never'; expected one of auto, sync, deferred"):
        mt.set_finite_check("never")


# ---- second-order gradients ----

def _second_order_inputs():
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 8, 1, 4, dtype=torch.float64, generator=gen).requires_grad_() for _ in range(3))
    w = (torch.rand(2, 2, dtype=torch.float64, generator=gen) + .1).requires_grad_()
    return q, k, v, w


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_gradient_penalty_reaches_every_input_on_both_paths(backend):
    q, k, v, w = _second_order_inputs()
    o = mt.mhla_attention(q, k, v, w, seq(8, 4), backend=backend)
    (gq,) = torch.autograd.grad(o.sum(), q, create_graph=True)
    assert gq.requires_grad
    penalty = gq.square().sum()
    got = torch.autograd.grad(o.square().sum() + penalty, (q, k, v, w))
    # The reference: the same graph on the torch path.
    q2, k2, v2, w2 = (t.detach().clone().requires_grad_() for t in (q, k, v, w))
    o2 = mt.mhla_attention(q2, k2, v2, w2, seq(8, 4), backend="torch")
    (gq2,) = torch.autograd.grad(o2.sum(), q2, create_graph=True)
    without = torch.autograd.grad(o2.square().sum(), (q2, k2, v2, w2), retain_graph=True)
    want = torch.autograd.grad(o2.square().sum() + gq2.square().sum(), (q2, k2, v2, w2))
    assert float((want[1] - without[1]).abs().max()) > 1e-3  # the penalty's term is not negligible
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("masking", ["none", "causal"])
def test_second_derivatives_of_the_cpp_path_match_finite_differences(masking):
    q, k, v, w = (t.detach()[:, :, :, :2].clone().requires_grad_() if t.dim() == 4 else t
                  for t in _second_order_inputs())
    assert torch.autograd.gradgradcheck(
        lambda q, k, v, w: mt.mhla_attention(q, k, v, w, seq(8, 4), masking=masking, backend="cpp"), (q, k, v, w))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_second_order_gradients_flow_through_reduced_precision_on_the_cpp_path(dtype):
    q, k, v, w = (t.detach().to(dtype if t.dim() == 4 else torch.float32).requires_grad_()
                  for t in _second_order_inputs())
    o = mt.mhla_attention(q, k, v, w, seq(8, 4), backend="cpp")
    (gk,) = torch.autograd.grad(o.float().square().sum(), k, create_graph=True)
    assert gk.dtype == dtype and gk.requires_grad
    (gqq,) = torch.autograd.grad(gk.float().sum(), q)
    assert gqq.dtype == dtype and torch.isfinite(gqq).all() and gqq.abs().sum() > 0


def test_the_baselines_and_varlen_give_second_order_gradients_on_the_cpp_path():
    gen = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 6, 1, 2, dtype=torch.float64, generator=gen).requires_grad_() for _ in range(3))
    w = torch.full((2, 2), 0.5, dtype=torch.float64, requires_grad=True)
    for f in (lambda q, k, v: mt.linear_attention(q, k, v, masking="causal", backend="cpp"),
              lambda q, k, v: mt.softmax_attention(q, k, v, causal=True, backend="cpp"),
              lambda q, k, v: mt.varlen_attention(q, k, v, w, [0, 4, 6], block=2, backend="cpp")):
        assert torch.autograd.gradgradcheck(f, (q, k, v))


# ---- on a GPU (bench/gpu_check.py runs this file there; skipped elsewhere) ----

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
def test_on_cuda_the_check_is_deferred_by_default_and_waits_for_nothing():
    q, k, v, w, layout, options = UNREPRESENTABLE["float32 q, k at 1e19, elu1"]
    q, k, v, w = (t.cuda() for t in (q, k, v, w))
    torch.cuda.synchronize()
    torch.cuda._sleep(100_000_000)  # keep the stream busy: a call that waited would wait for this
    mt.mhla_attention(q, k, v, w, layout)  # returns before the device has computed anything
    assert not torch.cuda.current_stream().query()
    with pytest.raises(ValueError, match=r"^mhla::forward: o \(or the read-out's denominator\) of a call whose "
                                         r"check was deferred on cuda:0"):
        mt.check_finite_results()
    mt.mhla_attention(*(t.cuda() for t in qkvw()), seq())
    mt.check_finite_results()


@cuda
def test_on_cuda_the_synchronous_check_names_the_entry_as_on_the_cpu():
    q, k, v, w, layout, options = UNREPRESENTABLE["float32 q, k at 1e19, elu1"]
    with pytest.raises(ValueError) as on_cpu:
        mt.mhla_attention(q, k, v, w, layout, backend="torch")
    previous = mt.set_finite_check("sync")
    try:
        with pytest.raises(ValueError) as on_cuda:
            mt.mhla_attention(*(t.cuda() for t in (q, k, v, w)), layout)
    finally:
        mt.set_finite_check(previous)
    assert str(on_cuda.value) == str(on_cpu.value)


@cuda
def test_on_cuda_a_deferred_mixing_error_has_the_operators_words():
    q, k, v, w = (t.cuda() for t in BAD_INPUTS["negative w"][:4])
    mt.mhla_attention(q, k, v, w, seq())
    with pytest.raises(ValueError, match=r"^mhla::forward: w\[1, 0\] = -0.500000 is negative"):
        mt.check_finite_results()
