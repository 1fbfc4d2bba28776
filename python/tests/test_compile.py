"""torch.compile on the C++ operator: the custom ops of mhla._custom_ops (mhla::forward, the
baselines' and varlen's, and their backwards).

Layers and functions on CPU tensors compile with ``fullgraph=True`` (any graph break is an error)
and give the eager results, forward and backward. Needs torch 2.4 or later (torch.library.custom_op);
skipped on older torch, where eager calls are what runs.
"""
import pytest
import torch

import mhla
import mhla.torch as mt
from mhla import _custom_ops, _plan, _torch_functions
from mhla._torch_forms.chunk import Geometry

pytestmark = pytest.mark.skipif(not _custom_ops.AVAILABLE,
                                reason=f"torch.library.custom_op needs torch 2.4 or later (this is {torch.__version__})")


@pytest.fixture(autouse=True)
def fresh_compile_caches():
    # Each test compiles its own functions; guards from another test's must not decide recompiles.
    torch._dynamo.reset()
    yield


LAYERS = {
    "2d-ragged-gate-norm-conv": lambda: mt.MHLA2d(32, 4, grid=(5, 7), tile=(2, 3), pos_conv=3, gate=True,
                                                  qk_norm=True),
    "3d-per-head": lambda: mt.MHLA3d(32, 4, grid=(3, 4, 5), tile=(2, 2, 2), per_head_mixing=True),
    "1d-causal-conv": lambda: mt.MHLA1d(32, 4, block_size=4, max_tokens=30, causal=True, pos_conv=3),
    "1d-authors-lm": lambda: mt.MHLA1d(32, 4, block_size=4, max_tokens=30, causal=True, variant="authors_lm"),
    "2d-authors-vision": lambda: mt.MHLA2d(32, 4, grid=(4, 6), tile=(2, 3), variant="authors_vision"),
    "3d-authors-video": lambda: mt.MHLA3d(32, 4, grid=(2, 4, 6), tile=(1, 2, 3), variant="authors_video"),
}


def tokens_of(layer):
    return 30 if isinstance(layer, mt.MHLA1d) else layer.geometry.num_tokens


def forward_and_grads(module, x):
    x = x.detach().requires_grad_()
    y = module(x)
    y.square().sum().backward()
    return y.detach(), x.grad


@pytest.mark.parametrize("name", LAYERS)
def test_layers_on_the_cpp_operator_compile_without_graph_breaks(name):
    torch.manual_seed(0)
    layer = LAYERS[name]()
    assert layer.backend is None  # CPU tensors: the C++ operator, eager and compiled
    x = torch.randn(2, tokens_of(layer), 32)
    y, grad = forward_and_grads(torch.compile(layer, fullgraph=True), x)
    parameter_grads = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    want_y, want_grad = forward_and_grads(layer, x)
    torch.testing.assert_close(y, want_y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad, want_grad, rtol=1e-5, atol=1e-5)
    for got, p in zip(parameter_grads, layer.parameters()):
        torch.testing.assert_close(got, p.grad, rtol=1e-5, atol=1e-5)


def test_a_compiled_sequence_layer_takes_other_lengths():
    # A new token count is a new layout (recompiled: the layout's sizes are part of the op's arguments).
    torch.manual_seed(1)
    layer = mt.MHLA1d(16, 2, block_size=4, max_tokens=40, causal=True)
    compiled = torch.compile(layer, fullgraph=True)
    for tokens in (30, 17, 40, 1):
        x = torch.randn(1, tokens, 16)
        torch.testing.assert_close(compiled(x), layer(x), rtol=1e-5, atol=1e-5)


CALLS = {
    "2d-ragged": dict(layout=mhla.Layout.grid2d(5, 7, 2, 3), w=(9, 9), options={}),
    "1d-causal-per-head": dict(layout=mhla.Layout.sequence(11, 4), w=(3, 3, 3),
                               options=dict(masking=mhla.Masking.causal, feature_map="relu")),
    "3d-block-causal": dict(layout=mhla.Layout.grid3d(3, 2, 3, 1, 2, 2), w=(6, 6),
                            options=dict(masking="block_causal", normalize=False, scale=0.5)),
    "1d-toeplitz": dict(layout=mhla.Layout.sequence(10, 3), w=(3,),
                        options=dict(mixing="toeplitz", masking="causal", feature_map="identity")),
}


def call_inputs(case, dtype=torch.float64):
    g = torch.Generator().manual_seed(2)
    n = case["layout"].num_tokens
    q, k = (torch.randn(2, n, 3, 4, generator=g, dtype=dtype) for _ in range(2))
    v = torch.randn(2, n, 3, 5, generator=g, dtype=dtype)
    w = torch.rand(*case["w"], generator=g, dtype=dtype) + 0.1
    return q, k, v, w


@pytest.mark.parametrize("backend", [None, "torch"])
@pytest.mark.parametrize("name", CALLS)
def test_mhla_attention_compiles_in_a_users_function(name, backend):
    case = CALLS[name]

    def attend(q, k, v, w):
        return mt.mhla_attention(q.relu(), k, v, w, case["layout"], backend=backend, **case["options"]) * 2

    inputs = [t.requires_grad_() for t in call_inputs(case)]
    got = torch.compile(attend, fullgraph=True)(*inputs)
    grads = torch.autograd.grad(got.sum(), inputs)
    want = attend(*inputs)
    want_grads = torch.autograd.grad(want.sum(), inputs)
    torch.testing.assert_close(got, want)
    for a, b in zip(grads, want_grads):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reduced_precision_compiles_to_the_eager_result(dtype):
    case = CALLS["2d-ragged"]
    q, k, v, w = call_inputs(case, torch.float32)
    q, k, v = (t.to(dtype) for t in (q, k, v))

    def attend(q, k, v, w):
        return mt.mhla_attention(q, k, v, w, case["layout"])

    got = torch.compile(attend, fullgraph=True)(q, k, v, w)
    assert got.dtype == dtype
    torch.testing.assert_close(got, attend(q, k, v, w), rtol=0, atol=0)


@pytest.mark.parametrize("name", CALLS)
def test_the_custom_ops_pass_torchs_checks(name):
    # Schema, fake (meta) implementation against the real one, autograd registration, and the
    # op traced by AOT autograd with static and dynamic shapes.
    case = CALLS[name]
    geometry = Geometry.of(case["layout"])
    names = _torch_functions._option_names(**{field: case["options"].get(field) for field in
                                ("masking", "feature_map", "normalize", "eps", "scale", "mixing")})
    q, k, v, w = (t.requires_grad_() for t in call_inputs(case))
    torch.library.opcheck(_custom_ops.forward, (q, k, v, w, geometry.rank, list(geometry.grid),
                                                list(geometry.tile), *names.values(), 0))


def test_mhla_ops_are_registered_for_the_devices_the_extension_runs():
    # CUDA tensors reach the extension's CUDA backend through the op where it was built with one
    # (their numbers are GPU tests: test_cuda_tensors.py); the baselines stay CPU-only.
    for name in ("mhla::forward", "mhla::backward"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU"), name
        assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "CUDA") == mhla._core.has_cuda_backend, name
    for name in ("mhla::varlen_forward", "mhla::linear_attention_forward", "mhla::softmax_attention_forward"):
        assert not torch._C._dispatch_has_kernel_for_dispatch_key(name, "CUDA"), name


def test_the_ops_gradients_match_finite_differences():
    # First and second derivatives: a gradient penalty differentiates the op's backward (its
    # plain-torch form, as in eager calls).
    case = CALLS["1d-causal-per-head"]
    geometry = Geometry.of(case["layout"])
    names = _torch_functions._option_names(masking="causal", feature_map="elu1", normalize=None, eps=None, scale=None,
                                           mixing=None)
    inputs = [t[:1, :, :2].requires_grad_() if t.dim() == 4 else t[:2].requires_grad_()
              for t in call_inputs(case)]

    def attend(q, k, v, w):
        return _custom_ops.mhla_attention(q, k, v, w, geometry, _plan.plan("mhla", (q, k, v, w)), **names)

    assert torch.autograd.gradcheck(attend, inputs)
    assert torch.autograd.gradgradcheck(attend, inputs)


def test_bad_options_are_named_when_compiling():
    case = CALLS["2d-ragged"]
    q, k, v, w = call_inputs(case)
    compiled = torch.compile(lambda q, k, v, w: mt.mhla_attention(q, k, v, w, case["layout"], masking="sideways"),
                             fullgraph=True)
    with pytest.raises(Exception, match="unknown masking 'sideways'; expected one of none, causal, block_causal"):
        compiled(q, k, v, w)
    # Shapes are the operator's to check, when the op runs: its named error comes through.
    compiled = torch.compile(lambda q, k, v, w: mt.mhla_attention(q, k, v, w, case["layout"]), fullgraph=True)
    with pytest.raises(ValueError, match=r"w has shape \[5, 5\], expected \[9, 9\]"):
        compiled(q, k, v, w[:5, :5])


# ---- the baselines and packed sequences: mhla::varlen_forward, linear_attention_forward, softmax_attention_forward

def baseline_inputs(dtype=torch.float64):
    g = torch.Generator().manual_seed(3)
    q, k = (torch.randn(1, 13, 2, 4, generator=g, dtype=dtype) for _ in range(2))
    v = torch.randn(1, 13, 2, 3, generator=g, dtype=dtype)
    return q, k, v, torch.rand(2, 3, 3, generator=g, dtype=dtype) + 0.1


BASELINES = {
    "varlen-causal": lambda q, k, v, w: mt.varlen_attention(q, k, v, w, [0, 5, 5, 13], block=3, masking="causal"),
    "varlen-toeplitz": lambda q, k, v, w: mt.varlen_attention(q, k, v, w[:, 0], [0, 9, 13], block=4,
                                                              mixing="toeplitz", masking="causal", feature_map="relu"),
    "linear": lambda q, k, v, w: mt.linear_attention(q, k, v, feature_map="identity", normalize=False),
    "linear-causal": lambda q, k, v, w: mt.linear_attention(q, k, v, masking="causal", normalize=False, scale=0.5),
    "softmax": lambda q, k, v, w: mt.softmax_attention(q, k, v, scale=0.3),
    "softmax-causal": lambda q, k, v, w: mt.softmax_attention(q, k, v, causal=True),
}


@pytest.mark.parametrize("name", BASELINES)
def test_the_baselines_and_varlen_compile_to_the_eager_result(name):
    attend = BASELINES[name]
    inputs = [t.requires_grad_() for t in baseline_inputs()]
    got = torch.compile(attend, fullgraph=True)(*inputs)
    grads = torch.autograd.grad(got.square().sum(), inputs, allow_unused=True)
    want = attend(*inputs)
    want_grads = torch.autograd.grad(want.square().sum(), inputs, allow_unused=True)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    for a, b in zip(grads, want_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reduced_precision_baselines_compile_in_their_dtype(dtype):
    q, k, v, w = (t.to(dtype) for t in baseline_inputs(torch.float32))
    for name, attend in BASELINES.items():
        got = torch.compile(attend, fullgraph=True)(q, k, v, w)
        assert got.dtype == dtype, name
        torch.testing.assert_close(got.float(), attend(q, k, v, w).float(), rtol=1e-2, atol=1e-2)


def test_the_baseline_ops_pass_torchs_checks():
    q, k, v, w = (t.requires_grad_() for t in baseline_inputs())
    names = _torch_functions._option_names(masking="causal", feature_map=None, normalize=None, eps=None,
                                           scale=None)
    torch.library.opcheck(_custom_ops.varlen_forward, (q, k, v, w, [0, 5, 13], 3, "dense", *names.values()))
    torch.library.opcheck(_custom_ops.linear_forward, (q, k, v, *names.values()))
    torch.library.opcheck(_custom_ops.softmax_forward, (q, k, v, True, None))


def test_the_baseline_ops_gradients_match_finite_differences():
    inputs = [t[:, :7, :1, :2].requires_grad_() if t.dim() == 4 else t[:1].requires_grad_()
              for t in baseline_inputs()]
    plan = _plan.plan("linear", inputs[:3])  # float64: the same dtypes for every entry
    for attend in (lambda q, k, v, w: _custom_ops.varlen_attention(
                       q, k, v, w, [0, 3, 7], plan, block=2, mixing="dense", masking="causal", feature_map="elu1",
                       normalize=True, eps=1e-6, scale=None),
                   lambda q, k, v, w: _custom_ops.linear_attention(q, k, v, plan, masking="causal",
                                                                   feature_map="elu1", normalize=True, eps=1e-6,
                                                                   scale=None) * w.sum(),
                   lambda q, k, v, w: _custom_ops.softmax_attention(q, k, v, plan, causal=True, scale=None) * w.sum()):
        assert torch.autograd.gradcheck(attend, inputs)
        assert torch.autograd.gradgradcheck(attend, inputs)


@pytest.mark.parametrize("compiled", [False, True])
def test_a_forward_that_keeps_no_state_gives_the_same_gradients(monkeypatch, compiled):
    # On bfloat16 CUDA tensors under the bfloat16-state kernels, forward keeps no state and the
    # backward recomputes it (_plan.keeps_state). The same form on CPU tensors, eager and
    # compiled: empty state arrays through the op's results and fake, the gradients unchanged.
    case = CALLS["2d-ragged"]
    inputs = [t.requires_grad_() for t in call_inputs(case)]

    def attend(q, k, v, w):
        return mt.mhla_attention(q, k, v, w, case["layout"], **case["options"])

    want = attend(*inputs)
    want_grads = torch.autograd.grad(want.square().sum(), inputs)
    kept = []
    monkeypatch.setattr(_plan, "keeps_state", lambda q, cuda_kernels, needs_grad: kept.append(q.device.type) or False)
    run = torch.compile(attend, fullgraph=True) if compiled else attend
    got = run(*inputs)
    grads = torch.autograd.grad(got.square().sum(), inputs)
    assert kept, "the forward did not ask whether to keep its state"
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    for a, b in zip(grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
