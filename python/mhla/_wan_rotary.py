"""Wan2.1's 3D rotary position embedding, for ``variant="authors_video"`` (docs/authors-compat.md).

A head's D features are D/2 pairs ``(2j, 2j + 1)``, each rotated by an angle. The first
``D - 4 (D // 6)`` features turn with the token's frame index, the next ``2 (D // 6)`` with its
row, the last ``2 (D // 6)`` with its column; pair j of an axis ``d`` features wide turns by
``theta^(-2j / d)`` per step along that axis. This is the table diffusers' ``WanRotaryPosEmbed``
hands each self-attention as ``rotary_emb``, so one rotation serves the layer and the processor.
"""
import torch


def axis_widths(head_dim):
    """The features turned by the frame, row and column index; a ValueError when Wan's split has no room."""
    side = 2 * (head_dim // 6)
    if head_dim % 2 or side == 0:
        raise ValueError(f"Wan's 3D rotary embedding needs an even head_dim of at least 6 (pairs of features "
                         f"split over frames, rows and columns), got {head_dim}")
    return head_dim - 2 * side, side, side


def tables(grid, head_dim, theta=10000.0):
    """``(cos, sin)``, each ``[N, head_dim]`` in float64, for the ``N = T H W`` tokens of ``grid = (T, H, W)``
    in row-major order; each pair's angle is repeated over its two features."""
    positions = torch.cartesian_prod(*(torch.arange(n, dtype=torch.float64) for n in grid)).view(-1, 3)
    angles = [positions[:, axis:axis + 1] * theta ** (-torch.arange(0, width, 2, dtype=torch.float64) / width)
              for axis, width in enumerate(axis_widths(head_dim))]
    angles = torch.cat(angles, dim=1).repeat_interleave(2, dim=1)
    return angles.cos(), angles.sin()


def rotate(x, cos, sin):
    """``x [..., D]`` with each feature pair ``(a, b)`` turned to ``(a cos - b sin, a sin + b cos)``;
    ``cos`` and ``sin`` broadcast against ``x`` and hold each pair's value twice."""
    pairs = x.unflatten(-1, (-1, 2))
    quarter_turn = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    return x * cos.to(x.dtype) + quarter_turn * sin.to(x.dtype)
