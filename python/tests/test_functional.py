"""The operator through mhla and mhla.torch: agreement with the spec written in
plain torch (mhla._torch_forms.naive), autograd gradcheck in every mode, and results
in the caller's tensor type."""
import itertools

import numpy as np
import pytest
import torch

import mhla
import mhla.torch as mt
from mhla._torch_forms import naive as ref

# (name, layout, masking): 1D in every masking, 2D and 3D with ragged edge tiles.
LAYOUTS = [
    ("1d", lambda: mhla.Layout.sequence(11, 4), "none"),
    ("1d-causal", lambda: mhla.Layout.sequence(11, 4), "causal"),
    ("1d-block-causal", lambda: mhla.Layout.sequence(11, 4), "block_causal"),
    ("2d", lambda: mhla.Layout.grid2d(3, 5, 2, 2), "none"),
    ("3d", lambda: mhla.Layout.grid3d(3, 2, 3, 2, 2, 2), "none"),
    ("3d-block-causal", lambda: mhla.Layout.grid3d(3, 2, 3, 1, 2, 3), "block_causal"),
]


def inputs(layout, heads=2, dk=3, dv=4, batch=2, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = layout.num_tokens
    q = torch.randn(batch, n, heads, dk, generator=g, dtype=dtype)
    k = torch.randn(batch, n, heads, dk, generator=g, dtype=dtype)
    v = torch.randn(batch, n, heads, dv, generator=g, dtype=dtype)
    return q, k, v


def mixing(layout, masking, per_head, heads=2, toeplitz_length=None, dtype=torch.float64, seed=1):
    """A positive random w (dense or Toeplitz), so normalized denominators stay away from 0."""
    g = torch.Generator().manual_seed(seed)
    m = layout.num_blocks if toeplitz_length is None else toeplitz_length + 1
    shape = (m,) if toeplitz_length is not None else (m, m)
    return 0.2 + torch.rand(((heads,) if per_head else ()) + shape, generator=g, dtype=dtype)


MODES = [
    pytest.param(name, make, masking, per_head, normalize, phi, id=f"{name}-{'head' if per_head else 'shared'}-"
                 f"{'norm' if normalize else 'unnorm'}-{phi}")
    for (name, make, masking), per_head, normalize, phi in itertools.product(
        LAYOUTS, [False, True], [True, False], ["elu1", "identity"])
    # identity features can make normalized denominators vanish; they are checked unnormalized
    if not (normalize and phi == "identity")
]


@pytest.mark.parametrize("name,make,masking,per_head,normalize,phi", MODES)
def test_forward_matches_spec(name, make, masking, per_head, normalize, phi):
    layout = make()
    q, k, v = inputs(layout)
    w = mixing(layout, masking, per_head)
    options = dict(masking=masking, feature_map=phi, normalize=normalize)
    got = mt.mhla_attention(q, k, v, w, layout, **options)
    want = ref.mhla_attention(q, k, v, w, layout, **options)
    torch.testing.assert_close(got, want, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("name,make,masking,per_head,normalize,phi", MODES)
def test_gradcheck(name, make, masking, per_head, normalize, phi):
    layout = make()
    q, k, v = (t.requires_grad_() for t in inputs(layout, batch=1))
    w = mixing(layout, masking, per_head).requires_grad_()
    options = dict(masking=masking, feature_map=phi, normalize=normalize)
    assert torch.autograd.gradcheck(lambda *a: mt.mhla_attention(*a, layout, **options), (q, k, v, w))


@pytest.mark.parametrize("masking", ["causal", "block_causal"])
@pytest.mark.parametrize("length", [0, 1, 3])
@pytest.mark.parametrize("per_head", [False, True])
def test_toeplitz_matches_spec_and_gradcheck(masking, length, per_head):
    layout = mhla.Layout.sequence(13, 3)
    q, k, v = (t.requires_grad_() for t in inputs(layout, batch=1))
    w = mixing(layout, masking, per_head, toeplitz_length=length).requires_grad_()
    options = dict(masking=masking, feature_map="elu1", mixing="toeplitz")
    torch.testing.assert_close(mt.mhla_attention(q, k, v, w, layout, **options),
                               ref.mhla_attention(q, k, v, w, layout, **options), rtol=1e-11, atol=1e-11)
    assert torch.autograd.gradcheck(lambda *a: mt.mhla_attention(*a, layout, **options), (q, k, v, w))


def test_relu_features_and_explicit_scale_and_eps():
    layout = mhla.Layout.sequence(9, 4)
    q, k, v = inputs(layout)
    q, k = q.abs() + 0.1, k.abs() + 0.1  # away from relu's kink
    w = mixing(layout, "none", False)
    for options in [dict(feature_map="relu"), dict(normalize=False, scale=0.3), dict(eps=0.5)]:
        torch.testing.assert_close(mt.mhla_attention(q, k, v, w, layout, **options),
                                   ref.mhla_attention(q, k, v, w, layout, **options), rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("masking,normalize", [("none", True), ("causal", True), ("causal", False)])
def test_linear_attention_matches_spec_and_gradcheck(masking, normalize):
    q, k, v = (t.requires_grad_() for t in inputs(mhla.Layout.sequence(10, 10), batch=1))
    options = dict(masking=masking, feature_map="elu1", normalize=normalize)
    torch.testing.assert_close(mt.linear_attention(q, k, v, **options), ref.linear_attention(q, k, v, **options),
                               rtol=1e-11, atol=1e-11)
    assert torch.autograd.gradcheck(lambda *a: mt.linear_attention(*a, **options), (q, k, v))


@pytest.mark.parametrize("causal", [False, True])
def test_softmax_attention_matches_spec_and_gradcheck(causal):
    q, k, v = (t.requires_grad_() for t in inputs(mhla.Layout.sequence(10, 10), batch=1))
    torch.testing.assert_close(mt.softmax_attention(q, k, v, causal=causal),
                               ref.softmax_attention(q, k, v, causal=causal), rtol=1e-11, atol=1e-11)
    assert torch.autograd.gradcheck(lambda *a: mt.softmax_attention(*a, causal=causal), (q, k, v))


def test_float32_matches_float64():
    layout = mhla.Layout.grid2d(6, 7, 3, 3)
    q, k, v = inputs(layout)
    w = mixing(layout, "none", True)
    want = mt.mhla_attention(q, k, v, w, layout, feature_map="elu1")
    got = mt.mhla_attention(q.float(), k.float(), v.float(), w.float(), layout, feature_map="elu1")
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_results_take_the_callers_kind():
    layout = mhla.Layout.sequence(8, 4)
    q, k, v = inputs(layout)
    w = mixing(layout, "none", False)
    o_torch = mhla.forward(q, k, v, w, layout=layout)
    qn, kn, vn, wn = q.numpy(), k.numpy(), v.numpy(), w.numpy()
    o_numpy = mhla.forward(qn, kn, vn, wn, layout=layout)
    assert isinstance(o_torch, torch.Tensor)
    assert isinstance(o_numpy, np.ndarray) and o_numpy.flags.writeable and o_numpy.dtype == np.float64
    np.testing.assert_array_equal(o_numpy, o_torch.numpy())
    # Backward with and without a state, from NumPy results fed back in.
    state = mhla.ForwardState()
    o_kept = mhla.forward(qn, kn, vn, wn, layout=layout, state=state)
    grad_o = np.ones_like(o_numpy)
    with_state = mhla.backward(qn, kn, vn, wn, o_kept, grad_o, layout=layout, state=state)
    without = mhla.backward(qn, kn, vn, wn, o_numpy, grad_o, layout=layout)
    for a, b in zip(with_state, without):
        assert isinstance(a, np.ndarray)
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_any_dlpack_object_is_read_and_readonly_numpy_too():
    class Producer:  # only the DLPack protocol: neither torch nor NumPy
        def __init__(self, array):
            self.array = array

        def __dlpack__(self, stream=None):
            return self.array.__dlpack__()

        def __dlpack_device__(self):
            return self.array.__dlpack_device__()

    layout = mhla.Layout.sequence(8, 4)
    q, k, v = (t.numpy() for t in inputs(layout))
    w = mixing(layout, "none", False).numpy()
    want = mhla.forward(q, k, v, w, layout=layout)
    got = mhla._core.forward(Producer(q), Producer(k), Producer(v), Producer(w), layout=layout)
    np.testing.assert_array_equal(np.asarray(got), want)
    q.flags.writeable = False  # NumPy refuses DLPack export here; the buffer protocol reads it
    np.testing.assert_array_equal(mhla.forward(q, k, v, w, layout=layout), want)


def test_init_mixing_matches_the_library_definition():
    layout = mhla.Layout.grid2d(4, 4, 2, 2)  # 2 x 2 blocks: distances 0, 1, sqrt 2
    w = mhla.init_mixing(layout)
    d = np.array([[0, 1, 1, 2 ** 0.5], [1, 0, 2 ** 0.5, 1], [1, 2 ** 0.5, 0, 1], [2 ** 0.5, 1, 1, 0]])
    want = 1 - d / d.max()
    np.testing.assert_allclose(w, want / want.sum(1, keepdims=True), rtol=1e-6)
    causal = mhla.init_mixing(mhla.Layout.sequence(12, 4), causal=True, like=torch.zeros(1))
    assert isinstance(causal, torch.Tensor) and torch.all(causal.triu(1) == 0)
    torch.testing.assert_close(causal.sum(1), torch.ones(3))
    toeplitz = mhla.init_toeplitz_mixing(4)
    np.testing.assert_allclose(toeplitz, [1, 0.75, 0.5, 0.25, 0], rtol=1e-6)
