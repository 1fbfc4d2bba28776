"""MHLA in diffusers' image transformers (tested with diffusers 0.42.1).

``swap_attention(transformer, tile=...)`` gives the self-attention of a DiT-style
transformer (``DiTTransformer2DModel``, ``PixArtTransformer2DModel`` and the
models whose blocks hold diffusers' ``Attention`` as ``attn1`` over patch
tokens) an ``MHLAAttnProcessor``: MHLA over the model's patch grid in tiles,
through the attention's own (pretrained) ``to_q``, ``to_k``, ``to_v`` and
``to_out``. The processor is an ``nn.Module`` whose mixing matrix is an
ordinary parameter of the model (optimisers, ``state_dict`` and
``save_pretrained`` see it), initialised from the locality prior.
Cross-attention (``attn2``) stays softmax.

diffusers' processors are not given the token grid, so the swap installs a
forward pre-hook on the transformer that reads it from the latent's shape
(height and width over ``patch_size``) on every call; a latent of another grid
than the one the mixing matrix was built for is refused by name.
"""
import torch
from torch import nn

from . import _core
from .torch import MixingMatrix, mhla_attention

__all__ = ["MHLAAttnProcessor", "swap_attention"]


class _Grid:
    """The patch grid of the transformer's current call, set by its forward pre-hook."""

    def __init__(self, patch_size):
        self.patch_size = patch_size
        self.shape = None

    def hook(self, module, args, kwargs):
        latent = kwargs.get("hidden_states", args[0] if args else None)
        if not isinstance(latent, torch.Tensor) or latent.dim() != 4:
            raise ValueError("MHLA's processors read the patch grid from a latent [B, C, H, W]; the transformer "
                             f"got {type(latent).__name__ if not isinstance(latent, torch.Tensor) else tuple(latent.shape)}")
        height, width = latent.shape[-2:]
        if height % self.patch_size or width % self.patch_size:
            raise ValueError(f"the latent's {height} x {width} does not split into patches of {self.patch_size}")
        self.shape = (height // self.patch_size, width // self.patch_size)


class MHLAAttnProcessor(nn.Module):
    """A diffusers attention processor computing MHLA (normalized, ``feature_map`` features) over a
    ``grid`` of patch tokens in ``tile`` tiles, with the attention's own projections."""

    def __init__(self, heads, grid, tile, *, feature_map="elu1", mixing_init="linear", per_head_mixing=False,
                 current_grid=None):
        super().__init__()
        grid, tile = tuple(grid), tuple(tile)
        if len(grid) != 2 or len(tile) != 2:
            raise ValueError(f"grid and tile are (rows, columns), got {grid} and {tile}")
        # Tiles that do not divide the grid leave ragged edge blocks, as in MHLA2d.
        self.grid, self.tile, self.feature_map = grid, tile, feature_map
        self.layout = _core.Layout.grid2d(*grid, *tile)
        self.mixing = MixingMatrix(self.layout, heads=heads if per_head_mixing else None, init=mixing_init)
        self._current_grid = current_grid

    def forward(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None, **kwargs):
        if encoder_hidden_states is not None:
            raise ValueError("MHLAAttnProcessor replaces self-attention only; cross-attention stays softmax")
        if attention_mask is not None:
            raise ValueError("MHLAAttnProcessor takes no attention_mask: MHLA's blocks are the patch grid")
        if kwargs:
            raise ValueError(f"MHLAAttnProcessor cannot honour attention kwargs: {', '.join(sorted(kwargs))}")
        if self._current_grid is not None and self._current_grid.shape not in (None, self.grid):
            raise ValueError(f"the latent's patch grid is {self._current_grid.shape[0]} x "
                             f"{self._current_grid.shape[1]}, but MHLA's mixing matrix was built for "
                             f"{self.grid[0]} x {self.grid[1]}")
        if attn.spatial_norm is not None or attn.group_norm is not None or hidden_states.dim() != 3:
            raise ValueError("MHLAAttnProcessor takes token sequences [B, N, C] without spatial or group norms")
        batch, tokens, _ = hidden_states.shape
        if tokens != self.grid[0] * self.grid[1]:
            raise ValueError(f"{tokens} tokens, but the patch grid {self.grid[0]} x {self.grid[1]} has "
                             f"{self.grid[0] * self.grid[1]}")
        residual = hidden_states
        split = (batch, tokens, attn.heads, -1)
        q = attn.to_q(hidden_states).view(split)
        k = attn.to_k(hidden_states).view(split)
        v = attn.to_v(hidden_states).view(split)
        if attn.norm_q is not None:
            q = attn.norm_q(q)
        if attn.norm_k is not None:
            k = attn.norm_k(k)
        o = mhla_attention(q, k, v, self.mixing(self.layout.num_blocks), self.layout, feature_map=self.feature_map)
        o = attn.to_out[1](attn.to_out[0](o.reshape(batch, tokens, -1)))
        if attn.residual_connection:
            o = o + residual
        return o / attn.rescale_output_factor


def swap_attention(transformer, *, tile, layers=None, **options):
    """Gives the self-attention (``attn1``) of the transformer's blocks an ``MHLAAttnProcessor`` over its
    patch grid (``sample_size / patch_size`` per side) in ``tile = (th, tw)`` tiles, in place; returns the
    transformer. ``layers`` lists the block indices to swap (all by default; a hybrid keeps the others
    softmax). ``options`` go to ``MHLAAttnProcessor`` (``feature_map``, ``per_head_mixing``, ``mixing_init``).
    """
    config = getattr(transformer, "config", None)
    patch = getattr(config, "patch_size", None)
    size = getattr(config, "sample_size", None)
    blocks = getattr(transformer, "transformer_blocks", None)
    if patch is None or size is None or blocks is None:
        raise ValueError(f"{type(transformer).__name__} has no patch_size, sample_size and transformer_blocks: "
                         "swap_attention takes DiT-style 2D transformers")
    side = (size, size) if isinstance(size, int) else tuple(size)
    grid = (side[0] // patch, side[1] // patch)
    chosen = range(len(blocks)) if layers is None else list(layers)
    current = _Grid(patch)
    for i in chosen:
        if not 0 <= i < len(blocks):
            raise ValueError(f"block index {i} is out of range for {len(blocks)} blocks")
        attention = blocks[i].attn1
        processor = MHLAAttnProcessor(attention.heads, grid, tile, current_grid=current, **options)
        weight = attention.to_q.weight
        attention.set_processor(processor.to(device=weight.device, dtype=weight.dtype))
    transformer.register_forward_pre_hook(current.hook, with_kwargs=True)
    return transformer
