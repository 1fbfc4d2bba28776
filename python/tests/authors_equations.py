"""The authors' public MHLA layers written from their equations, block-major with explicit sums and
independent of the package's layout code: the references of test_authors_compat.py and
test_diffusers.py."""
import math

import torch
import torch.nn.functional as F

EPS = 1e-6  # the authors' feature, normaliser and RMSNorm epsilon


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


def wan_rope_complex(x, grid, theta=10000.0):
    """Wan's 3D RoPE as their code states it: a head's D features as D/2 complex numbers, the first
    c - 2 (c // 3) of the c = D/2 multiplied by e^{i f w_j}, then c // 3 by e^{i h w_j}, c // 3 by
    e^{i w w_j}, with w_j = theta^(-2j / d) over each part's d = 2 * (its count) features."""
    batch, tokens, heads, dim = x.shape
    c = dim // 2
    counts = (c - 2 * (c // 3), c // 3, c // 3)
    frames, rows, cols = grid
    index = torch.arange(tokens)
    coordinates = (index // (rows * cols), (index // cols) % rows, index % cols)
    angles = torch.cat([coordinate.double().unsqueeze(1) * theta ** (-torch.arange(0, 2 * n, 2).double() / (2 * n))
                        for coordinate, n in zip(coordinates, counts)], dim=1)       # [N, c]
    turned = torch.view_as_complex(x.double().reshape(batch, tokens, heads, c, 2).contiguous()) * \
        torch.polar(torch.ones_like(angles), angles).unsqueeze(1)
    return torch.view_as_real(turned).reshape(batch, tokens, heads, dim).to(x.dtype)


def rms(x, weight, eps=EPS):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def authors_video_equations(x, weights, heads, grid, tile):
    """Their Wan2.1 layer (``MHLA_Video_Uni`` as configured for Wan2.1: gated, no normaliser), block-major,
    from ``weights`` under their names (q, k, v, o, g as ``NAME.weight``/``NAME.bias``, ``norm_q.weight``,
    ``norm_k.weight``, ``g_norm.weight``, ``block_attn.conv.weight`` [M, M, 1, 1]): q, k RMS-normalised over
    the whole width; phi = relu + eps; S_b = sum_p rope(phi(k_bp)) v_bp^T;
    o_ip = rope(phi(q_ip))^T sum_b W[i,b] S_b; then each head RMS-normalised, times silu(g(x)), through o."""
    batch, tokens, dim = x.shape

    def linear(name, t):
        return F.linear(t, weights[name + ".weight"], weights[name + ".bias"])
    split = (batch, tokens, heads, -1)
    q = rms(linear("q", x), weights["norm_q.weight"]).view(split)
    k = rms(linear("k", x), weights["norm_k.weight"]).view(split)
    v = linear("v", x).view(split)
    q, k = wan_rope_complex(F.relu(q) + EPS, grid), wan_rope_complex(F.relu(k) + EPS, grid)
    order = grid_block_order(grid, tile)
    blocks = math.prod(g // t for g, t in zip(grid, tile))
    qb, kb, vb = (t[:, order].view(batch, blocks, -1, heads, t.shape[-1]) for t in (q, k, v))
    w = weights["block_attn.conv.weight"]
    w = w.flatten(-3) if w.dim() == 4 else w     # their 1x1 convolution's [M, M, 1, 1], or per head [H, M, M]
    summaries = torch.einsum("nbphd,nbphe->nbhde", kb, vb)
    mixed = torch.einsum("ib,nbhde->nihde" if w.dim() == 2 else "hib,nbhde->nihde", w, summaries)
    out = torch.empty_like(v)
    out[:, order] = torch.einsum("niphd,nihde->niphe", qb, mixed).reshape(out.shape)
    gated = rms(out, weights["g_norm.weight"]).reshape(batch, tokens, dim) * F.silu(linear("g", x))
    return linear("o", gated)
