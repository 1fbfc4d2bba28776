"""The phase functions from Python: chained, they equal mhla.forward and mhla.backward."""
import numpy as np
import pytest

import mhla


@pytest.mark.parametrize("masking", ["none", "causal", "block_causal"])
def test_three_phases_equal_the_operator(masking):
    rng = np.random.default_rng(3)
    layout = mhla.Layout.sequence(23, 4)
    m = layout.num_blocks
    q, k = (rng.uniform(-1, 1, (2, 23, 3, 5)) for _ in range(2))
    v, g = (rng.uniform(-1, 1, (2, 23, 3, 4)) for _ in range(2))
    w = rng.uniform(0.05, 1, (m, m))
    opts = mhla.Options(layout, masking=masking, feature_map="elu1")

    s = mhla.block_summaries(k, v, options=opts)
    assert s.shape == (2, 3, m, 5, 5)
    mixed = mhla.mix_summaries(w, s, options=opts, first_block=0, blocks=m)
    o = mhla.read_out(q, k, v, w, mixed, options=opts, first_block=0)
    want = mhla.forward(q, k, v, w, options=opts)
    np.testing.assert_allclose(o, want, rtol=0, atol=1e-13)

    gq, gk, gv, gmixed, gw = mhla.read_out_backward(q, k, v, w, mixed, o, g, options=opts, first_block=0)
    gs, gw2 = mhla.mix_summaries_backward(w, s, gmixed, options=opts, first_block=0)
    gk2, gv2 = mhla.block_summaries_backward(k, v, gs, options=opts)
    want_grads = mhla.backward(q, k, v, w, want, g, options=opts)
    for got, expected in zip((gq, gk + gk2, gv + gv2, gw + gw2), want_grads):
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)


def test_plan_shards_names_a_cut_inside_a_block():
    shards = mhla.plan_shards(mhla.Layout.sequence(16, 4), [8, 8])
    assert (shards[1].first_token, shards[1].first_block, shards[1].blocks) == (8, 2, 2)
    with pytest.raises(ValueError, match="rank 0 holds tokens 0..5, which ends inside block 1"):
        mhla.plan_shards(mhla.Layout.sequence(16, 4), [6, 10])
