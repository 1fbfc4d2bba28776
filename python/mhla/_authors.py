"""The attention steps of the authors' public layers (``variant="authors_vision"`` and
``"authors_video"``, docs/authors-compat.md) and their block-major token order."""
import math

import torch

from . import _contract, _wan_rotary
from ._torch_forms import chunk
from ._torch_functions import mhla_attention


def authors_vision_attention(q, k, v, w, layout, *, eps=1e-6, backend=None):
    """The attention of the authors' vision (classification, DiT, video) layers, differentiable.

    Features ``phi(x) = relu(x) + eps``; each query block i reads ``sum_b W[i, b] S_b`` unscaled, and
    the normaliser of the query at position p of block i is ``sum_b W[i, b] phi(q_{b,p})^T z_b + eps``:
    it mixes the queries at the same position p of the other blocks, where the paper (and
    ``mhla_attention``) uses ``phi(q_{i,p})^T sum_b W[i, b] z_b``. Every block must hold the same
    number of tokens, as that code assumes. ``w`` may have any sign (``[M, M]`` or ``[H, M, M]``).
    """
    _contract.check_tensors(function="mhla::forward", q=q, k=k, v=v, w=w)
    blocks, positions, block_size = _block_positions(layout, q.device)
    phi_q, phi_k = torch.relu(q) + eps, torch.relu(k) + eps
    w = w.to(q.dtype)
    numerator = mhla_attention(phi_q, phi_k, v, w, layout, feature_map="identity", normalize=False, scale=1.0,
                               backend=backend)
    batch, tokens, heads, _ = q.shape
    z = phi_k.new_zeros(batch, layout.num_blocks, heads, phi_k.shape[-1]).index_add(1, blocks, phi_k)
    own = (phi_q * z[:, blocks]).sum(-1)  # phi(q_t)^T z_{b(t)}: [B, N, H]
    by_position = _scatter_by_position(own, blocks, positions, layout.num_blocks, block_size)
    mixed = torch.einsum("ib,nbph->niph" if w.dim() == 2 else "hib,nbph->niph", w, by_position) + eps
    return numerator / mixed[:, blocks, positions].unsqueeze(-1)


def authors_video_attention(q, k, v, w, layout, cos, sin, *, eps=1e-6, backend=None):
    """The attention of the authors' video (Wan2.1) layer, differentiable.

    Features ``phi(x) = relu(x) + eps``, then Wan's 3D rotary embedding (``cos``, ``sin`` broadcast
    against ``q [B, N, H, D]``, as diffusers' ``rotary_emb`` or ``_wan_rotary.tables``) on the
    features: each query block i reads ``sum_b W[i, b] S_b`` of ``S_b = sum_{s in b} rot(phi(k_s)) v_s^T``,
    unscaled and with no normaliser. ``w`` may have any sign (``[M, M]`` or ``[H, M, M]``). Half and
    bfloat16 inputs are computed in float32, as their layer does, and come back in their dtype.
    """
    _contract.check_tensors(function="mhla::forward", q=q, k=k, v=v, w=w)
    dtype = q.dtype
    if dtype in (torch.float16, torch.bfloat16):
        q, k, v = q.float(), k.float(), v.float()
    features = [_wan_rotary.rotate(torch.relu(x) + eps, cos, sin) for x in (q, k)]
    o = mhla_attention(*features, v, w.to(q.dtype), layout, feature_map="identity", normalize=False, scale=1.0,
                       backend=backend)
    return o.to(dtype)


def _scatter_by_position(values, blocks, positions, num_blocks, block_size):
    """``values [B, N, H]`` of the tokens laid out as ``[B, M, C, H]`` by (block, position in block)."""
    out = values.new_zeros(values.shape[0], num_blocks, block_size, values.shape[2])
    out[:, blocks, positions] = values
    return out


def block_order(layout):
    """Token indices in block-major order: the authors' vision code holds tokens as ``[B, M, C, dim]``
    (blocks, then tokens inside a block), which is ``x[:, block_order(layout)].view(B, M, C, dim)``
    of this package's row-major ``x [B, N, dim]``; ``y[:, block_order(layout)] = y_theirs.flatten(1, 2)``
    goes back."""
    blocks, _, _ = _block_positions(layout, "cpu")
    return torch.sort(blocks, stable=True).indices


def _block_positions(layout, device):
    """Each token's block and its position inside the block (in token order), on ``device``, and
    the block size; a ValueError unless all blocks hold the same number of tokens. Torch ops and
    Python ints only, so a compiled layer traces it (``layout`` may be a ``Geometry``)."""
    geometry = chunk.Geometry.of(layout)
    axes = slice(3 - geometry.rank, 3)
    grid, tile = geometry.grid[axes], geometry.tile[axes]
    size = geometry.block_size
    if any(g % t for g, t in zip(grid, tile)):
        smallest = math.prod(g % t or t for g, t in zip(grid, tile))
        raise ValueError(f"the authors' normaliser needs blocks of equal size; a {'x'.join(map(str, grid))} grid "
                         f"in {'x'.join(map(str, tile))} tiles has blocks of {smallest} to {size} tokens (make the "
                         "grid a multiple of the tile)")
    # Token t's slot b * size + position: the slot numbers, put in token order.
    slots = chunk.ungroup(torch.arange(geometry.num_blocks * size, device=device).view(1, -1, 1, size, 1),
                                geometry).flatten()
    return slots // size, slots % size, size
