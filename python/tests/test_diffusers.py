"""mhla.diffusers: MHLA for the self-attention of diffusers' DiT-style transformers and of Wan2.1."""
import pytest
import torch

diffusers = pytest.importorskip("diffusers")

import mhla.torch as mt  # noqa: E402
from authors_equations import authors_video_equations  # noqa: E402
from diffusers import DiTTransformer2DModel, WanTransformer3DModel  # noqa: E402
from mhla.diffusers import (MHLAAttnProcessor, MHLAWanAttnProcessor, authors_wan_layers,  # noqa: E402
                            load_authors_wan_checkpoint, swap_attention)


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
    losses = fine_tune(model, inputs(batch=4), torch.randn(4, 4, 8, 8, generator=torch.Generator().manual_seed(7)), 30)
    assert losses[-1] < 0.7 * losses[0], losses


def fine_tune(model, batch, target, steps):
    """The losses of `steps` AdamW steps fitting model(**batch).sample to target."""
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(**batch).sample, target)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    return losses


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
    with pytest.raises(ValueError, match="takes DiT-style 2D transformers and WanTransformer3DModel"):
        swap_attention(torch.nn.Linear(2, 2), tile=(2, 2))
    with pytest.raises(ValueError, match="gives DiT-style transformers variant='paper', not 'authors_video'"):
        swap_attention(small_dit(), tile=(2, 2), variant="authors_video")


def test_a_second_swap_keeps_trained_layers_and_checks_at_swap_time():
    model = swap_attention(small_dit(), tile=(2, 2), layers=[0])
    mixing = model.transformer_blocks[0].attn1.processor.mixing
    with torch.no_grad():
        mixing.logits.add_(0.5)  # trained values
    trained = mixing.logits.detach().clone()
    with pytest.raises(ValueError, match="block 0's self-attention is MHLA already \\(MHLAAttnProcessor\\)"):
        swap_attention(model, tile=(2, 2))
    assert model.transformer_blocks[0].attn1.processor.mixing is mixing
    torch.testing.assert_close(mixing.logits.detach(), trained, rtol=0, atol=0)
    # Nothing was swapped by the refused call, and the other block still can be, once.
    assert not isinstance(model.transformer_blocks[1].attn1.processor, MHLAAttnProcessor)
    swap_attention(model, tile=(2, 2), layers=[1])
    assert len(model._forward_pre_hooks) == 1
    model(**inputs())
    with pytest.raises(ValueError, match="unknown feature map 'nope'"):
        swap_attention(small_dit(), tile=(2, 2), feature_map="nope")
    with pytest.raises(ValueError, match="tile 5 x 5 does not fit the patch grid 4 x 4"):
        swap_attention(small_dit(), tile=(5, 5))
    with pytest.raises(ValueError, match="tile 1 x 5 x 3 does not fit the patch grid 2 x 4 x 6"):
        swap_attention(WanTransformer3DModel(**WAN), grid=GRID, tile=(1, 5, 3))


# A tiny Wan2.1: 3 blocks, 2 heads of 12 features (Wan's rotary split 4 + 4 + 4), latent 4 x 2 x 8 x 12,
# patches 1 x 2 x 2, so a 2 x 4 x 6 patch grid of 48 tokens, in 1 x 2 x 3 tiles: 8 blocks.
WAN = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
           text_dim=8, freq_dim=8, ffn_dim=16, num_layers=3, rope_max_seq_len=32)
GRID, TILE, MHLA_LAYERS = (2, 4, 6), (1, 2, 3), [1, 2]


def small_wan(layers=MHLA_LAYERS):
    torch.manual_seed(0)
    return swap_attention(WanTransformer3DModel(**WAN), grid=GRID, tile=TILE, layers=layers)


def wan_inputs(batch=2, seed=1, frames=2, height=8, width=12):
    g = torch.Generator().manual_seed(seed)
    return dict(hidden_states=torch.randn(batch, 4, frames, height, width, generator=g),
                timestep=torch.randint(0, 1000, (batch,), generator=g),
                encoder_hidden_states=torch.randn(batch, 5, 8, generator=g))


def rotary_of(model, latent):
    return model.rope(latent)


def test_a_swapped_wan_attention_is_mhla3d_authors_video_from_the_same_weights():
    model = small_wan()
    attention = model.blocks[1].attn1
    processor = attention.processor
    assert isinstance(processor, MHLAWanAttnProcessor)
    assert not isinstance(model.blocks[0].attn1.processor, MHLAWanAttnProcessor)  # a hybrid, as the authors'
    hand = mt.MHLA3d(24, 2, grid=GRID, tile=TILE, variant="authors_video")
    with torch.no_grad():
        for mine, theirs in ((hand.q_proj, attention.to_q), (hand.k_proj, attention.to_k), (hand.v_proj, attention.to_v),
                             (hand.out_proj, attention.to_out[0]), (hand.gate_proj, processor.gate)):
            mine.weight.copy_(theirs.weight)
            mine.bias.copy_(theirs.bias)
        for norm in (attention.norm_q, attention.norm_k, processor.out_norm):
            norm.weight.add_(0.2 * torch.randn_like(norm.weight))
        hand.q_norm.weight.copy_(attention.norm_q.weight)
        hand.k_norm.weight.copy_(attention.norm_k.weight)
        hand.out_norm.weight.copy_(processor.out_norm.weight)
        processor.mixing.weight.add_(0.3 * torch.randn_like(processor.mixing.weight))
        hand.mixing.weight.copy_(processor.mixing.weight)
    x = torch.randn(2, 48, 24, requires_grad=True)
    y = x.detach().clone().requires_grad_()
    got = attention(x, rotary_emb=rotary_of(model, wan_inputs()["hidden_states"]))
    want = hand(y)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    g = torch.randn_like(want)
    got.backward(g)
    want.backward(g)
    torch.testing.assert_close(x.grad, y.grad, rtol=1e-5, atol=1e-6)
    for mine, theirs in ((processor.mixing.weight, hand.mixing.weight), (attention.to_q.weight, hand.q_proj.weight),
                         (attention.norm_k.weight, hand.k_norm.weight), (processor.gate.weight, hand.gate_proj.weight),
                         (processor.out_norm.weight, hand.out_norm.weight), (attention.to_v.bias, hand.v_proj.bias)):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-5, atol=1e-6)


def authors_checkpoint(seed=3):
    """A state dict laid out as the authors' Wan-MHLA checkpoint of the tiny Wan: their WanModel's key
    names and shapes (Wan's original layout; MHLA blocks 1 and 2 with g, g_norm and block_attn.conv)."""
    g = torch.Generator().manual_seed(seed)
    dim, ffn, text, freq, head_dim, blocks = 24, 16, 8, 8, 12, 8
    shapes = {"patch_embedding.weight": (dim, 4, 1, 2, 2), "patch_embedding.bias": (dim,),
              "text_embedding.0.weight": (dim, text), "text_embedding.0.bias": (dim,),
              "text_embedding.2.weight": (dim, dim), "text_embedding.2.bias": (dim,),
              "time_embedding.0.weight": (dim, freq), "time_embedding.0.bias": (dim,),
              "time_embedding.2.weight": (dim, dim), "time_embedding.2.bias": (dim,),
              "time_projection.1.weight": (6 * dim, dim), "time_projection.1.bias": (6 * dim,),
              "head.head.weight": (4 * 4, dim), "head.head.bias": (4 * 4,), "head.modulation": (1, 2, dim)}
    for i in range(3):
        block = f"blocks.{i}."
        shapes[block + "modulation"] = (1, 6, dim)
        shapes[block + "norm3.weight"] = shapes[block + "norm3.bias"] = (dim,)
        for attention in ("self_attn", "cross_attn"):
            for name in "qkvo":
                shapes[f"{block}{attention}.{name}.weight"], shapes[f"{block}{attention}.{name}.bias"] = (dim, dim), (dim,)
            shapes[f"{block}{attention}.norm_q.weight"] = shapes[f"{block}{attention}.norm_k.weight"] = (dim,)
        if i in MHLA_LAYERS:
            shapes[block + "self_attn.g.weight"], shapes[block + "self_attn.g.bias"] = (dim, dim), (dim,)
            shapes[block + "self_attn.g_norm.weight"] = (head_dim,)
            shapes[block + "self_attn.block_attn.conv.weight"] = (blocks, blocks, 1, 1)
        shapes[block + "ffn.0.weight"], shapes[block + "ffn.0.bias"] = (ffn, dim), (ffn,)
        shapes[block + "ffn.2.weight"], shapes[block + "ffn.2.bias"] = (dim, ffn), (dim,)
    return {"state_dict": {key: 0.3 * torch.randn(shape, generator=g) for key, shape in shapes.items()}}


def test_the_authors_checkpoint_loads_and_its_layers_compute_their_equations():
    checkpoint = authors_checkpoint()
    assert authors_wan_layers(checkpoint) == MHLA_LAYERS
    model = load_authors_wan_checkpoint(small_wan(layers=authors_wan_layers(checkpoint)), checkpoint)
    theirs = checkpoint["state_dict"]
    torch.testing.assert_close(model.blocks[2].attn1.processor.mixing.weight,
                               theirs["blocks.2.self_attn.block_attn.conv.weight"].view(8, 8), rtol=0, atol=0)
    torch.testing.assert_close(model.blocks[0].attn1.to_out[0].weight, theirs["blocks.0.self_attn.o.weight"],
                               rtol=0, atol=0)
    latent = wan_inputs()["hidden_states"]
    x = torch.randn(2, 48, 24, dtype=torch.float64)
    model = model.double()
    for i in MHLA_LAYERS:
        prefix = f"blocks.{i}.self_attn."
        weights = {key[len(prefix):]: value.double() for key, value in theirs.items() if key.startswith(prefix)}
        got = model.blocks[i].attn1(x, rotary_emb=rotary_of(model, latent.double()))
        torch.testing.assert_close(got, authors_video_equations(x, weights, 2, GRID, TILE), rtol=1e-6, atol=1e-6)


def test_a_checkpoint_that_does_not_fit_is_refused_by_name():
    checkpoint = authors_checkpoint()
    with pytest.raises(ValueError, match=r"MHLA self-attention is in blocks \[1, 2\], the transformer's in \[2\]"):
        load_authors_wan_checkpoint(small_wan(layers=[2]), checkpoint)
    model = swap_attention(WanTransformer3DModel(**WAN), grid=GRID, tile=(1, 2, 2), layers=MHLA_LAYERS)
    with pytest.raises(ValueError, match=r"block mixing is \(8, 8, 1, 1\), the swapped layer's W is \(12, 12\)"):
        load_authors_wan_checkpoint(model, checkpoint)
    del checkpoint["state_dict"]["blocks.0.ffn.2.bias"]
    with pytest.raises(ValueError, match="missing blocks.0.ffn.net.2.bias; unexpected none"):
        load_authors_wan_checkpoint(small_wan(), checkpoint)
    with pytest.raises(ValueError, match="expected the authors' Wan-MHLA state dict"):
        authors_wan_layers([1, 2])


def test_a_swapped_wan_fine_tunes_and_saves():
    model = small_wan().train()
    batch = wan_inputs(batch=2)
    losses = fine_tune(model, batch, torch.randn(2, 4, 2, 8, 12, generator=torch.Generator().manual_seed(7)), 25)
    assert losses[-1] < 0.7 * losses[0], losses
    names = [name for name, _ in model.named_parameters() if ".processor." in name]
    assert "blocks.1.attn1.processor.mixing.weight" in names and "blocks.2.attn1.processor.gate.weight" in names
    again = small_wan()
    again.load_state_dict(model.state_dict(), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(again(**batch).sample, model(**batch).sample, rtol=0, atol=0)


def test_a_swapped_wan_block_compiles_as_one_graph():
    model = small_wan().eval()
    block = model.blocks[1]
    latent = wan_inputs()
    x = torch.randn(2, 48, 24)
    context = torch.randn(2, 5, 24)
    temb = torch.randn(2, 6, 24)
    rotary = rotary_of(model, latent["hidden_states"])
    compiled = torch.compile(block, fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, context, temb, rotary), block(x, context, temb, rotary),
                                   rtol=1e-5, atol=1e-5)


def test_what_the_wan_processor_cannot_honour_is_refused_by_name():
    model = small_wan()
    with pytest.raises(ValueError, match="latent's patch grid is 3 x 4 x 6, but MHLA's mixing matrix was built for "
                                         "2 x 4 x 6"):
        model(**wan_inputs(frames=3))
    with pytest.raises(ValueError, match="the latent's 2 x 9 x 12 does not split into patches of 1 x 2 x 2"):
        model(**wan_inputs(height=9))
    attention = model.blocks[1].attn1
    x = torch.randn(1, 48, 24)
    rotary = rotary_of(model, wan_inputs()["hidden_states"])
    with pytest.raises(ValueError, match="cross-attention stays softmax"):
        attention(x, encoder_hidden_states=x, rotary_emb=rotary)
    with pytest.raises(ValueError, match="takes no attention_mask"):
        attention(x, attention_mask=torch.ones(1, 48, 48), rotary_emb=rotary)
    with pytest.raises(ValueError, match="needs the transformer's rotary_emb"):
        attention(x)
    with pytest.raises(ValueError, match="no fixed token grid: pass grid=\\(T, H, W\\)"):
        swap_attention(WanTransformer3DModel(**WAN), tile=TILE)
    with pytest.raises(ValueError, match="gives WanTransformer3DModel variant='authors_video' .*, not 'paper'"):
        swap_attention(WanTransformer3DModel(**WAN), grid=GRID, tile=TILE, variant="paper")
    with pytest.raises(ValueError, match="grid and tile are \\(frames, rows, columns\\)"):
        swap_attention(WanTransformer3DModel(**WAN), grid=GRID, tile=(2, 3))
