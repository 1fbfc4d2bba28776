"""The forms of mhla._torch_forms against each other (the lean form, mhla.torch's plain-torch path,
against the chunked form it is written from), and the plain-torch path against the C++ operator,
on the CPU with backend="torch": every mode and layout on a random catalogue, forward and the
gradients of q, k, v and w in float64;
the functions, layers and variants; bfloat16 and float16; the same named errors; and the routing of
tensors that are not on the CPU (meta tensors stand in for a GPU).

MHLA_TEST_DEVICE=cuda (bench/gpu_check.py sets it) runs the torch path's side of every comparison
on that device, against the C++ operator on the CPU."""
import copy
import os

import numpy as np
import pytest
import torch

import mhla
import mhla.torch as mt
from mhla._torch_forms import chunk, einsum, lean, naive

L = mhla.Layout
DEVICE = torch.device(os.environ.get("MHLA_TEST_DEVICE", "cpu"))


def on_device(backend, tensors):
    """Fresh leaves of ``tensors`` where ``backend`` computes: the test device for the torch path."""
    device = DEVICE if backend == "torch" else torch.device("cpu")
    return [t.detach().to(device).clone().requires_grad_(True) for t in tensors]


def cpu(tensors):
    return tuple(t.detach().cpu() for t in tensors)


def random_case(seed):
    """A random call: layout (1D/2D/3D, ragged), masking, features, normalisation, mixing form and
    sharing, B, H, Dk, Dv (odd ones included)."""
    rng = np.random.default_rng(seed)
    rank = int(rng.integers(1, 4))
    if rank == 1:
        n = int(rng.integers(1, 41))
        layout = L.sequence(n, int(rng.integers(1, n + 1)))
    elif rank == 2:
        gh, gw = (int(x) for x in rng.integers(1, 8, size=2))
        layout = L.grid2d(gh, gw, int(rng.integers(1, gh + 1)), int(rng.integers(1, gw + 1)))
    else:
        g = [int(x) for x in rng.integers(1, 5, size=3)]
        layout = L.grid3d(*g, *(int(rng.integers(1, e + 1)) for e in g))
    masking = str(rng.choice(["none", "block_causal"] + (["causal"] if rank == 1 else [])))
    kwargs = dict(masking=masking, feature_map=str(rng.choice(["identity", "relu", "elu1"])),
                  normalize=bool(rng.random() < 0.7))
    if not kwargs["normalize"] and rng.random() < 0.5:
        kwargs["scale"] = float(rng.uniform(0.1, 2))
    if kwargs["normalize"] and rng.random() < 0.3:
        kwargs["eps"] = float(rng.uniform(0.01, 1))
    b, h = int(rng.integers(1, 3)), int(rng.integers(1, 4))
    dk, dv = int(rng.integers(1, 8)), int(rng.integers(1, 8))
    per_head = bool(rng.random() < 0.4)
    toeplitz = masking != "none" and rng.random() < 0.4
    m = layout.num_blocks
    if toeplitz:
        kwargs["mixing"] = "toeplitz"
        w_shape = ([h] if per_head else []) + [int(rng.integers(0, 6)) + 1]
    else:
        w_shape = ([h] if per_head else []) + [m, m]
    gen = torch.Generator().manual_seed(seed)
    positive = kwargs["feature_map"] == "identity" and kwargs["normalize"]
    lo = 0.05 if positive else -1.0

    def uniform(*shape, low=lo):
        return (torch.rand(*shape, dtype=torch.float64, generator=gen) * (1 - low) + low)

    n = layout.num_tokens
    q, k = uniform(b, n, h, dk), uniform(b, n, h, dk)
    v = uniform(b, n, h, dv, low=-1.0)
    w = uniform(*w_shape, low=0.05 if kwargs["normalize"] else -1.0)
    return layout, kwargs, (q, k, v, w)


def results(backend, layout, kwargs, inputs, grad):
    leaves = on_device(backend, inputs)
    o = mt.mhla_attention(*leaves, layout, backend=backend, **kwargs)
    grads = torch.autograd.grad((o * grad.to(o.device)).sum(), leaves)
    return cpu((o,) + grads)


@pytest.mark.parametrize("feature_map", ["elu1", "relu"])
@pytest.mark.parametrize("mixing,w_shape", [("dense", (4, 4)), ("dense", (2, 4, 4)), ("toeplitz", (3,))])
def test_the_forms_agree_with_each_other(mixing, w_shape, feature_map):
    # Causal 1D in float64: the dense form, the chunked form and the decoder fed token by token;
    # non-causal elu + 1 in block order: the einsum formulation too.
    gen = torch.Generator().manual_seed(11)
    layout, heads, d = L.sequence(14, 4), 2, 3
    q, k, v = (torch.randn(1, 14, heads, d, dtype=torch.float64, generator=gen) for _ in range(3))
    w = torch.rand(*w_shape, dtype=torch.float64, generator=gen) + 0.05
    options = dict(masking="causal", feature_map=feature_map, mixing=mixing)
    dense = naive.mhla_attention(q, k, v, w, layout, **options)
    torch.testing.assert_close(chunk.mhla_attention(q, k, v, w, layout, **options), dense, rtol=1e-12, atol=1e-12)
    decoder = mhla.Decoder(w.float(), backend="torch", heads=heads, dk=d, dv=d, block=4, mixing=mixing,
                           feature_map=feature_map)
    steps = torch.cat([decoder.step(*(x[:, t:t + 1].float() for x in (q, k, v))) for t in range(14)], dim=1)
    torch.testing.assert_close(steps.double(), dense, rtol=1e-5, atol=1e-5)  # the decoder is float32
    if mixing == "dense" and feature_map == "elu1":
        w_full = w if w.dim() == 2 else w[0]
        layout = L.sequence(16, 4)
        q, k, v = (torch.randn(1, 16, heads, d, dtype=torch.float64, generator=gen) for _ in range(3))
        want = naive.mhla_attention(q, k, v, w_full, layout)
        torch.testing.assert_close(einsum.einsum_mhla(q, k, v, w_full, 4), want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(chunk.mhla_attention(q, k, v, w_full, layout), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", range(150))
def test_catalogue_matches_the_cpp_operator_forward_and_gradients(seed):
    layout, kwargs, inputs = random_case(seed)
    grad = torch.randn(inputs[2].shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 1))
    want = results("cpp", layout, kwargs, inputs, grad)
    got = results("torch", layout, kwargs, inputs, grad)
    for name, a, b in zip(("o", "grad_q", "grad_k", "grad_v", "grad_w"), got, want):
        scale = max(1.0, float(b.abs().max()))
        assert float((a - b).abs().max()) / scale <= 1e-10, (name, layout, kwargs)


@pytest.mark.parametrize("seed", range(80))
def test_the_lean_form_equals_the_chunked_form(seed):
    # The hand-written backward against torch's autograd of the chunked form, on one device.
    layout, kwargs, inputs = random_case(seed)
    grad = torch.randn(inputs[2].shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 1))
    answers = []
    for form in (lean, chunk):
        leaves = on_device("torch", inputs)
        o = form.mhla_attention(*leaves, layout, **kwargs)
        answers.append(cpu((o,) + torch.autograd.grad(o, leaves, grad.to(o.device))))
    for name, a, b in zip(("o", "grad_q", "grad_k", "grad_v", "grad_w"), *answers):
        scale = max(1.0, float(b.abs().max()))
        assert float((a - b).abs().max()) / scale <= 1e-12, (name, layout, kwargs)


@pytest.mark.parametrize("masking", ["none", "causal"])
def test_the_lean_backward_takes_any_upstream_gradient_and_any_inputs_that_need_one(masking):
    layout = L.sequence(11, 4)
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 11, 2, 3, dtype=torch.float64, generator=gen) for _ in range(3))
    w = torch.rand(3, 3, dtype=torch.float64, generator=gen) + 0.1

    def grads(form, needs, reduce):
        leaves = [t.detach().to(DEVICE).clone().requires_grad_(need) for t, need in zip((q, k, v, w), needs)]
        o = form.mhla_attention(*leaves, layout, masking=masking)
        wanted = [t for t in leaves if t.requires_grad]
        return cpu(torch.autograd.grad(reduce(o), wanted))

    # o.sum()'s upstream gradient is a broadcast scalar: no stride of it is 1.
    for needs in ((True,) * 4, (False, False, False, True), (False, True, True, False)):
        for reduce in (torch.sum, lambda o: (o[:, ::2] ** 2).sum()):
            for a, b in zip(grads(lean, needs, reduce), grads(chunk, needs, reduce)):
                torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    # A second backward through the same graph (retain_graph) gives the same gradients.
    leaves = [t.detach().to(DEVICE).clone().requires_grad_() for t in (q, k, v, w)]
    o = lean.mhla_attention(*leaves, layout, masking=masking)
    first = torch.autograd.grad(o.sum(), leaves, retain_graph=True)
    for a, b in zip(first, torch.autograd.grad(o.sum(), leaves)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("feature_map", ["identity", "relu"])
@pytest.mark.parametrize("layout", [L.sequence(10, 4), L.grid2d(5, 7, 2, 3), L.grid3d(3, 4, 5, 2, 3, 2)],
                         ids=["1d", "2d", "3d"])
def test_ragged_blocks_padding_reaches_no_gradient_with_eps_zero(layout, feature_map):
    # The padding slots of ragged edge blocks hold zero tokens, whose phi is 0 under these maps:
    # a 0 / 0 there must not turn the gradients into NaN.
    gen = torch.Generator().manual_seed(7)
    n, m = layout.num_tokens, layout.num_blocks
    q, k, v = (torch.rand(2, n, 2, 3, dtype=torch.float64, generator=gen) + 0.05 for _ in range(3))
    w = torch.rand(m, m, dtype=torch.float64, generator=gen) + 0.05
    kwargs = dict(feature_map=feature_map, eps=0.0)
    grad = torch.randn(q.shape, dtype=torch.float64, generator=gen)
    want = results("cpp", layout, kwargs, (q, k, v, w), grad)
    got = results("torch", layout, kwargs, (q, k, v, w), grad)
    for name, a, b in zip(("o", "grad_q", "grad_k", "grad_v", "grad_w"), got, want):
        assert torch.isfinite(a).all(), name
        assert float((a - b).abs().max()) <= 1e-10 * max(1.0, float(b.abs().max())), name


def test_cpu_tensors_take_the_cpp_operator_by_default():
    layout, kwargs, (q, k, v, w) = random_case(3)
    o = mt.mhla_attention(q, k, v, w, layout, **kwargs)
    assert torch.equal(o, mt.mhla_attention(q, k, v, w, layout, backend="cpp", **kwargs))
    with pytest.raises(ValueError, match="unknown backend 'cuda'; expected None"):
        mt.mhla_attention(q, k, v, w, layout, backend="cuda")


def test_other_devices_take_the_torch_path():
    # A meta tensor (no values) comes back with the result's shape, on the meta device, on either
    # backend: the torch forms propagate it, as torch's own ops do.
    layout = L.grid2d(5, 7, 2, 3)
    q, k = torch.rand(2, 35, 3, 4, device="meta"), torch.rand(2, 35, 3, 4, device="meta")
    v, w = torch.rand(2, 35, 3, 5, device="meta"), torch.rand(9, 9, device="meta")
    o = mt.mhla_attention(q, k, v, w, layout)
    assert o.device.type == "meta" and o.shape == (2, 35, 3, 5)
    with pytest.raises(ValueError, match="w is on cpu but q is on meta; pass every tensor of the call on one device"):
        mt.mhla_attention(q, k, v, torch.rand(9, 9), layout)
    o = mt.mhla_attention(q[:, :30], k[:, :30], v[:, :30], torch.rand(1, device="meta"), L.sequence(30, 4),
                          masking="causal", mixing="toeplitz")
    assert o.device.type == "meta" and o.shape == (2, 30, 3, 5)
    assert mt.linear_attention(q, k, v).shape == (2, 35, 3, 5)
    assert mt.softmax_attention(q, k, v, causal=True).shape == (2, 35, 3, 5)
    assert mt.varlen_attention(q[:1], k[:1], v[:1], torch.rand(7, 7, device="meta"), [0, 10, 35],
                               block=4, masking="causal", mixing="dense")[0].shape == (35, 3, 5)
    layer = mt.MHLA2d(12, 3, grid=(5, 7), tile=(2, 3), pos_conv=3, gate=True, qk_norm=True).to("meta")
    assert layer(torch.rand(2, 35, 12, device="meta")).device.type == "meta"
    assert mt.mhla_attention(q, k, v, w, layout, backend="cpp").device.type == "meta"


@pytest.mark.parametrize("masking,causal_layout", [("none", False), ("causal", True)])
def test_linear_and_softmax_attention_match(masking, causal_layout):
    gen = torch.Generator().manual_seed(5)
    q, k = (torch.randn(2, 150, 3, 5, dtype=torch.float64, generator=gen) for _ in range(2))
    v = torch.randn(2, 150, 3, 6, dtype=torch.float64, generator=gen)
    for fn, kwargs in ((mt.linear_attention, dict(masking=masking)),
                       (mt.linear_attention, dict(masking=masking, feature_map="relu", normalize=False)),
                       (mt.softmax_attention, dict(causal=causal_layout)),
                       (mt.softmax_attention, dict(causal=causal_layout, scale=0.3))):
        grad = torch.randn(2, 150, 3, 6, dtype=torch.float64, generator=gen)
        outs = []
        for backend in ("cpp", "torch"):
            leaves = on_device(backend, (q, k, v))
            o = fn(*leaves, backend=backend, **kwargs)
            outs.append(cpu((o,) + torch.autograd.grad((o * grad.to(o.device)).sum(), leaves)))
        for a, b in zip(*outs):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_softmax_in_query_chunks_matches_one_chunk():
    # torch 1.13 has no SDPA: the chunked form is what runs there.
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 70, 2, 4, dtype=torch.float64, generator=gen) for _ in range(3))
    for causal in (False, True):
        whole = mt.softmax_attention(q, k, v, causal=causal, backend="cpp")
        sdpa = getattr(torch.nn.functional, "scaled_dot_product_attention", None)
        try:
            torch.nn.functional.scaled_dot_product_attention = None
            chunked = chunk.softmax_attention(q, k, v, causal=causal, chunk=16)
        finally:
            torch.nn.functional.scaled_dot_product_attention = sdpa
        torch.testing.assert_close(chunked, whole, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mixing", ["dense", "toeplitz"])
def test_varlen_matches(mixing):
    gen = torch.Generator().manual_seed(9)
    cu = [0, 5, 5, 23, 40]
    q, k = (torch.randn(1, 40, 2, 3, dtype=torch.float64, generator=gen) for _ in range(2))
    v = torch.randn(1, 40, 2, 4, dtype=torch.float64, generator=gen)
    w = torch.rand(*( [3] if mixing == "toeplitz" else [6, 6]), dtype=torch.float64, generator=gen) + 0.1
    grad = torch.randn(1, 40, 2, 4, dtype=torch.float64, generator=gen)
    outs = []
    for backend in ("cpp", "torch"):
        leaves = on_device(backend, (q, k, v, w))
        o = mt.varlen_attention(*leaves, cu, block=4, masking="causal", mixing=mixing, backend=backend)
        outs.append(cpu((o,) + torch.autograd.grad((o * grad.to(o.device)).sum(), leaves)))
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def layers():
    options = dict(qk_norm=True, gate=True, pos_conv=3, per_head_mixing=True)
    return [mt.MHLA1d(24, 3, block_size=4, max_tokens=30, **options),
            mt.MHLA1d(24, 3, block_size=4, max_tokens=30, causal=True, **options),
            mt.MHLA2d(24, 3, grid=(5, 7), tile=(2, 3), **options),
            mt.MHLA3d(24, 3, grid=(3, 4, 5), tile=(2, 2, 2), **options),
            mt.MHLA2d(24, 3, grid=(4, 6), tile=(2, 3), variant="authors_vision"),
            mt.MHLA3d(24, 3, grid=(2, 4, 6), tile=(1, 2, 3), variant="authors_video"),
            mt.MHLA1d(24, 3, block_size=4, max_tokens=30, causal=True, variant="authors_lm")]


@pytest.mark.parametrize("index", range(7))
def test_layers_equal_their_cpp_backed_form(index):
    torch.manual_seed(index)
    layer = layers()[index].double()
    tokens = 30 if isinstance(layer, mt.MHLA1d) else layer.layout.num_tokens
    x = torch.randn(2, tokens, 24, dtype=torch.float64)
    on_torch = copy.deepcopy(layer).to(DEVICE)
    on_torch.backend = "torch"
    y, y_torch = layer(x), on_torch(x.to(DEVICE))
    torch.testing.assert_close(y_torch.cpu(), y, rtol=1e-10, atol=1e-10)
    y.square().sum().backward()
    y_torch.square().sum().backward()
    for (name, p), p_torch in zip(layer.named_parameters(), on_torch.parameters()):
        torch.testing.assert_close(p_torch.grad.cpu(), p.grad, rtol=1e-9, atol=1e-10, msg=name)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reduced_precision_is_within_its_tolerance_of_float64(dtype):
    kwargs = dict(masking="causal", feature_map="elu1")
    layout = L.sequence(64, 16)
    gen = torch.Generator().manual_seed(4)
    q, k = (torch.randn(2, 64, 2, 16, generator=gen) for _ in range(2))
    v = torch.randn(2, 64, 2, 16, generator=gen)
    w = torch.as_tensor(mhla.init_mixing(layout))
    rounded = [t.to(dtype) for t in (q, k, v)]
    want = mt.mhla_attention(*(t.double() for t in rounded), w.double(), layout, backend="cpp", **kwargs)
    got = mt.mhla_attention(*(t.to(DEVICE) for t in rounded), w.to(DEVICE), layout, backend="torch", **kwargs)
    assert got.dtype == dtype
    # Computed in float32: the result rounded once, half an ulp of the output's scale with room for
    # float32 sums. On bfloat16 operands, phi(q), phi(k), the summaries, the in-block scores, w and
    # the read-outs are rounded too (1.1 half-ulps here).
    ulp = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11
    rounds = 4 if chunk.compute_dtype(dtype, DEVICE) == dtype else 1.01
    assert float((got.cpu().double() - want).abs().max()) <= rounds * ulp * float(want.abs().max())


BAD_CALLS = [
    (lambda q, k, v, w: (q, k[..., :2], v, w, L.sequence(8, 4)), {}),
    (lambda q, k, v, w: (q, k, v[:, :7], w, L.sequence(8, 4)), {}),
    (lambda q, k, v, w: (q, k, v, w[:1, :1], L.sequence(8, 4)), {}),
    (lambda q, k, v, w: (q, k, v, w, L.sequence(9, 4)), {}),
    (lambda q, k, v, w: (q, k, v, -w, L.sequence(8, 4)), {}),
    (lambda q, k, v, w: (q, k, v, w * float("nan"), L.sequence(8, 4)), {}),
    (lambda q, k, v, w: (q, k, v, w, L.grid2d(2, 4, 1, 2)), dict(masking="causal")),
    (lambda q, k, v, w: (q, k, v, w[0], L.sequence(8, 4)), dict(mixing="toeplitz")),
    (lambda q, k, v, w: (q, k, v, w, L.sequence(8, 4)), dict(scale=0.5)),
    (lambda q, k, v, w: (q, k, v, w, L.sequence(8, 4)), dict(eps=-1.0)),
    (lambda q, k, v, w: (q[0], k[0], v[0], w, L.sequence(8, 4)), {}),
    (lambda q, k, v, w: (q[:, :0], k[:, :0], v[:, :0], w, L.sequence(8, 4)), {}),
]


@pytest.mark.parametrize("index", range(len(BAD_CALLS)))
def test_named_errors_are_the_same_on_both_paths(index):
    make, kwargs = BAD_CALLS[index]
    q, k, v = torch.rand(1, 8, 2, 3, dtype=torch.float64), torch.rand(1, 8, 2, 3, dtype=torch.float64), \
        torch.rand(1, 8, 2, 4, dtype=torch.float64)
    args = make(q, k, v, torch.full((2, 2), 0.5, dtype=torch.float64))
    messages = []
    for backend in ("cpp", "torch"):
        with pytest.raises(ValueError) as error:
            mt.mhla_attention(*args, backend=backend, **kwargs)
        messages.append(str(error.value))
    assert messages[0] == messages[1]


def test_dtype_errors_are_named_on_the_torch_path():
    q = torch.rand(1, 8, 2, 3, dtype=torch.float64)
    w = torch.full((2, 2), 0.5, dtype=torch.float64)
    with pytest.raises(TypeError, match="q has dtype int64"):
        mt.mhla_attention(q.long(), q, q, w, L.sequence(8, 4), backend="torch")
    with pytest.raises(TypeError, match="k has dtype float32 but q has float64"):
        mt.mhla_attention(q, q.float(), q, w, L.sequence(8, 4), backend="torch")


def test_varlen_errors_are_the_same_on_both_paths():
    q = torch.rand(1, 10, 2, 3, dtype=torch.float64)
    w = torch.full((2, 2), 0.5, dtype=torch.float64)
    for cu, block in (([0, 4, 9], 4), ([1, 10], 4), ([0, 6, 4, 10], 4), ([0, 10], 2), ([0, 10], 0)):
        messages = []
        for backend in ("cpp", "torch"):
            with pytest.raises(ValueError) as error:
                mt.varlen_attention(q, q, q, w, cu, block=block, backend=backend)
            messages.append(str(error.value))
        assert messages[0] == messages[1], cu


@pytest.mark.parametrize("mixing,per_head,length", [("dense", False, None), ("dense", True, None),
                                                     ("toeplitz", False, 0), ("toeplitz", True, 1),
                                                     ("toeplitz", False, 3)])
def test_decoder_with_torch_state_equals_the_cpp_decoder(mixing, per_head, length):
    gen = torch.Generator().manual_seed(6)
    heads, d, block, batch = 2, 4, 3, 2
    if mixing == "dense":
        w = torch.rand(*([heads] if per_head else []), 5, 5, generator=gen) + 0.05
    else:
        w = torch.rand(*([heads] if per_head else []), length + 1, generator=gen) + 0.05
    options = dict(heads=heads, dk=d, dv=d, block=block, batch=batch, mixing=mixing, feature_map="elu1")
    ours, theirs = mhla.Decoder(w.to(DEVICE), backend="torch", **options), mhla.Decoder(w, **options)
    q, k, v = (torch.randn(batch, 15, heads, d, generator=gen) for _ in range(3))

    def both(method, *args):
        there = [a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args]
        torch.testing.assert_close(getattr(ours, method)(*there).cpu(), getattr(theirs, method)(*args),
                                   rtol=1e-5, atol=1e-5)

    # A prompt for sequence 0 (ending inside a block), then steps for both.
    both("prefill", 0, q[:1, :7], k[:1, :7], v[:1, :7])
    for t in range(7):
        both("step", *(x[:, 7 + t:8 + t].contiguous() for x in (q, k, v)))
    assert [ours.position(s) for s in range(batch)] == [theirs.position(s) for s in range(batch)] == [14, 7]
    ours.reset(0), theirs.reset(0)
    both("step", *(x[:, 14:15].contiguous() for x in (q, k, v)))
    with pytest.raises(TypeError, match="no snapshot format"):
        ours.serialize()
    with pytest.raises(TypeError, match="no snapshot format"):
        ours.save("never-written.bin")
    assert ours.state_bytes > 0


def test_mhla1d_decoding_on_the_torch_path_equals_its_forward():
    torch.manual_seed(3)
    layer = mt.MHLA1d(16, 2, block_size=4, max_tokens=24, causal=True, pos_conv=3, gate=True,
                      backend="torch").to(DEVICE)
    x = torch.randn(2, 11, 16, device=DEVICE)
    cache = layer.new_cache(batch=2)
    assert type(cache.decoder._decoder).__name__ == "TorchDecoder"
    with torch.no_grad():
        full = layer(x)
        parts = [layer.decode(x[:, :6], cache)] + [layer.decode(x[:, t:t + 1], cache) for t in range(6, 11)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="sequence 0 is full"):
        for _ in range(14):
            layer.decode(torch.randn(2, 1, 16, device=DEVICE), cache)


COMPILER = getattr(torch, "compiler", None)


@pytest.mark.skipif(COMPILER is None or not hasattr(COMPILER, "is_compiling"),
                    reason=f"torch.compile needs torch 2.x (this is {torch.__version__})")
@pytest.mark.parametrize("index", range(5))
def test_layers_on_the_torch_path_compile_without_graph_breaks(index):
    # fullgraph=True: any graph break is an error. The compiled layer must equal the eager one,
    # forward and backward.
    make = [lambda: mt.MHLA2d(32, 4, grid=(5, 7), tile=(2, 3), pos_conv=3, gate=True, qk_norm=True),
            lambda: mt.MHLA3d(32, 4, grid=(3, 4, 5), tile=(2, 2, 2), per_head_mixing=True),
            lambda: mt.MHLA1d(32, 4, block_size=4, max_tokens=30, causal=True, pos_conv=3),
            lambda: mt.MHLA1d(32, 4, block_size=4, max_tokens=30, causal=True, variant="authors_lm"),
            lambda: mt.MHLA3d(32, 4, grid=(2, 4, 6), tile=(1, 2, 3), variant="authors_video")][index]
    torch.manual_seed(index)
    layer = make()
    layer.backend = "torch"
    tokens = 30 if isinstance(layer, mt.MHLA1d) else layer.geometry.num_tokens
    x = torch.randn(2, tokens, 32, requires_grad=True)
    compiled = torch.compile(layer, fullgraph=True)
    y = compiled(x)
    y.square().sum().backward()
    grad = x.grad.clone()
    x.grad = None
    want = layer(x)
    want.square().sum().backward()
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad, x.grad, rtol=1e-5, atol=1e-5)
