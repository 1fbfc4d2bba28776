"""variant="authors_vision" / "authors_video" / "authors_lm": the layers of the authors' public code,
each checked against a re-implementation from their equations (authors_equations.py: block-major,
with explicit sums), values and gradients."""
import math

import pytest
import torch
import torch.nn.functional as F

import mhla
import mhla.torch as mt
from authors_equations import authors_video_equations, authors_vision_equations, grid_block_order, wan_rope_complex


@pytest.mark.parametrize("per_head", [False, True])
def test_authors_vision_layer_follows_their_equations(per_head):
    torch.manual_seed(0)
    grid, tile, dim, heads = (4, 6), (2, 3), 12, 2
    layer = mt.MHLA2d(dim, heads, grid=grid, tile=tile, pos_conv=5, per_head_mixing=per_head,
                      variant="authors_vision").double()
    with torch.no_grad():  # an unconstrained W, negative entries included, as their training may leave it
        layer.mixing.weight.add_(0.3 * torch.randn_like(layer.mixing.weight))
    x = torch.randn(2, 24, dim, dtype=torch.float64, requires_grad=True)
    y = layer(x)

    q, k, v = layer.q_proj(x), layer.k_proj(x), layer.v_proj(x)
    split = (2, 24, heads, dim // heads)
    o = authors_vision_equations(q.view(split), k.view(split), v.view(split), layer.mixing.weight,
                                 grid_block_order(grid, tile), 4)
    lepe = layer.pos_conv(v.transpose(1, 2).reshape(2, dim, *grid)).flatten(2).transpose(1, 2)
    expected = layer.out_proj(o.reshape(2, 24, dim) + lepe)
    torch.testing.assert_close(y, expected, rtol=1e-10, atol=1e-10)

    grad = torch.randn_like(y)
    got = torch.autograd.grad(y, (x, layer.mixing.weight), grad, retain_graph=True)
    want = torch.autograd.grad(expected, (x, layer.mixing.weight), grad)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-9)


def test_authors_vision_attention_on_a_video_grid():
    torch.manual_seed(1)
    grid, tile = (2, 4, 4), (1, 2, 2)
    layout = mhla.Layout.grid3d(*grid, *tile)
    q, k, v = (torch.randn(1, 32, 2, 3, dtype=torch.float64) for _ in range(3))
    w = torch.randn(8, 8, dtype=torch.float64)
    got = mt.authors_vision_attention(q, k, v, w, layout)
    torch.testing.assert_close(got, authors_vision_equations(q, k, v, w, grid_block_order(grid, tile), 8))


def test_block_order_is_their_token_layout():
    for grid, tile, layout in [((4, 6), (2, 3), mhla.Layout.grid2d(4, 6, 2, 3)),
                               ((2, 4, 4), (1, 2, 2), mhla.Layout.grid3d(2, 4, 4, 1, 2, 2))]:
        assert torch.equal(mt.block_order(layout), grid_block_order(grid, tile))


def test_authors_vision_initial_w_is_their_column_normalised_transform():
    layer = mt.MHLA2d(8, 2, grid=(8, 8), tile=(2, 2), variant="authors_vision")
    w = layer.mixing()
    torch.testing.assert_close(w.sum(0), torch.ones(16))  # their transform normalises columns
    torch.testing.assert_close(w, torch.from_numpy(mhla.init_mixing(mhla.Layout.grid2d(8, 8, 2, 2))).t())


def causal_equations(q, k, v, w, block, scale):
    """Unnormalised causal MHLA as an explicit attention matrix:
    A[t, s] = scale * W[b(t), b(s)] phi(q_t)^T phi(k_s) for s <= t, phi = elu + 1; o = A v."""
    tokens = q.shape[1]
    b = torch.arange(tokens) // block
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    scores = torch.einsum("nthd,nshd->nhts", phi_q, phi_k) * scale
    weights = w[b][:, b] if w.dim() == 2 else w[:, b][:, :, b]
    scores = scores * weights * torch.ones(tokens, tokens, dtype=q.dtype).tril()
    return torch.einsum("nhts,nshd->nthd", scores, v)


def test_authors_lm_layer_is_unnormalised_with_w_clamped():
    torch.manual_seed(2)
    dim, heads, block = 8, 2, 3
    layer = mt.MHLA1d(dim, heads, block_size=block, max_tokens=12, causal=True, variant="authors_lm").double()
    with torch.no_grad():
        layer.mixing.weight[2, 0] = 5.0    # clamped to 1
        layer.mixing.weight[3, 1] = -3.0   # clamped to 1e-5
    x = torch.randn(2, 11, dim, dtype=torch.float64)
    y = layer(x)
    split = (2, 11, heads, dim // heads)
    w = layer.mixing.weight.detach().clamp(1e-5, 1.0)
    o = causal_equations(layer.q_proj(x).view(split), layer.k_proj(x).view(split), layer.v_proj(x).view(split),
                         w, block, (dim // heads) ** -0.5)
    torch.testing.assert_close(y, layer.out_proj(o.reshape(2, 11, dim)), rtol=1e-10, atol=1e-10)
    y.sum().backward()
    grad = layer.mixing.weight.grad
    assert grad[2, 0] == 0 and grad[3, 1] == 0 and grad[1, 0] != 0  # clamped entries get no gradient


def test_authors_lm_layer_decodes_with_the_cache():
    torch.manual_seed(3)
    layer = mt.MHLA1d(8, 2, block_size=4, max_tokens=20, causal=True, variant="authors_lm")
    x = torch.randn(1, 18, 8)
    cache = layer.new_cache()
    steps = [layer.decode(x[:, :5], cache)] + [layer.decode(x[:, t:t + 1], cache) for t in range(5, 18)]
    torch.testing.assert_close(torch.cat(steps, 1), layer(x), rtol=1e-5, atol=1e-5)


def test_variant_errors_are_named():
    with pytest.raises(ValueError, match="unknown variant 'theirs'; expected one of paper, authors_vision"):
        mt.MHLA2d(8, 2, grid=(4, 4), tile=(2, 2), variant="theirs")
    with pytest.raises(ValueError, match="authors_vision' is the authors' non-causal vision layer"):
        mt.MHLA1d(8, 2, block_size=4, max_tokens=8, causal=True, variant="authors_vision")
    with pytest.raises(ValueError, match="pass causal=True"):
        mt.MHLA1d(8, 2, block_size=4, max_tokens=8, variant="authors_lm")
    layer = mt.MHLA2d(8, 2, grid=(5, 5), tile=(2, 2), variant="authors_vision")
    with pytest.raises(ValueError, match="needs blocks of equal size; .* has blocks of 1 to 4 tokens"):
        layer(torch.randn(1, 25, 8))


def authors_video_weights(layer):
    """The layer's parameters under the names of the authors' layer."""
    weights = {"norm_q.weight": layer.q_norm.weight, "norm_k.weight": layer.k_norm.weight,
               "g_norm.weight": layer.out_norm.weight, "block_attn.conv.weight": layer.mixing.weight}
    for theirs, ours in (("q", layer.q_proj), ("k", layer.k_proj), ("v", layer.v_proj), ("o", layer.out_proj),
                         ("g", layer.gate_proj)):
        weights[theirs + ".weight"], weights[theirs + ".bias"] = ours.weight, ours.bias
    return weights


@pytest.mark.parametrize("per_head", [False, True])
def test_authors_video_layer_follows_their_equations(per_head):
    torch.manual_seed(4)
    grid, tile, dim, heads = (2, 4, 6), (1, 2, 3), 24, 2   # head_dim 12: Wan's split into 4 + 4 + 4 features
    layer = mt.MHLA3d(dim, heads, grid=grid, tile=tile, per_head_mixing=per_head, variant="authors_video").double()
    with torch.no_grad():  # trained-looking norms and an unconstrained W
        for norm in (layer.q_norm, layer.k_norm, layer.out_norm):
            norm.weight.add_(0.2 * torch.randn_like(norm.weight))
        layer.mixing.weight.add_(0.3 * torch.randn_like(layer.mixing.weight))
    x = torch.randn(2, 48, dim, dtype=torch.float64, requires_grad=True)
    y = layer(x)
    expected = authors_video_equations(x, authors_video_weights(layer), heads, grid, tile)

    grad = torch.randn_like(y)
    weights = (x, layer.mixing.weight, layer.q_norm.weight, layer.gate_proj.weight, layer.out_norm.weight)
    got = torch.autograd.grad(y, weights, grad, retain_graph=True)
    want = torch.autograd.grad(expected, weights, grad)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-9)


def test_authors_video_rotary_is_wans():
    from mhla import _wan_rotary
    torch.manual_seed(5)
    for grid, head_dim in [((3, 4, 5), 12), ((2, 3, 2), 16), ((2, 2, 2), 128)]:
        x = torch.randn(1, math.prod(grid), 2, head_dim, dtype=torch.float64)
        cos, sin = _wan_rotary.tables(grid, head_dim)
        torch.testing.assert_close(_wan_rotary.rotate(x, cos.unsqueeze(1), sin.unsqueeze(1)),
                                   wan_rope_complex(x, grid), rtol=1e-12, atol=1e-12)


def test_authors_video_initial_w_is_their_column_normalised_transform():
    layer = mt.MHLA3d(24, 2, grid=(3, 4, 4), tile=(1, 2, 2), variant="authors_video")
    torch.testing.assert_close(layer.mixing().sum(0), torch.ones(12))
    torch.testing.assert_close(layer.mixing(), torch.from_numpy(mhla.init_mixing(mhla.Layout.grid3d(3, 4, 4, 1, 2, 2))).t())


def test_authors_video_errors_are_named():
    with pytest.raises(ValueError, match="authors' Wan2.1 video layer: build it as MHLA3d"):
        mt.MHLA2d(8, 2, grid=(4, 4), tile=(2, 2), variant="authors_video")
    with pytest.raises(ValueError, match="its own q/k RMSNorm and SiLU gate and no positional conv"):
        mt.MHLA3d(24, 2, grid=(2, 4, 4), tile=(1, 2, 2), gate=True, variant="authors_video")
    with pytest.raises(ValueError, match="even head_dim of at least 6 .* got 4"):
        mt.MHLA3d(8, 2, grid=(2, 4, 4), tile=(1, 2, 2), variant="authors_video")
