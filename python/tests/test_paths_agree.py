"""The C++ path and the plain-torch path give the same answer at the edges: the same result where
the exact one is representable, and otherwise the same named error, in the same words."""
import re

import pytest
import torch

import mhla
import mhla.torch as mt

BACKENDS = ("cpp", "torch")
LAYOUT = mhla.Layout.sequence(64, 16)
W = torch.tensor(mhla.init_mixing(LAYOUT))


def outcome(call):
    """The result, or the error's type and words."""
    try:
        return call()
    except (ValueError, TypeError) as error:
        return f"{type(error).__name__}: {error}"


def on_both(make_call):
    return [outcome(lambda: make_call(backend)) for backend in BACKENDS]


# --- the streaming decoder -------------------------------------------------------------------

def _decoder(backend, **options):
    kwargs = dict(heads=2, dk=4, dv=4, block=16)
    kwargs.update(options)
    return mhla.Decoder(kwargs.pop("w", W), backend=backend, **kwargs)


def _r(*shape):
    return torch.rand(*shape)


DECODER_CASES = {
    "w of rank 1": (dict(w=torch.rand(4)), None),
    "w not square": (dict(w=torch.rand(4, 3)), None),
    "w of int32": (dict(w=torch.ones(4, 4, dtype=torch.int32)), None),
    "w of float64": (dict(w=W.double()), None),
    "w not finite": (dict(w=W.clone().fill_(float("nan"))), None),
    "w negative, normalized": (dict(w=-W), None),
    "w per head of other heads": (dict(w=torch.rand(3, 4, 4)), None),
    "Toeplitz w of other heads": (dict(w=torch.rand(3, 5), mixing="toeplitz"), None),
    "no heads": (dict(heads=0), None),
    "dk 0": (dict(dk=0), None),
    "block 0": (dict(block=0), None),
    "batch 0": (dict(batch=0), None),
    "negative eps": (dict(eps=-1.0), None),
    "eps NaN": (dict(eps=float("nan")), None),
    "scale NaN": (dict(scale=float("nan"), normalize=False), None),
    "unknown feature map": (dict(feature_map="nope"), None),
    "q narrower than k": ({}, lambda d: d.step(_r(1, 1, 2, 3), _r(1, 1, 2, 4), _r(1, 1, 2, 4))),
    "v wider": ({}, lambda d: d.step(_r(1, 1, 2, 4), _r(1, 1, 2, 4), _r(1, 1, 2, 5))),
    "two tokens a step": ({}, lambda d: d.step(_r(1, 2, 2, 4), _r(1, 2, 2, 4), _r(1, 2, 2, 4))),
    "rank 3 tokens": ({}, lambda d: d.step(_r(1, 2, 4), _r(1, 2, 4), _r(1, 2, 4))),
    "bfloat16 tokens": ({}, lambda d: d.step(*(_r(1, 1, 2, 4).bfloat16() for _ in range(3)))),
    "a list for q": ({}, lambda d: d.step([[[[1.0] * 4] * 2]], _r(1, 1, 2, 4), _r(1, 1, 2, 4))),
    "prefill of sequence 1 of 1": ({}, lambda d: d.prefill(1, _r(1, 3, 2, 4), _r(1, 3, 2, 4), _r(1, 3, 2, 4))),
    "prefill of two sequences": ({}, lambda d: d.prefill(0, _r(2, 3, 2, 4), _r(2, 3, 2, 4), _r(2, 3, 2, 4))),
    "empty prompt": ({}, lambda d: d.prefill(0, _r(1, 0, 2, 4), _r(1, 0, 2, 4), _r(1, 0, 2, 4))),
    "prefill twice": ({}, lambda d: [d.prefill(0, _r(1, 3, 2, 4), _r(1, 3, 2, 4), _r(1, 3, 2, 4))
                                     for _ in range(2)]),
    "position of sequence 5": ({}, lambda d: d.position(5)),
    "reset of sequence 5": ({}, lambda d: d.reset(5)),
    "a full context": ({}, lambda d: [d.step(_r(1, 1, 2, 4), _r(1, 1, 2, 4), _r(1, 1, 2, 4)) for _ in range(65)]),
}


@pytest.mark.parametrize("case", list(DECODER_CASES))
def test_both_decoders_name_bad_input_in_the_same_words(case):
    options, act = DECODER_CASES[case]

    def call(backend):
        decoder = _decoder(backend, **options)
        return "accepted" if act is None else act(decoder)

    cpp, plain = on_both(call)
    assert isinstance(cpp, str) and cpp != "accepted", cpp
    assert plain == cpp


@pytest.mark.parametrize("options, tokens", [
    # relu, eps = 0 and an all-negative q: 0 / 0.
    (dict(feature_map="relu", eps=0.0), lambda: (-_r(1, 1, 2, 4), _r(1, 1, 2, 4), _r(1, 1, 2, 4))),
    # Unnormalised float32 tokens near 1e13: the read-out overflows.
    (dict(normalize=False), lambda: tuple(torch.full((1, 1, 2, 4), 1e13) for _ in range(3))),
])
def test_both_decoders_name_a_non_finite_step(options, tokens):
    q, k, v = tokens()
    cpp, plain = on_both(lambda backend: _decoder(backend, **options).step(q, k, v))
    assert isinstance(cpp, str) and "is not finite although every input is finite" in cpp
    assert "(the token was added to the state; reset the sequence)" in cpp
    assert plain == cpp


def test_both_decoders_name_a_non_finite_prompt():
    q, k, v = -_r(1, 3, 2, 4), _r(1, 3, 2, 4), _r(1, 3, 2, 4)
    cpp, plain = on_both(lambda backend: _decoder(backend, feature_map="relu", eps=0.0).prefill(0, q, k, v))
    assert isinstance(cpp, str) and cpp.startswith("ValueError: mhla::Decoder::prefill: o[")
    assert plain == cpp


def test_a_decoder_in_torch_tensors_says_why_it_has_no_snapshot():
    with pytest.raises(TypeError, match=r"keeps its state in torch tensors on cpu \(backend='torch'.*backend=None or"):
        _decoder("torch").serialize()


# --- the operator ----------------------------------------------------------------------------

def _attention(backend, q, k, v, w=W, **options):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    o = mt.mhla_attention(q, k, v, w.to(torch.float64 if q.dtype == torch.float64 else torch.float32), LAYOUT,
                          backend=backend, **options)
    return o.detach().double()


@pytest.mark.parametrize("dtype, magnitude", [(torch.float32, 1e-20), (torch.float64, 1e-157),
                                              (torch.bfloat16, 1e-20)])
@pytest.mark.parametrize("masking", ["none", "causal"])
def test_subnormal_denominators_are_named_on_both_paths(dtype, magnitude, masking):
    # relu features near 1e-20 in float32 multiply to subnormals: the denominators have lost their
    # precision and their reciprocals overflow.
    gen = torch.Generator().manual_seed(0)
    q, k = ((torch.rand(1, 64, 2, 4, generator=gen, dtype=torch.float64) * magnitude).to(dtype) for _ in range(2))
    v = torch.randn(1, 64, 2, 4, generator=gen).to(dtype)
    cpp, plain = on_both(lambda backend: _attention(backend, q, k, v, feature_map="relu", eps=0.0, masking=masking))
    assert isinstance(cpp, str) and "has a zero denominator (or one below" in cpp, cpp
    if dtype == torch.bfloat16:
        # The CPU's bfloat16 instructions flush the subnormal products to zero: the C++ entry is
        # 0 * inf where the plain-torch path's is y * inf.
        cpp, plain = (re.sub(r"= (-?inf|nan) is", "= ... is", m) for m in (cpp, plain))
    assert plain == cpp


@pytest.mark.parametrize("dtype, eps", [(torch.float32, 1e-45), (torch.float64, 5e-324)])
def test_a_subnormal_eps_over_all_zero_features_is_named_on_both_paths(dtype, eps):
    q, k, v = -torch.rand(1, 64, 2, 4, dtype=dtype), torch.rand(1, 64, 2, 4, dtype=dtype), torch.rand(1, 64, 2, 4, dtype=dtype)
    cpp, plain = on_both(lambda backend: _attention(backend, q, k, v, feature_map="relu", eps=eps))
    assert isinstance(cpp, str) and "whose reciprocal overflows" in cpp, cpp
    assert plain == cpp


def test_both_decoders_name_a_subnormal_denominator():
    tokens = [torch.full((1, 1, 2, 4), 1e-20) for _ in range(3)]
    cpp, plain = on_both(lambda backend: _decoder(backend, feature_map="relu", eps=0.0).step(*tokens))
    assert isinstance(cpp, str) and "whose reciprocal overflows" in cpp, cpp
    assert plain == cpp


def test_a_float16_gradient_overflow_is_named_in_the_same_words():
    # Unnormalised with a large scale: o fits float16, grad_q = scale * grad_o S~^T does not.
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.rand(1, 64, 1, 8, generator=gen).half() for _ in range(3))

    def call(backend):
        qq = q.clone().requires_grad_()
        o = mt.mhla_attention(qq, k, v, W, LAYOUT, normalize=False, scale=1.0, backend=backend)
        (o.float() * 4e3).sum().backward()
        return qq.grad

    cpp, plain = on_both(call)
    assert isinstance(cpp, str) and "beyond float16's range (largest finite 65504)" in cpp, cpp
    assert "scale grad_o down (a smaller loss scale)" in cpp
    assert plain == cpp


@pytest.mark.parametrize("dtype, magnitude", [(torch.float32, 1e19), (torch.float64, 1e155)])
@pytest.mark.parametrize("causal", [False, True])
def test_softmax_scores_beyond_the_range_are_named_on_both_paths(dtype, magnitude, causal):
    gen = torch.Generator().manual_seed(2)
    q, k = ((torch.randn(1, 16, 2, 8, generator=gen, dtype=torch.float64) * magnitude).to(dtype) for _ in range(2))
    v = torch.randn(1, 16, 2, 8, generator=gen, dtype=dtype)
    cpp, plain = on_both(lambda backend: mt.softmax_attention(q, k, v, causal=causal, backend=backend))
    assert isinstance(cpp, str) and "the scores q k^T * scale overflow" in cpp, cpp
    assert plain == cpp
    # Below the range both paths compute it, and agree.
    small = on_both(lambda backend: mt.softmax_attention(q / magnitude, k / magnitude, v, causal=causal,
                                                         backend=backend))
    torch.testing.assert_close(*small)


def test_meta_tensors_give_a_meta_result_on_both_backends():
    q = torch.empty(2, 64, 3, 8, device="meta")
    for backend in BACKENDS:
        o = mt.mhla_attention(q, q, q, W.to("meta"), LAYOUT, backend=backend)
        assert o.device.type == "meta" and o.shape == (2, 64, 3, 8) and o.dtype == q.dtype
        s = mt.softmax_attention(q, q, q, backend=backend)
        assert s.device.type == "meta" and s.shape == (2, 64, 3, 8)


@pytest.mark.parametrize("offset", [2 ** 63, -2 ** 63 - 1, 2 ** 70])
def test_cu_seqlens_beyond_int64_are_named(offset):
    q = torch.rand(1, 8, 1, 4)
    for backend in BACKENDS:
        with pytest.raises(ValueError, match=rf"cu_seqlens\[1\] = {offset} does not fit in int64"):
            mt.varlen_attention(q, q, q, W, [0, offset, 8], block=4, backend=backend)
    with pytest.raises(ValueError, match="does not fit in int64"):
        mhla.varlen_forward(q, q, q, W, [0, offset], block=4)


def test_relu_zero_over_zero_stays_a_named_error():
    # The exact answer is 0 / 0 here: not representable, and named.
    q, k, v = -torch.rand(1, 64, 2, 4), torch.rand(1, 64, 2, 4), torch.rand(1, 64, 2, 4)
    cpp, plain = on_both(lambda backend: _attention(backend, q, k, v, feature_map="relu", eps=0.0))
    assert isinstance(cpp, str) and "eps = 0 with all-zero features gives 0 / 0" in cpp
    assert plain == cpp


def test_a_layer_names_an_integer_input():
    for backend in BACKENDS:
        layer = mt.MHLA1d(16, 2, block_size=4, max_tokens=16, causal=True, backend=backend)
        with pytest.raises(TypeError, match="MHLA1d expects a floating-point x, got int64"):
            layer(torch.ones(1, 4, 16, dtype=torch.int64))
