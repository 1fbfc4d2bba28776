"""mhla.diffusers: MHLA for the self-attention of diffusers' DiT-style transformers."""
import pytest
import torch

diffusers = pytest.importorskip("diffusers")

import mhla.torch as mt  # noqa: E402
from diffusers import DiTTransformer2DModel  # noqa: E402
from mhla.diffusers import MHLAAttnProcessor, swap_attention  # noqa: E402


def small_dit():
    torch.manual_seed(0)
    return DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=4, num_layers=2,
                                 sample_size=8, patch_size=2, num_embeds_ada_norm=10, norm_num_groups=1)


def inputs(batch=2, seed=1):
    g = torch.Generator().manual_seed(seed)
    return dict(hidden_states=torch.randn(batch, 4, 8, 8, generator=g), timestep=torch.randint(0, 10, (batch,), generator=g),
                class_labels=torch.randint(0, 10, (batch,), generator=g))


def test_a_swapped_attention_is_mhla2d_from_the_same_weights():
    model = swap_attention(small_dit(), tile=(2, 2))
    attention = model.transformer_blocks[0].attn1
    processor = attention.processor
    assert isinstance(processor, MHLAAttnProcessor)
    hand = mt.MHLA2d(16, 2, grid=(4, 4), tile=(2, 2))
    with torch.no_grad():
        for mine, theirs in ((hand.q_proj, attention.to_q), (hand.k_proj, attention.to_k),
                             (hand.v_proj, attention.to_v), (hand.out_proj, attention.to_out[0])):
            mine.weight.copy_(theirs.weight)
            mine.bias.copy_(theirs.bias)
        processor.mixing.logits.add_(torch.rand_like(processor.mixing.logits))  # a trained-looking matrix
        hand.mixing.logits.copy_(processor.mixing.logits)
    x = torch.randn(3, 16, 16, requires_grad=True)
    y = x.detach().clone().requires_grad_()
    got, want = attention(x), hand(y)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    g = torch.randn_like(want)
    got.backward(g)
    want.backward(g)
    torch.testing.assert_close(x.grad, y.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(processor.mixing.logits.grad, hand.mixing.logits.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(attention.to_q.weight.grad, hand.q_proj.weight.grad, rtol=1e-5, atol=1e-6)


def test_tiles_that_do_not_divide_the_grid_leave_ragged_blocks_as_in_mhla2d():
    model = swap_attention(small_dit(), tile=(3, 3))
    assert model.transformer_blocks[0].attn1.processor.mixing.blocks == mt.MHLA2d(16, 2, grid=(4, 4), tile=(3, 3)).mixing.blocks
    assert torch.isfinite(model(**inputs()).sample).all()


def test_only_the_chosen_blocks_self_attention_is_swapped_and_its_mixing_is_a_parameter():
    model = swap_attention(small_dit(), tile=(2, 2), layers=[1])
    assert not isinstance(model.transformer_blocks[0].attn1.processor, MHLAAttnProcessor)
    names = [name for name, _ in model.named_parameters() if "mixing" in name]
    assert names == ["transformer_blocks.1.attn1.processor.mixing.logits"]
    state = model.state_dict()
    again = swap_attention(small_dit(), tile=(2, 2), layers=[1])
    again.load_state_dict(state, strict=True)
    with torch.no_grad():
        torch.testing.assert_close(again(**inputs()).sample, model(**inputs()).sample, rtol=0, atol=0)


def test_a_swapped_dit_fine_tunes():
    model = swap_attention(small_dit(), tile=(2, 2)).train()
    batch = inputs(batch=4)
    target = torch.randn(4, 4, 8, 8, generator=torch.Generator().manual_seed(7))
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = torch.nn.functional.mse_loss(model(**batch).sample, target)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0], losses


def test_a_swapped_attention_compiles_as_one_graph():
    model = swap_attention(small_dit(), tile=(2, 2))
    attention = model.transformer_blocks[0].attn1
    x = torch.randn(2, 16, 16)
    compiled = torch.compile(attention, fullgraph=True)
    torch.testing.assert_close(compiled(x), attention(x), rtol=1e-5, atol=1e-6)


def test_what_it_cannot_honour_is_refused_by_name():
    model = swap_attention(small_dit(), tile=(2, 2))
    other = inputs()
    other["hidden_states"] = torch.randn(2, 4, 12, 12)
    with pytest.raises(ValueError, match="patch grid is 6 x 6, but MHLA's mixing matrix was built for 4 x 4"):
        model(**other)
    other["hidden_states"] = torch.randn(2, 4, 9, 9)
    with pytest.raises(ValueError, match="the latent's 9 x 9 does not split into patches of 2"):
        model(**other)
    attention = model.transformer_blocks[0].attn1
    x = torch.randn(1, 16, 16)
    with pytest.raises(ValueError, match="cross-attention stays softmax"):
        attention(x, encoder_hidden_states=x)
    with pytest.raises(ValueError, match="takes no attention_mask"):
        attention(x, attention_mask=torch.ones(1, 16, 16))
    with pytest.raises(ValueError, match="grid and tile are \\(rows, columns\\), got \\(4, 4\\) and \\(2,\\)"):
        swap_attention(small_dit(), tile=(2,))
    with pytest.raises(ValueError, match="block index 4 is out of range for 2 blocks"):
        swap_attention(small_dit(), tile=(2, 2), layers=[4])
    with pytest.raises(ValueError, match="takes DiT-style 2D transformers"):
        swap_attention(torch.nn.Linear(2, 2), tile=(2, 2))
