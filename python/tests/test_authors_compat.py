"""variant="authors_vision" / "authors_lm": the layers of the authors' public code,
each checked against a re-implementation written here from their equations
(block-major, with explicit sums), values and gradients."""
import math

import pytest
import torch
import torch.nn.functional as F

import mhla
import mhla.torch as mt

EPS = 1e-6  # the authors' feature and normaliser epsilon


def grid_block_order(grid, tile):
    """Token indices (row-major over the grid) in block-major order: blocks row-major over the
    block grid, tokens row-major inside each block. Tiles must divide the grid."""
    axes = [range(0, g, t) for g, t in zip(grid, tile)]
    order = []
    for corner in torch.cartesian_prod(*(torch.tensor(list(a)) for a in axes)).view(-1, len(grid)).tolist():
        inside = torch.cartesian_prod(*(torch.arange(c, c + t) for c, t in zip(corner, tile))).view(-1, len(grid))
        for point in inside.tolist():
            index = 0
            for coordinate, extent in zip(point, grid):
                index = index * extent + coordinate
            order.append(index)
    return torch.tensor(order)


def authors_vision_equations(q, k, v, w, order, blocks):
    """Their vision attention, block-major, per block i and in-block position p:
    phi(x) = relu(x) + eps; KV_b = sum_p phi(k_bp) v_bp^T; z_b = sum_p phi(k_bp);
    o_ip = phi(q_ip)^T (sum_b W[i,b] KV_b) / (sum_b W[i,b] phi(q_bp)^T z_b + eps)."""
    batch, tokens, heads, dim = q.shape
    size = tokens // blocks
    qb, kb, vb = (x[:, order].view(batch, blocks, size, heads, -1) for x in (q, k, v))
    phi_q, phi_k = F.relu(qb) + EPS, F.relu(kb) + EPS
    out = torch.empty_like(vb)
    for h in range(heads):
        wh = w if w.dim() == 2 else w[h]
        kv = [phi_k[:, b, :, h].transpose(1, 2) @ vb[:, b, :, h] for b in range(blocks)]  # [B, D, Dv]
        z = [phi_k[:, b, :, h].sum(1) for b in range(blocks)]                              # [B, D]
        for i in range(blocks):
            mixed = sum(wh[i, b] * kv[b] for b in range(blocks))
            for p in range(size):
                den = sum(wh[i, b] * (phi_q[:, b, p, h] * z[b]).sum(-1) for b in range(blocks)) + EPS
                out[:, i, p, h] = (phi_q[:, i, p, h].unsqueeze(1) @ mixed).squeeze(1) / den.unsqueeze(-1)
    tokens_out = torch.empty_like(v)
    tokens_out[:, order] = out.reshape(batch, tokens, heads, -1)
    return tokens_out


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
