"""mhla.Options: the C++ options object, built once and handed to forward and backward."""
import pickle

import pytest
import torch

import mhla
import mhla.torch as mt

LAYOUT = mhla.Layout.sequence(8, 4)


def inputs():
    g = torch.Generator().manual_seed(0)
    q = torch.rand(1, 8, 2, 3, dtype=torch.float64, generator=g)
    k = torch.rand(1, 8, 2, 3, dtype=torch.float64, generator=g)
    v = torch.rand(1, 8, 2, 4, dtype=torch.float64, generator=g)
    return q, k, v, torch.full((2, 2), 0.5, dtype=torch.float64)


def test_defaults_are_the_operators_and_names_parse_to_enums():
    o = mhla.Options(LAYOUT)
    assert o.masking == mhla.Masking.none and o.feature_map == mhla.FeatureMap.elu1
    assert o.normalize is True and o.eps == 1e-6 and o.scale is None
    assert o.mixing == mhla.MixingForm.dense and o.layout == LAYOUT
    c = mhla.Options(LAYOUT, masking="causal", feature_map=mhla.FeatureMap.elu1, mixing="toeplitz")
    assert (c.masking, c.feature_map, c.mixing) == (mhla.Masking.causal, mhla.FeatureMap.elu1,
                                                    mhla.MixingForm.toeplitz)
    assert "masking=causal" in repr(c) and "mixing=toeplitz" in repr(c)
    assert mhla.LinearOptions().eps == 1e-6


def test_an_options_object_gives_the_same_results_as_keywords():
    q, k, v, w = inputs()
    opts = mhla.Options(LAYOUT, masking="block_causal", feature_map="elu1")
    o1 = mhla.forward(q, k, v, w, options=opts)
    o2 = mhla.forward(q, k, v, w, layout=LAYOUT, masking="block_causal", feature_map="elu1")
    assert torch.equal(o1, o2)
    g = torch.rand_like(o1)
    for a, b in zip(mhla.backward(q, k, v, w, o1, g, options=opts),
                    mhla.backward(q, k, v, w, o2, g, layout=LAYOUT, masking="block_causal",
                                  feature_map="elu1")):
        assert torch.equal(a, b)
    lo = mhla.LinearOptions(masking="causal")
    (l1,) = (mhla.linear_attention_forward(q, k, v, options=lo),)
    assert torch.equal(l1, mhla.linear_attention_forward(q, k, v, masking="causal"))
    # The autograd function builds one Options object for forward and backward.
    leaves = [t.clone().requires_grad_() for t in (q, k, v, w)]
    mt.mhla_attention(*leaves, LAYOUT, masking="block_causal", feature_map="elu1").backward(g)
    assert torch.allclose(leaves[0].grad, mhla.backward(q, k, v, w, o1, g, options=opts)[0])


def test_bad_options_are_named():
    q, k, v, w = inputs()
    with pytest.raises(TypeError, match="pass either options=mhla.Options"):
        mhla.forward(q, k, v, w, options=mhla.Options(LAYOUT), masking="causal")
    with pytest.raises(TypeError, match="masking must be a str or mhla.Masking, not int"):
        mhla.Options(LAYOUT, masking=3)
    with pytest.raises(TypeError, match="normalize must be a bool, not str"):
        mhla.forward(q, k, v, w, layout=LAYOUT, normalize="yes")
    with pytest.raises(ValueError, match="unknown feature map 'elu'"):
        mhla.Options(LAYOUT, feature_map="elu")
    with pytest.raises(ValueError, match="options.layout is not set"):
        mhla.forward(q, k, v, w)


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_layouts_and_decoders_survive_every_pickle_protocol(protocol):
    # Protocols 0 and 1 rebuild objects differently from 2 and later (they once aborted the process).
    for layout in (LAYOUT, mhla.Layout.grid2d(14, 13, 4, 3), mhla.Layout.grid3d(3, 5, 6, 2, 2, 4)):
        copy = pickle.loads(pickle.dumps(layout, protocol=protocol))
        assert copy == layout and copy.block_grid == layout.block_grid
    q, k, v = (x.float() for x in inputs()[:3])
    decoder = mhla.Decoder(torch.rand(2, 2), heads=2, dk=3, dv=4, block=4)
    decoder.prefill(0, q[:, :5], k[:, :5], v[:, :5])
    copy = pickle.loads(pickle.dumps(decoder, protocol=protocol))
    token = [x[:, 5:6] for x in (q, k, v)]
    assert copy.position(0) == 5 and torch.equal(copy.step(*token), decoder.step(*token))


def test_cuda_kernel_families_are_arguments_of_the_call():
    options = mhla.Options(mhla.Layout.sequence(8, 4), cuda=mhla.CudaKernels(bf16_state=True))
    assert options.cuda.bf16_state and not options.cuda.float16_tensor_cores
    assert "bf16_state=True" in repr(options.cuda)
    with pytest.raises(TypeError, match="cuda must be an mhla.CudaKernels"):
        mhla.Options(mhla.Layout.sequence(8, 4), cuda="bf16_state")
    layout = mhla.Layout.sequence(16, 4)
    q = torch.rand(1, 16, 2, 4)
    w = torch.as_tensor(mhla.init_mixing(layout))
    with pytest.raises(ValueError, match="unknown CUDA kernel family 'bf16'; expected any of bf16_state"):
        mt.mhla_attention(q, q, q, w, layout, cuda_kernels=("bf16",))
    # A CPU call ignores them: the same bits.
    plain = mt.mhla_attention(q, q, q, w, layout)
    asked = mt.mhla_attention(q, q, q, w, layout, cuda_kernels=("bf16_state", "float32_tensor_cores"))
    torch.testing.assert_close(asked, plain, rtol=0, atol=0)
