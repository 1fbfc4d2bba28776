"""Bad input is a Python exception naming the problem, never a crash."""
import os

import numpy as np
import pytest
import torch

import mhla
import mhla.torch as mt

LAYOUT = mhla.Layout.sequence(8, 4)


def good(dtype=torch.float64):
    q = torch.rand(1, 8, 2, 3, dtype=dtype)
    return q, q.clone(), torch.rand(1, 8, 2, 4, dtype=dtype), torch.full((2, 2), 0.5, dtype=dtype)


def test_wrong_dtype():
    q, k, v, w = good()
    with pytest.raises(TypeError, match="k has dtype float64 but q has float16; all tensors of one call share a dtype"):
        mhla.forward(q.half(), k, v, w, layout=LAYOUT)
    with pytest.raises(TypeError, match="q has dtype int32; expected float32, float64, bfloat16 or float16"):
        mhla.forward(q.int(), k.int(), v.int(), w, layout=LAYOUT)
    with pytest.raises(TypeError, match="q has dtype int64"):
        mhla.forward(q.long(), k, v, w, layout=LAYOUT)
    with pytest.raises(TypeError, match="k has dtype float32 but q has float64"):
        mhla.forward(q, k.float(), v, w, layout=LAYOUT)
    with pytest.raises(TypeError, match="v has dtype bfloat16"):
        mt.mhla_attention(q, k, v.bfloat16(), w, LAYOUT)
    # bfloat16 q, k and v are widened together; a float64 one among them is still a mismatch.
    with pytest.raises(TypeError, match="v has dtype float64 but q has bfloat16"):
        mt.mhla_attention(q.bfloat16(), k.bfloat16(), v, w, LAYOUT)


def test_a_result_numpy_cannot_hold_is_refused_by_name():
    # bfloat16 has no NumPy dtype; the extension's conversions return such results.
    result = mhla._core.float32_to_bfloat16(np.ones(4, np.float32))
    with pytest.raises(TypeError, match="a bfloat16 result has no NumPy dtype"):
        np.asarray(result)
    assert torch.equal(torch.from_dlpack(result).float(), torch.ones(4))


def test_wrong_shapes():
    q, k, v, w = good()
    with pytest.raises(ValueError, match=r"w has shape \[3, 3\], expected \[2, 2\]"):
        mhla.forward(q, k, v, torch.ones(3, 3, dtype=torch.float64), layout=LAYOUT)
    with pytest.raises(ValueError, match=r"mhla::forward: q must have rank 4 \[B, N, H, Dk\], got shape \[8, 2, 3\]"):
        mhla.forward(q[0], k, v, w, layout=LAYOUT)
    with pytest.raises(ValueError, match="k"):
        mhla.forward(q, k[:, :7], v, w, layout=LAYOUT)
    with pytest.raises(ValueError, match="layout"):
        mhla.forward(q, k, v, w, layout=mhla.Layout.sequence(9, 4))
    with pytest.raises(ValueError, match="MHLA2d expects x of shape"):
        mt.MHLA2d(8, 2, grid=(3, 3), tile=(2, 2))(torch.rand(1, 9, 7))
    with pytest.raises(ValueError, match="built for a 3x3 grid"):
        mt.MHLA2d(8, 2, grid=(3, 3), tile=(2, 2))(torch.rand(1, 10, 8))
    with pytest.raises(ValueError, match="built for 1..16 tokens"):
        mt.MHLA1d(8, 2, block_size=4, max_tokens=16)(torch.rand(1, 17, 8))


def test_non_contiguous():
    q, k, v, w = good()
    strided = torch.rand(1, 2, 8, 3, dtype=torch.float64).transpose(1, 2)
    with pytest.raises(ValueError, match=r"q with shape \[1, 8, 2, 3\] has strides .* not C order"):
        mhla.forward(strided, k, v, w, layout=LAYOUT)
    with pytest.raises(ValueError, match="not C order"):
        mhla.forward(np.asfortranarray(q.numpy()), k.numpy(), v.numpy(), w.numpy(), layout=LAYOUT)
    # The autograd layer makes its operands contiguous, as torch ops do.
    torch.testing.assert_close(mt.mhla_attention(strided, k, v, w, LAYOUT),
                               mt.mhla_attention(strided.contiguous(), k, v, w, LAYOUT))


def test_not_a_tensor_and_tensors_that_require_grad():
    q, k, v, w = good()
    with pytest.raises(TypeError, match="q must be a tensor that supports DLPack .* not list"):
        mhla.forward([[1.0]], k, v, w, layout=LAYOUT)
    with pytest.raises(TypeError, match="q could not be read through DLPack: .*require gradient"):
        mhla.forward(q.requires_grad_(), k, v, w, layout=LAYOUT)
    with pytest.raises(TypeError, match="w must be a torch.Tensor"):
        mt.mhla_attention(q, k, v, np.ones((2, 2)), LAYOUT)


def test_bad_options():
    q, k, v, w = good()
    with pytest.raises(ValueError, match="unknown masking 'sideways'; expected none, causal or block_causal"):
        mhla.forward(q, k, v, w, layout=LAYOUT, masking="sideways")
    with pytest.raises(ValueError, match="unknown feature map 'tanh'"):
        mhla.linear_attention_forward(q, k, v, feature_map="tanh")
    with pytest.raises(ValueError, match="unknown mixing form"):
        mhla.forward(q, k, v, w, layout=LAYOUT, mixing="sparse")
    with pytest.raises(ValueError, match="unknown mixing transform"):
        mhla.init_mixing(LAYOUT, transform="triangle")
    with pytest.raises(ValueError, match="negative"):
        mhla.forward(q, k, v, -w, layout=LAYOUT)
    with pytest.raises(ValueError, match="Toeplitz"):
        mhla.forward(q, k, v, torch.ones(3, dtype=torch.float64), layout=LAYOUT, mixing="toeplitz")
    with pytest.raises(ValueError, match="pos_conv"):
        mt.MHLA1d(8, 2, block_size=4, max_tokens=16, pos_conv=4)
    with pytest.raises(ValueError, match="not divisible by heads"):
        mt.MHLA1d(10, 3, block_size=4, max_tokens=16)


def test_importing_mhla_first_leaves_torch_and_numpy_blas_working():
    """The extension carries its own OpenBLAS: loaded before torch and NumPy it must
    not become theirs (mixed OpenBLAS flavours in one process hang in GEMM)."""
    import subprocess
    import sys

    script = (
        "import mhla, numpy, torch\n"
        "a = numpy.ones((512, 512)); assert numpy.dot(a, a)[0, 0] == 512\n"
        "t = torch.ones(512, 512); assert torch.mm(t, t)[0, 0].item() == 512\n"
        "l = torch.nn.Linear(128, 128); l(torch.ones(1024, 128)).sum().backward()\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120, env={**__import__("os").environ,
                   "PYTHONPATH": ":".join(sys.path)})


def test_inconsistent_head_dims_and_empty_batches_name_the_called_function():
    q, k, v, w = good()
    with pytest.raises(ValueError, match=r"mhla::forward: k has shape \[1, 8, 2, 2\], expected \[1, 8, 2, 3\]"):
        mt.mhla_attention(q, k[..., :2].contiguous(), v, w, LAYOUT)
    # The output is sized from the shapes first; the error is still forward's.
    empty = torch.rand(0, 8, 2, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"mhla::forward: q has shape \[0, 8, 2, 3\]; every extent must be positive"):
        mt.mhla_attention(empty, empty, torch.rand(0, 8, 2, 4, dtype=torch.float64), w, LAYOUT)
    with pytest.raises(ValueError, match=r"^mhla::forward: options.layout .* has 9 tokens but q has N = 8"):
        mt.mhla_attention(q, k, v, w, mhla.Layout.sequence(9, 4))


def test_finite_input_never_gives_silent_nan():
    q = torch.full((1, 16, 2, 4), 1e19)
    v = torch.full((1, 16, 2, 4), 0.5)
    w = torch.as_tensor(mhla.init_mixing(mhla.Layout.sequence(16, 4)))
    with pytest.raises(ValueError, match=r"o\[0, 0, 0, 0\] = .* is not finite although every input is finite"):
        mhla.forward(q, q, v, w, layout=mhla.Layout.sequence(16, 4), feature_map="elu1")
    o = mhla.forward(q.double(), q.double(), v.double(), w.double(), layout=mhla.Layout.sequence(16, 4),
                        feature_map="elu1")
    torch.testing.assert_close(o, v.double())
    zero = torch.zeros(1, 8, 2, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="eps = 0 with all-zero features"):
        mhla.forward(zero, zero, torch.rand(1, 8, 2, 4, dtype=torch.float64), good()[3], layout=LAYOUT,
                     feature_map="relu", eps=0.0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_a_forward_state_gives_the_recomputed_gradients(dtype):
    q, k, v, w = (t.to(dtype) for t in good())
    w = w.float() if dtype in (torch.bfloat16, torch.float16) else w
    g = torch.rand_like(v)
    o = mhla.forward(q, k, v, w, layout=LAYOUT)
    want = mhla.backward(q, k, v, w, o, g, layout=LAYOUT)
    state = mhla.ForwardState()
    assert state.empty
    o_kept = mhla.forward(q, k, v, w, layout=LAYOUT, state=state)
    assert not state.empty
    assert torch.equal(o_kept, o)
    for got, x in zip(mhla.backward(q, k, v, w, o_kept, g, layout=LAYOUT, state=state), want):
        if dtype == torch.bfloat16:  # the kept summaries are float32; recomputed, bfloat16 products
            torch.testing.assert_close(got.float(), x.float(), rtol=2e-2, atol=2e-2)
        else:
            assert torch.equal(got, x)


def test_a_forward_state_of_another_call_is_refused_by_name():
    q, k, v, w = good()
    g = torch.rand_like(v)
    state = mhla.ForwardState()
    with pytest.raises(ValueError, match="state is empty"):
        mhla.backward(q, k, v, w, v, g, layout=LAYOUT, state=state)
    o = mhla.forward(q, k, v, w, layout=LAYOUT, state=state)
    with pytest.raises(ValueError, match="k is not the tensor that the forward"):
        mhla.backward(q, k.clone(), v, w, o, g, layout=LAYOUT, state=state)
    with pytest.raises(ValueError, match="the options differ"):
        mhla.backward(q, k, v, w, o, g, layout=LAYOUT, masking="block_causal", state=state)
    with pytest.raises(ValueError, match="filled by a forward of float64 tensors, and this backward's q is float32"):
        q32, k32, v32, w32 = (t.float() for t in (q, k, v, w))
        mhla.backward(q32, k32, v32, w32, o.float(), g.float(), layout=LAYOUT, state=state)
    w.mul_(1.01)  # an optimizer step between the passes
    with pytest.raises(ValueError, match="w changed since the forward"):
        mhla.backward(q, k, v, w, o, g, layout=LAYOUT, state=state)


def test_oversized_mixing_and_impossible_allocations():
    with pytest.raises(ValueError, match="limited to M <= 8192"):
        mhla.init_mixing(mhla.Layout.sequence(65536, 1))
    with pytest.raises(MemoryError, match="init_toeplitz_mixing: cannot allocate .* bytes"):
        mhla.init_toeplitz_mixing(2**62)


def test_decoder_load_refuses_endless_and_special_files(tmp_path):
    for path, message in (("/dev/zero", "character device, not a regular file"), (tmp_path, "directory")):
        with pytest.raises(ValueError, match=message):
            mhla.Decoder.load(path)
    fifo = tmp_path / "state.fifo"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="FIFO"):
        mhla.Decoder.load(fifo)  # would wait for a writer forever if it were opened blocking
    huge = tmp_path / "huge.bin"
    with open(huge, "wb") as f:
        f.truncate(8 << 30)  # sparse: no disk is used
    with pytest.raises(ValueError, match="no MHLADEC header"):
        mhla.Decoder.load(huge)  # refused by its magic, not read whole


def test_zero_length_inputs_are_named_errors():
    q = torch.rand(1, 0, 2, 3)
    with pytest.raises(ValueError, match="q"):
        mhla.forward(q, q, torch.rand(1, 0, 2, 4), torch.ones(1, 1), layout=mhla.Layout.sequence(1, 1))
    with pytest.raises(ValueError, match="q"):
        mt.linear_attention(q, q, torch.rand(1, 0, 2, 4))
    with pytest.raises(ValueError, match="q"):
        mt.softmax_attention(q, q, torch.rand(1, 0, 2, 4))
    layer = mt.MHLA1d(8, 2, block_size=4, max_tokens=8, causal=True)
    with pytest.raises(ValueError, match="MHLA1d was built for 1..8 tokens, got 0"):
        layer(torch.randn(1, 0, 8))
    cache = layer.new_cache(batch=1)
    with pytest.raises(ValueError, match=r"MHLA1d.decode needs at least one new token per sequence; x has "
                                         r"shape \(1, 0, 8\)"):
        layer.decode(torch.rand(1, 0, 8), cache)
    with pytest.raises(ValueError, match="the cache holds 1 sequences, x has 0"):
        layer.decode(torch.rand(0, 1, 8), cache)
    decoder = mhla.Decoder(torch.ones(2, 2), heads=2, dk=3, dv=4, block=4)
    with pytest.raises(ValueError, match="q"):
        decoder.step(q, q, torch.rand(1, 0, 2, 4))
    with pytest.raises(ValueError, match="q"):
        decoder.prefill(0, q, q, torch.rand(1, 0, 2, 4))
    with pytest.raises(ValueError, match=r"q has shape \[1, 0, 2, 3\]; every extent must be positive"):
        mt.varlen_attention(q, q, torch.rand(1, 0, 2, 4), torch.ones(1, 1), [0], block=4)


def test_every_entry_defaults_to_elu1():
    assert mhla.Options(LAYOUT).feature_map == mhla.FeatureMap.elu1
    assert mhla.LinearOptions().feature_map == mhla.FeatureMap.elu1
    assert mhla.DecoderOptions(heads=1, dk=1, dv=1, block=1).feature_map == mhla.FeatureMap.elu1
    q, k, v, w = good()
    q = q - 0.5  # where elu+1, relu and identity all differ
    o = mhla.forward(q, k, v, w, layout=LAYOUT)
    o_elu = mhla.forward(q, k, v, w, layout=LAYOUT, feature_map="elu1")
    o_id = mhla.forward(q, k, v, w, layout=LAYOUT, feature_map="identity", normalize=False)
    assert torch.equal(o, o_elu) and not torch.allclose(o, o_id)
    assert torch.equal(mt.mhla_attention(q, k, v, w, LAYOUT), o_elu)
    assert torch.equal(mt.linear_attention(q, k, v), mt.linear_attention(q, k, v, feature_map="elu1"))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_autograd_functions_saved_state_cannot_go_stale(dtype):
    # mhla.torch keeps its saved arrays private and skips their check: an input changed in place
    # between forward and backward must still be refused, by torch itself. (Where the function
    # receives a converted copy, e.g. a float64 w for float32 q, the copy cannot change and the
    # gradients are those of the recorded values, as for any torch op.)
    q, k, v, w = (t.to(dtype) for t in good())
    for changed in ("k", "v", "w"):
        leaves = {name: t.clone().requires_grad_(True) for name, t in zip("qkvw", (q, k, v, w))}
        o = mt.mhla_attention(leaves["q"], leaves["k"], leaves["v"], leaves["w"], LAYOUT)
        with torch.no_grad():
            leaves[changed].add_(0.5)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            o.sum().backward()


def test_numpy_results_without_numpy_say_how_to_do_without(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "numpy", None)  # as if NumPy were not installed
    with pytest.raises(ModuleNotFoundError, match=r"returns a NumPy array unless given like=, and NumPy is not "
                                                  r"installed: install numpy, or pass like="):
        mhla.init_mixing(LAYOUT)
    w = mhla.init_mixing(LAYOUT, like=torch.empty(0))  # what the torch layers need: no NumPy
    assert isinstance(w, torch.Tensor) and w.shape == (2, 2)
    assert mt.MHLA1d(8, 2, block_size=4, max_tokens=8)(torch.rand(1, 8, 8)).shape == (1, 8, 8)
