"""Streaming decoding (mhla.Decoder, MHLA1d's decode cache) and packed
variable-length batches (mhla.varlen_*, mhla.torch.varlen_attention) from
Python: each equals the plain operator on the whole sequences, and bad input
is a named error."""
import pickle

import numpy as np
import pytest
import torch

import mhla
import mhla.torch as mt

H, D, C = 2, 4, 3  # heads, head dim, block


def qkv(batch, tokens, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(batch, tokens, H, D, generator=g, dtype=dtype) for _ in range(3))


def dense_w(blocks, dtype=torch.float32, per_head=False):
    w = torch.from_numpy(mhla.init_mixing(mhla.Layout.sequence(blocks * C, C), causal=True)).to(dtype)
    return torch.stack([w, w.flip(0).tril() + 0.1 * torch.eye(blocks, dtype=dtype)]) if per_head else w


def toeplitz_w(length, dtype=torch.float32):
    return torch.from_numpy(mhla.init_toeplitz_mixing(length)).to(dtype)


def causal_forward(q, k, v, w, mixing="dense"):
    """The operator on whole sequences: what the decoder must reproduce."""
    layout = mhla.Layout.sequence(q.shape[1], C)
    if mixing == "dense":
        w = w[..., :layout.num_blocks, :layout.num_blocks].contiguous()
    o = mhla.forward(q, k, v, w, layout=layout, masking="causal", feature_map="elu1", mixing=mixing)
    return o


# ---- mhla.Decoder -------------------------------------------------------------------------------

@pytest.mark.parametrize("mixing, w", [("dense", dense_w(8)), ("dense", dense_w(8, per_head=True)),
                                       ("toeplitz", toeplitz_w(2))], ids=["dense", "dense-per-head", "toeplitz"])
def test_decoder_prefill_and_steps_equal_the_causal_forward(mixing, w):
    prompts, steps = (5, 7), 10  # two sequences at different positions, ragged blocks
    q, k, v = qkv(2, max(prompts) + steps)
    decoder = mhla.Decoder(w, heads=H, dk=D, dv=D, block=C, batch=2, feature_map="elu1", mixing=mixing)
    outputs = [[decoder.prefill(s, q[s:s + 1, :p], k[s:s + 1, :p], v[s:s + 1, :p])] for s, p in enumerate(prompts)]
    for t in range(steps):
        token = [torch.stack([x[s, p + t] for s, p in enumerate(prompts)]).unsqueeze(1) for x in (q, k, v)]
        o = decoder.step(*token)
        assert o.shape == (2, 1, H, D)
        for s in range(2):
            outputs[s].append(o[s:s + 1])
    for s, p in enumerate(prompts):
        assert decoder.position(s) == p + steps
        n = p + steps
        expected = causal_forward(q[s:s + 1, :n], k[s:s + 1, :n], v[s:s + 1, :n], w, mixing)
        torch.testing.assert_close(torch.cat(outputs[s], dim=1), expected, rtol=1e-5, atol=1e-5)


def test_decoder_takes_numpy_and_returns_numpy():
    q, k, v = (x.numpy() for x in qkv(1, 4))
    decoder = mhla.Decoder(dense_w(4).numpy(), heads=H, dk=D, dv=D, block=C)
    o = decoder.prefill(0, q, k, v)
    assert isinstance(o, np.ndarray) and o.shape == (1, 4, H, D)
    assert decoder.max_tokens == 4 * C
    # One finished block, the mixed prefix and the running block per head, in
    # rows padded to 16 floats (then 16 key sums), and one position.
    assert decoder.summary_bytes == (D * 16 + 16) * 4
    assert decoder.state_bytes == 3 * H * decoder.summary_bytes + 8
    assert mhla.Decoder(toeplitz_w(1), heads=H, dk=D, dv=D, block=C, mixing="toeplitz").max_tokens is None


def test_decoder_snapshots_resume_exactly(tmp_path):
    q, k, v = qkv(1, 12)
    decoder = mhla.Decoder(toeplitz_w(2), heads=H, dk=D, dv=D, block=C, mixing="toeplitz", feature_map="elu1")
    decoder.prefill(0, q[:, :7], k[:, :7], v[:, :7])
    decoder.save(tmp_path / "state.bin")
    copies = [mhla.Decoder.load(tmp_path / "state.bin", expect=decoder.options),
              mhla.Decoder.deserialize(decoder.serialize(), expect=decoder),
              pickle.loads(pickle.dumps(decoder))]
    for t in range(7, 12):
        token = [x[:, t:t + 1] for x in (q, k, v)]
        expected = decoder.step(*token)
        for copy in copies:
            assert torch.equal(copy.step(*token), expected)
    assert all(copy.position(0) == 12 for copy in copies)
    decoder.reset(0)
    assert decoder.position(0) == 0 and copies[0].position(0) == 12


def test_decoder_errors_are_named(tmp_path):
    w = dense_w(4)
    with pytest.raises(TypeError, match="w has dtype float64; the decoder computes in float32"):
        mhla.Decoder(w.double(), heads=H, dk=D, dv=D, block=C)
    with pytest.raises(ValueError, match="unknown feature map 'tanh'"):
        mhla.Decoder(w, heads=H, dk=D, dv=D, block=C, feature_map="tanh")
    with pytest.raises(ValueError, match="w"):
        mhla.Decoder(torch.ones(3), heads=H, dk=D, dv=D, block=C)
    decoder = mhla.Decoder(w, heads=H, dk=D, dv=D, block=C, batch=2)
    q, k, v = (x.contiguous() for x in qkv(2, 13))
    with pytest.raises(TypeError, match="q has dtype float64"):
        decoder.step(q[:, :1].double(), k[:, :1].contiguous(), v[:, :1].contiguous())
    with pytest.raises(ValueError, match="q"):
        decoder.step(q[:1, :1], k[:, :1].contiguous(), v[:, :1].contiguous())  # one sequence for a batch of two
    with pytest.raises(ValueError, match=r"prefill: q must be \[1, L, H, Dk\]"):
        decoder.prefill(0, q[0], k[0], v[0])
    with pytest.raises(ValueError, match="sequence 2 out of range"):
        decoder.prefill(2, q[:1, :2], k[:1, :2], v[:1, :2])
    with pytest.raises(ValueError, match="exceeds the context of 12 tokens"):
        decoder.prefill(0, q[:1], k[:1], v[:1])
    other = mhla.Decoder(w, heads=H, dk=D, dv=D, block=C + 1, batch=2)
    other.save(tmp_path / "other.bin")
    with pytest.raises(ValueError, match="other.bin.*block = 4 but block = 3 was expected"):
        mhla.Decoder.load(tmp_path / "other.bin", expect=decoder)
    with pytest.raises(ValueError, match="other.bin"):
        (tmp_path / "other.bin").write_bytes(b"not a decoder")
        mhla.Decoder.load(tmp_path / "other.bin")
    with pytest.raises(ValueError, match="truncated|CRC|short"):
        mhla.Decoder.deserialize(decoder.serialize()[:-5])
    with pytest.raises(TypeError, match="expect must be an mhla.DecoderOptions"):
        mhla.Decoder.deserialize(decoder.serialize(), expect="dense")


class OnGpu:
    """A tensor that says it lives on a GPU; it must be refused before being exported."""

    def __dlpack__(self, stream=None):
        raise AssertionError("must not be exported")

    def __dlpack_device__(self):
        return (2, 0)  # kDLCUDA, device 0


def test_tensors_on_another_device_are_refused_by_name():
    q, k, v = (x.contiguous() for x in qkv(1, 4))
    decoder = mhla.Decoder(dense_w(4), heads=H, dk=D, dv=D, block=C)
    with pytest.raises(ValueError, match="w is on cuda:0; (this function of )?mhla runs on the CPU"):
        mhla.Decoder(OnGpu(), heads=H, dk=D, dv=D, block=C)
    with pytest.raises(ValueError, match="k is on cuda:0; (this function of )?mhla runs on the CPU"):
        decoder.prefill(0, q, OnGpu(), v)
    with pytest.raises(ValueError, match="v is on cuda:0; (this function of )?mhla runs on the CPU"):
        decoder.step(q[:, :1], k[:, :1], OnGpu())
    with pytest.raises(ValueError, match="q is on cuda:0; (this function of )?mhla runs on the CPU"):
        mhla.varlen_forward(OnGpu(), k, v, dense_w(2), [0, 4], block=C)


# ---- packed variable-length batches ------------------------------------------------------------

CU = [0, 5, 5, 12, 13]  # ragged, with an empty sequence and a one-token one


@pytest.mark.parametrize("mixing, masking", [("dense", "causal"), ("dense", "none"), ("toeplitz", "causal")])
def test_varlen_equals_the_operator_on_each_sequence(mixing, masking):
    q, k, v = qkv(1, CU[-1], dtype=torch.float64)
    w = dense_w(3, torch.float64) if mixing == "dense" else toeplitz_w(2, torch.float64)
    o = mhla.varlen_forward(q, k, v, w, torch.tensor(CU), block=C, mixing=mixing, masking=masking,
                            feature_map="elu1")
    for start, end in zip(CU, CU[1:]):
        if start == end:
            continue
        layout = mhla.Layout.sequence(end - start, C)
        ws = w[:layout.num_blocks, :layout.num_blocks].contiguous() if mixing == "dense" else w
        expected = mhla.forward(*(x[:, start:end].contiguous() for x in (q, k, v)), ws, layout=layout,
                                   masking=masking, feature_map="elu1", mixing=mixing)
        torch.testing.assert_close(o[:, start:end], expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mixing", ["dense", "toeplitz"])
def test_varlen_attention_gradients(mixing):
    q, k, v = (x.requires_grad_() for x in qkv(1, CU[-1], dtype=torch.float64))
    # Away from 0: gradcheck's perturbations must keep w non-negative.
    w = (dense_w(3, torch.float64) if mixing == "dense" else toeplitz_w(2, torch.float64)) + 0.1
    w.requires_grad_()

    def f(q, k, v, w):
        return mt.varlen_attention(q, k, v, w, CU, block=C, mixing=mixing, masking="causal", feature_map="elu1")

    assert torch.autograd.gradcheck(f, (q, k, v, w))
    # backward through the plain function agrees with autograd
    o = f(q, k, v, w)
    grad_o = torch.randn_like(o)
    o.backward(grad_o)
    grads = mhla.varlen_backward(*(x.detach() for x in (q, k, v, w, o)), grad_o, np.array(CU), block=C,
                                 mixing=mixing, masking="causal", feature_map="elu1")
    for g, x in zip(grads, (q, k, v, w)):
        torch.testing.assert_close(g, x.grad)


def test_varlen_options_object_equals_the_keywords():
    q, k, v = qkv(1, CU[-1], dtype=torch.float64)
    w = toeplitz_w(2, torch.float64)
    options = mhla.VarlenOptions(block=C, mixing="toeplitz", masking="causal", feature_map="relu", eps=1e-3)
    assert (options.block, options.mixing, options.masking) == (C, mhla.MixingForm.toeplitz, mhla.Masking.causal)
    assert f"block={C}," in repr(options) and "feature_map=relu" in repr(options)
    keywords = dict(block=C, mixing="toeplitz", masking="causal", feature_map="relu", eps=1e-3)
    o = mhla.varlen_forward(q, k, v, w, CU, options=options)
    torch.testing.assert_close(o, mhla.varlen_forward(q, k, v, w, CU, **keywords), rtol=0, atol=0)
    grad_o = torch.randn_like(o)
    for a, b in zip(mhla.varlen_backward(q, k, v, w, o, grad_o, CU, options=options),
                    mhla.varlen_backward(q, k, v, w, o, grad_o, CU, **keywords)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # The defaults are the C++ struct's: 64-token blocks, dense mixing, no masking.
    default = mhla.VarlenOptions()
    assert (default.block, default.mixing, default.masking) == (64, mhla.MixingForm.dense, mhla.Masking.none)
    with pytest.raises(TypeError, match="pass either options=mhla.VarlenOptions"):
        mhla.varlen_forward(q, k, v, w, CU, options=options, block=C)
    with pytest.raises(TypeError, match="options must be an mhla.VarlenOptions"):
        mhla.varlen_forward(q, k, v, w, CU, options=mhla.LinearOptions())
    with pytest.raises(TypeError, match="block must be an int"):
        mhla.VarlenOptions(block="four")


def test_varlen_errors_are_named():
    q, k, v = qkv(1, CU[-1])
    w = dense_w(3)
    with pytest.raises(TypeError, match="cu_seqlens must hold integers, got dtype torch.float32"):
        mhla.varlen_forward(q, k, v, w, torch.tensor([0.0, 13.0]), block=C)
    with pytest.raises(TypeError, match="cu_seqlens must be a 1D sequence"):
        mhla.varlen_forward(q, k, v, w, "0,13", block=C)
    with pytest.raises(ValueError, match="cu_seqlens"):
        mhla.varlen_forward(q, k, v, w, [0, 7, 5, 13], block=C)  # decreasing
    with pytest.raises(ValueError, match="cu_seqlens"):
        mhla.varlen_forward(q, k, v, w, [0, 5, 12], block=C)  # does not end at total
    with pytest.raises(ValueError, match="w"):
        mhla.varlen_forward(q, k, v, dense_w(2), CU, block=C)  # too small for 7 tokens
    with pytest.raises(ValueError, match="unknown mixing form"):
        mt.varlen_attention(q, k, v, w, CU, block=C, mixing="sparse")


# ---- MHLA1d's decode cache ---------------------------------------------------------------------

@pytest.mark.parametrize("options", [{}, dict(pos_conv=3, gate=True, qk_norm=True, per_head_mixing=True)],
                         ids=["plain", "conv-gate-norm-per-head"])
def test_mhla1d_decoding_equals_the_full_forward(options):
    torch.manual_seed(0)
    layer = mt.MHLA1d(16, 2, block_size=4, max_tokens=40, causal=True, **options)
    x = torch.randn(2, 23, 16)
    full = layer(x)
    cache = layer.new_cache(batch=2)
    parts = [layer.decode(x[:, :9], cache)]                                  # prefill
    parts += [layer.decode(x[:, t:t + 1], cache) for t in range(9, 20)]      # token by token
    parts.append(layer.decode(x[:, 20:], cache))                             # several steps at once
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-5, atol=1e-5)
    assert cache.position(0) == cache.position(1) == 23
    cache.reset(1)
    assert cache.position(1) == 0


def test_mhla1d_decode_errors():
    layer = mt.MHLA1d(8, 2, block_size=4, max_tokens=8, causal=True)
    with pytest.raises(ValueError, match="needs a causal layer"):
        mt.MHLA1d(8, 2, block_size=4, max_tokens=8).new_cache()
    cache = layer.new_cache(batch=1)
    with pytest.raises(ValueError, match="the cache holds 1 sequences, x has 2"):
        layer.decode(torch.randn(2, 1, 8), cache)
    with pytest.raises(TypeError, match="cache must come from new_cache"):
        layer.decode(torch.randn(1, 1, 8), {})
    with pytest.raises(ValueError, match="MHLA1d expects x of shape"):
        layer.decode(torch.randn(1, 1, 7), cache)
    layer.decode(torch.randn(1, 8, 8), cache)
    with pytest.raises(ValueError, match="sequence 0 is full: its context holds 8 tokens"):
        layer.decode(torch.randn(1, 1, 8), cache)


def test_the_generation_example_runs():
    import shutil
    import subprocess
    import sys

    import package_location

    if shutil.which("bible") is None:
        pytest.skip("Debian's bible-kjv is not installed (the example's corpus)")
    env = package_location.subprocess_env()
    r = subprocess.run([sys.executable, str(package_location.REPO / "examples" / "generate_text.py"), "--minutes",
                        "0.02", "--contexts", "200", "--sample", "20", "--threads", "1"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "sample (temperature 0.8):\nAnd God said" in r.stdout
    context, cached, uncached, speedup, diff = r.stdout.strip().splitlines()[-1].split()
    assert context == "200" and float(cached) > 0 and float(uncached) > 0
    assert float(diff) < 1e-4  # the cached step gives the full forward's logits


def test_the_decoder_on_numpy_arrays_needs_no_torch():
    # mhla imports torch only where a torch tensor is involved: a process where torch cannot be
    # imported still streams NumPy arrays through mhla.Decoder.
    import subprocess
    import sys

    import package_location

    script = """
import builtins
real_import = builtins.__import__
def without_torch(name, *args, **kwargs):
    if name == "torch" or name.startswith("torch."):
        raise ImportError("torch is not installed here")
    return real_import(name, *args, **kwargs)
builtins.__import__ = without_torch
import numpy as np
import mhla
decoder = mhla.Decoder(np.full((2, 2), 0.5, dtype=np.float32), heads=1, dk=2, dv=2, block=2)
q = np.ones((1, 1, 1, 2), dtype=np.float32)
print(decoder.step(q, q, q).shape)
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       env=package_location.subprocess_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "(1, 1, 1, 2)"
