"""mhla.timm: MHLA in timm's Vision Transformers, and the swap from a softmax model's weights."""
import copy

import pytest
import torch

timm = pytest.importorskip("timm")

import mhla.torch as mt  # noqa: E402
from mhla.timm import MHLAAttention, swap_attention  # noqa: E402
from timm.models.vision_transformer import VisionTransformer  # noqa: E402

GRID, TILE = (4, 6), (2, 3)


def small_vit(**overrides):
    torch.manual_seed(0)
    options = dict(img_size=(16, 24), patch_size=4, embed_dim=32, depth=2, num_heads=4, num_classes=10,
                   class_token=False, global_pool="avg", qkv_bias=True)
    options.update(overrides)
    return VisionTransformer(**options).eval()


def hand_built_layers(softmax_model, tile=TILE):
    """MHLA2d layers made by hand from each block's softmax attention weights."""
    layers = []
    for block in softmax_model.blocks:
        attention = block.attn
        layer = mt.MHLA2d(32, 4, grid=GRID, tile=tile, bias=attention.qkv.bias is not None)
        with torch.no_grad():
            q, k, v = attention.qkv.weight.chunk(3)
            layer.q_proj.weight.copy_(q), layer.k_proj.weight.copy_(k), layer.v_proj.weight.copy_(v)
            if attention.qkv.bias is not None:
                bq, bk, bv = attention.qkv.bias.chunk(3)
                layer.q_proj.bias.copy_(bq), layer.k_proj.bias.copy_(bk), layer.v_proj.bias.copy_(bv)
            layer.out_proj.weight.copy_(attention.proj.weight)
            layer.out_proj.bias.copy_(attention.proj.bias)
        layers.append(layer)
    return layers


def hand_built_forward(vit, layers, images):
    """The ViT's forward written out, with the hand-built layers as its attention."""
    x = vit.norm_pre(vit._pos_embed(vit.patch_embed(images)))
    for block, layer in zip(vit.blocks, layers):
        x = x + block.ls1(layer(block.norm1(x)))
        x = x + block.ls2(block.mlp(block.norm2(x)))
    return vit.forward_head(vit.norm(x))


def test_a_swapped_vit_equals_the_model_built_by_hand_forward_and_backward():
    softmax_model = small_vit()
    layers = hand_built_layers(softmax_model)
    model = swap_attention(copy.deepcopy(softmax_model), tile=TILE)
    assert all(isinstance(block.attn, MHLAAttention) for block in model.blocks)
    images = torch.randn(3, 3, 16, 24)
    got = model(images)
    want = hand_built_forward(model, layers, images)
    torch.testing.assert_close(got, want)
    got.square().sum().backward()
    want.square().sum().backward()
    for block, layer in zip(model.blocks, layers):
        ours = block.attn.layer
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            torch.testing.assert_close(getattr(ours, name).weight.grad, getattr(layer, name).weight.grad)
        torch.testing.assert_close(ours.mixing.logits.grad, layer.mixing.logits.grad)


def test_the_swap_keeps_the_softmax_models_other_weights_and_its_projection():
    softmax_model = small_vit(qkv_bias=False)
    model = swap_attention(copy.deepcopy(softmax_model), tile=TILE)
    for before, after in zip(softmax_model.blocks, model.blocks):
        assert after.attn.layer.q_proj.bias is None
        torch.testing.assert_close(after.attn.proj.weight, before.attn.proj.weight)
        torch.testing.assert_close(after.mlp.fc1.weight, before.mlp.fc1.weight)
        assert after.attn.layer.layout.num_blocks == 4


def test_models_from_create_model_swap_and_train():
    model = timm.create_model("deit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2,
                              num_classes=4, class_token=False, global_pool="avg")
    swap_attention(model, tile=(2, 2), pos_conv=3)
    torch.manual_seed(0)
    images, labels = torch.randn(8, 3, 32, 32), torch.arange(8) % 4
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    losses = []
    for _ in range(15):
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses
    assert all(block.attn.layer.mixing.logits.grad is not None for block in model.blocks)


def test_linear_kind_is_linear_attention_of_the_same_projections():
    softmax_model = small_vit()
    model = swap_attention(copy.deepcopy(softmax_model), tile=TILE, kind="linear")
    attention = model.blocks[0].attn
    assert attention.layer.layout.num_blocks == 1
    x = torch.randn(2, 24, 32)
    layer = attention.layer
    q, k, v = layer._project(x)
    want = layer.out_proj(mt.linear_attention(q, k, v).reshape(2, 24, 32))
    torch.testing.assert_close(attention(x), want)


def test_what_cannot_be_swapped_is_named():
    with pytest.raises(ValueError, match="1 prefix token.*class_token=False, global_pool='avg'"):
        swap_attention(small_vit(class_token=True, global_pool="token"), tile=TILE)
    with pytest.raises(ValueError, match="unknown kind 'softmax'"):
        swap_attention(small_vit(), tile=TILE, kind="softmax")
    with pytest.raises(ValueError, match="has no patch_embed.grid_size"):
        swap_attention(torch.nn.Linear(2, 2), tile=TILE)
    with pytest.raises(ValueError, match="scale_norm=True"):
        swap_attention(small_vit(scale_attn_norm=True), tile=TILE)
    with pytest.raises(ValueError, match="takes no attn_mask"):
        swap_attention(small_vit(), tile=TILE).blocks[0].attn(torch.randn(1, 24, 32), attn_mask=torch.ones(24, 24))
