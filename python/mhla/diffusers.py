"""MHLA in diffusers' image and video transformers (tested with diffusers 0.42.1).

``swap_attention(transformer, tile=...)`` replaces the self-attention (``attn1``) of

- a DiT-style image transformer (``DiTTransformer2DModel``, ``PixArtTransformer2DModel`` and the
  models whose ``transformer_blocks`` hold diffusers' ``Attention`` over patch tokens) with an
  ``MHLAAttnProcessor``: the paper's MHLA over the patch grid in tiles;
- a ``WanTransformer3DModel`` (Wan2.1 video) with an ``MHLAWanAttnProcessor``: the authors' Wan
  layer (``variant="authors_video"``, docs/authors-compat.md) over the frames x rows x columns grid,
  with the model's own rotary embedding; ``load_authors_wan_checkpoint`` loads a state dict laid out
  as their released Wan-MHLA checkpoint into the swapped model.

Each processor works through the attention's own (pretrained) ``to_q``, ``to_k``, ``to_v`` and
``to_out``, and is an ``nn.Module`` whose mixing matrix (and, for Wan, output gate and norm) are
ordinary parameters of the model (optimisers, ``state_dict``, FSDP and ``save_pretrained`` see
them), initialised from the locality prior. Cross-attention (``attn2``) stays softmax.

diffusers' processors are not given the token grid, so the swap installs a forward pre-hook on the
transformer that reads it from the latent's shape (its sizes over ``patch_size``) on every call and
refuses by name a latent of another grid than the one the mixing matrix was built for.
"""
import torch
import torch.nn.functional as F
from torch import nn

from . import _core
from .torch import FreeMixingMatrix, MixingMatrix, RMSNorm, authors_video_attention, mhla_attention

__all__ = ["MHLAAttnProcessor", "MHLAWanAttnProcessor", "swap_attention", "authors_wan_layers",
           "load_authors_wan_checkpoint"]


class _GridCheck:
    """The transformer's forward pre-hook: the latent's patch grid must be the one MHLA was built for."""

    def __init__(self, patch, axes, built_for):
        self.patch, self.axes, self.built_for = tuple(patch), axes, tuple(built_for)

    def hook(self, module, args, kwargs):
        latent = kwargs.get("hidden_states", args[0] if args else None)
        if not isinstance(latent, torch.Tensor) or latent.dim() != 2 + len(self.patch):
            got = tuple(latent.shape) if isinstance(latent, torch.Tensor) else type(latent).__name__
            raise ValueError(f"MHLA's processors read the patch grid from a latent [B, C, {', '.join(self.axes)}]; "
                             f"the transformer got {got}")
        sizes = tuple(latent.shape[2:])
        if any(size % patch for size, patch in zip(sizes, self.patch)):
            raise ValueError(f"the latent's {_x(sizes)} does not split into patches of {_x(self.patch)}")
        shape = tuple(size // patch for size, patch in zip(sizes, self.patch))
        if shape != self.built_for:
            raise ValueError(f"the latent's patch grid is {_x(shape)}, but MHLA's mixing matrix was built "
                             f"for {_x(self.built_for)}")


def _x(sizes):
    return " x ".join(map(str, sizes))


def _check_tile(grid, tile):
    """A tile spans at most the grid along each axis: a larger one would silently shrink to the grid
    (a tile as large as the grid is one block, M = 1: plain linear attention)."""
    if any(t < 1 for t in tile) or any(t > g for t, g in zip(tile, grid)):
        raise ValueError(f"tile {_x(tile)} does not fit the patch grid {_x(grid)}: each side of a tile is "
                         "between 1 and the grid's")


def _refuse_unsupported(name, encoder_hidden_states, attention_mask, kwargs):
    if encoder_hidden_states is not None:
        raise ValueError(f"{name} replaces self-attention only; cross-attention stays softmax")
    if attention_mask is not None:
        raise ValueError(f"{name} takes no attention_mask: MHLA's blocks are the patch grid")
    if kwargs:
        raise ValueError(f"{name} cannot honour attention kwargs: {', '.join(sorted(kwargs))}")


class MHLAAttnProcessor(nn.Module):
    """A diffusers attention processor computing MHLA (normalized, ``feature_map`` features) over a
    ``grid`` of patch tokens in ``tile`` tiles, with the attention's own projections."""

    def __init__(self, heads, grid, tile, *, feature_map="elu1", mixing_init="linear", per_head_mixing=False):
        super().__init__()
        grid, tile = tuple(grid), tuple(tile)
        if len(grid) != 2 or len(tile) != 2:
            raise ValueError(f"grid and tile are (rows, columns), got {grid} and {tile}")
        _check_tile(grid, tile)
        # Tiles that do not divide the grid leave ragged edge blocks, as in MHLA2d.
        self.grid, self.tile, self.feature_map = grid, tile, feature_map
        self.layout = _core.Layout.grid2d(*grid, *tile)
        _core.Options(self.layout, feature_map=feature_map)  # an unknown feature map is named here, not at the first call
        self.mixing = MixingMatrix(self.layout, heads=heads if per_head_mixing else None, init=mixing_init)

    def forward(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None, **kwargs):
        _refuse_unsupported("MHLAAttnProcessor", encoder_hidden_states, attention_mask, kwargs)
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


class MHLAWanAttnProcessor(nn.Module):
    """A processor for the self-attention of diffusers' ``WanAttention``: the authors' Wan2.1 MHLA layer
    (``variant="authors_video"``) over a ``grid = (T, H, W)`` of patch tokens in ``tile`` tiles.

    q and k go through the attention's ``to_q``/``to_k`` and its width-spanning ``norm_q``/``norm_k``;
    their features ``relu + 1e-6`` are turned by the model's rotary embedding (the ``rotary_emb`` the
    transformer hands every self-attention); each query block reads ``sum_b W[i, b] S_b`` with no
    normaliser; each head's output is RMS-normalised (``out_norm``), multiplied by
    ``silu(gate(hidden_states))`` and goes through ``to_out``. ``gate``, ``out_norm`` and ``mixing`` (a
    ``FreeMixingMatrix`` at the column-normalised locality prior) are the processor's parameters.
    """

    def __init__(self, dim, heads, head_dim, grid, tile, *, mixing_init="linear", per_head_mixing=False):
        super().__init__()
        grid, tile = tuple(grid), tuple(tile)
        if len(grid) != 3 or len(tile) != 3:
            raise ValueError(f"grid and tile are (frames, rows, columns), got {grid} and {tile}")
        _check_tile(grid, tile)
        self.grid, self.tile = grid, tile
        self.layout = _core.Layout.grid3d(*grid, *tile)
        self.gate = nn.Linear(dim, heads * head_dim)
        self.out_norm = RMSNorm(head_dim)
        self.mixing = FreeMixingMatrix(self.layout, heads=heads if per_head_mixing else None, init=mixing_init,
                                       transpose_init=True)

    def forward(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None,
                **kwargs):
        _refuse_unsupported("MHLAWanAttnProcessor", encoder_hidden_states, attention_mask, kwargs)
        if rotary_emb is None:
            raise ValueError("MHLAWanAttnProcessor needs the transformer's rotary_emb (freqs_cos, freqs_sin)")
        if hidden_states.dim() != 3 or hidden_states.shape[1] != self.layout.num_tokens:
            raise ValueError(f"MHLAWanAttnProcessor expects [B, {self.layout.num_tokens}, C] for the "
                             f"{_x(self.grid)} patch grid, got {tuple(hidden_states.shape)}")
        if getattr(attn, "fused_projections", False):
            q, k, v = attn.to_qkv(hidden_states).chunk(3, dim=-1)
        else:
            q, k, v = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        q, k, v = (t.unflatten(2, (attn.heads, -1)) for t in (attn.norm_q(q), attn.norm_k(k), v))
        o = authors_video_attention(q, k, v, self.mixing(self.layout.num_blocks), self.layout, *rotary_emb)
        o = self.out_norm(o).flatten(2) * F.silu(self.gate(hidden_states))
        return attn.to_out[1](attn.to_out[0](o))


def swap_attention(transformer, *, tile, layers=None, grid=None, variant=None, **options):
    """Gives the self-attention (``attn1``) of the transformer's blocks an MHLA processor, in place, and
    returns the transformer. ``layers`` lists the block indices to swap (all by default; a hybrid keeps
    the others softmax, as the authors' Wan model keeps every third layer, ``[i for i in range(30) if i % 3]``).

    - DiT-style 2D models: ``variant="paper"`` (the default) over the patch grid (``sample_size /
      patch_size`` per side, or ``grid=(rows, columns)``) in ``tile = (th, tw)`` tiles; ``options`` go to
      ``MHLAAttnProcessor`` (``feature_map``, ``per_head_mixing``, ``mixing_init``).
    - ``WanTransformer3DModel``: ``variant="authors_video"`` (the default; the paper's normalised layer has
      no place for Wan's rotary embedding) over ``grid = (T, H, W)``, the latent's patch grid (Wan2.1 at
      480 x 800 and 81 frames: ``(21, 30, 50)``; the authors' blocks: ``tile=(7, 6, 5)``); ``options`` go
      to ``MHLAWanAttnProcessor`` (``per_head_mixing``, ``mixing_init``).
    """
    config = getattr(transformer, "config", None)
    patch = getattr(config, "patch_size", None)
    if isinstance(patch, (tuple, list)) and len(patch) == 3 and hasattr(transformer, "blocks"):
        return _swap_wan(transformer, tuple(patch), tile=tile, layers=layers, grid=grid,
                         variant=variant or "authors_video", **options)
    return _swap_dit(transformer, patch, tile=tile, layers=layers, grid=grid, variant=variant or "paper", **options)


def _swap_dit(transformer, patch, *, tile, layers, grid, variant, **options):
    size = getattr(getattr(transformer, "config", None), "sample_size", None)
    blocks = getattr(transformer, "transformer_blocks", None)
    if not isinstance(patch, int) or (size is None and grid is None) or blocks is None:
        raise ValueError(f"{type(transformer).__name__} has no patch_size, sample_size and transformer_blocks: "
                         "swap_attention takes DiT-style 2D transformers and WanTransformer3DModel")
    if variant != "paper":
        raise ValueError(f"swap_attention gives DiT-style transformers variant='paper', not {variant!r}")
    if grid is None:
        side = (size, size) if isinstance(size, int) else tuple(size)
        grid = (side[0] // patch, side[1] // patch)
    def processor(attention):
        return MHLAAttnProcessor(attention.heads, grid, tile, **options)
    return _install(transformer, blocks, layers, processor, _GridCheck((patch, patch), ("H", "W"), grid))


def _swap_wan(transformer, patch, *, tile, layers, grid, variant, **options):
    if variant != "authors_video":
        raise ValueError(f"swap_attention gives WanTransformer3DModel variant='authors_video' (the authors' Wan "
                         f"layer, which keeps Wan's rotary embedding), not {variant!r}")
    if grid is None:
        raise ValueError("a WanTransformer3DModel has no fixed token grid: pass grid=(T, H, W), the latent's "
                         "frames, rows and columns over patch_size (Wan2.1 at 480 x 800, 81 frames: (21, 30, 50))")
    def processor(attention):
        return MHLAWanAttnProcessor(attention.to_q.in_features, attention.heads, attention.inner_dim // attention.heads,
                                    grid, tile, **options)
    return _install(transformer, transformer.blocks, layers, processor, _GridCheck(patch, ("F", "H", "W"), grid))


def _install(transformer, blocks, layers, make_processor, grid_check):
    """Sets ``make_processor(attn1)`` on the chosen blocks (on their weights' device and dtype), then the
    pre-hook that checks the grid of each call."""
    chosen = range(len(blocks)) if layers is None else list(layers)
    for i in chosen:
        if not 0 <= i < len(blocks):
            raise ValueError(f"block index {i} is out of range for {len(blocks)} blocks")
        processor = getattr(blocks[i].attn1, "processor", None)
        if isinstance(processor, (MHLAAttnProcessor, MHLAWanAttnProcessor)):
            raise ValueError(f"block {i}'s self-attention is MHLA already ({type(processor).__name__}); swapping it "
                             "again would start its mixing matrix (and a Wan layer's gate and norm) afresh: swap "
                             "each block once (layers=[...] names the others)")
    previous = getattr(transformer, "_mhla_grid_check", None)
    if previous is not None and previous.built_for != grid_check.built_for:
        raise ValueError(f"the transformer's MHLA layers are built for the patch grid {_x(previous.built_for)}, "
                         f"not {_x(grid_check.built_for)}: one transformer takes one grid")
    created = []
    for i in chosen:
        attention = blocks[i].attn1
        weight = attention.to_q.weight
        created.append(make_processor(attention).to(device=weight.device, dtype=weight.dtype))
    for i, processor in zip(chosen, created):  # all made (and checked) before any is set
        blocks[i].attn1.set_processor(processor)
    if previous is None:
        transformer.register_forward_pre_hook(grid_check.hook, with_kwargs=True)
        transformer._mhla_grid_check = grid_check
    return transformer


def _authors_state(checkpoint):
    """The flat state dict of a checkpoint saved by the authors' trainer (``{"state_dict": ...}``) or bare."""
    state = checkpoint.get("state_dict", checkpoint) if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict) or not all(isinstance(key, str) for key in state):
        raise ValueError(f"expected the authors' Wan-MHLA state dict (or {{'state_dict': ...}}), got "
                         f"{type(checkpoint).__name__}")
    return {key.replace("model.diffusion_model.", "", 1): value for key, value in state.items()}


_AUTHORS_MIXING = ".self_attn.block_attn.conv.weight"


def authors_wan_layers(checkpoint):
    """The indices of the blocks whose self-attention is MHLA in the authors' Wan-MHLA state dict
    (the blocks that hold a block-mixing weight), for ``swap_attention(..., layers=...)``."""
    return sorted(int(key.split(".")[1]) for key in _authors_state(checkpoint)
                  if key.startswith("blocks.") and key.endswith(_AUTHORS_MIXING))


def load_authors_wan_checkpoint(transformer, checkpoint):
    """Loads a state dict laid out as the authors' released Wan-MHLA checkpoint (their ``WanModel``: Wan's
    original key names, plus ``self_attn.g`` (the gate), ``self_attn.g_norm`` (the per-head output norm)
    and ``self_attn.block_attn.conv.weight`` (W as an ``[M, M, 1, 1]`` 1x1 convolution) in the MHLA
    blocks) into a ``WanTransformer3DModel`` swapped with ``swap_attention(..., layers=authors_wan_layers(
    checkpoint))`` for their grid and tile. Wan's own keys go through diffusers'
    ``convert_wan_transformer_to_diffusers``; every key must land, or a ValueError names those that do
    not. Returns the transformer."""
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    state = _authors_state(checkpoint)
    theirs = authors_wan_layers(state)
    ours = [i for i, block in enumerate(getattr(transformer, "blocks", []))
            if isinstance(getattr(block.attn1, "processor", None), MHLAWanAttnProcessor)]
    if theirs != ours:
        raise ValueError(f"the checkpoint's MHLA self-attention is in blocks {theirs}, the transformer's in "
                         f"{ours}: swap_attention(transformer, ..., layers=authors_wan_layers(checkpoint)) first")
    renamed = {}
    for key, value in convert_wan_transformer_to_diffusers(dict(state)).items():
        key = key.replace(".attn1.g.", ".attn1.processor.gate.").replace(".attn1.g_norm.", ".attn1.processor.out_norm.")
        if key.endswith(".attn1.block_attn.conv.weight"):
            key = key.replace(".attn1.block_attn.conv.weight", ".attn1.processor.mixing.weight")
            mixing = transformer.get_parameter(key)
            if value.dim() != 4 or value.shape[2:] != (1, 1) or value.shape[:2] != mixing.shape:
                raise ValueError(f"{key}: the checkpoint's block mixing is {tuple(value.shape)}, the swapped layer's "
                                 f"W is {tuple(mixing.shape)}: swap for the checkpoint's grid and tile, with one W "
                                 "shared by the heads")
            value = value.reshape(mixing.shape)
        renamed[key] = value
    missing, unexpected = transformer.load_state_dict(renamed, strict=False)
    if missing or unexpected:
        raise ValueError(f"the checkpoint does not fit the transformer: missing {_listed(missing)}; "
                         f"unexpected {_listed(unexpected)}")
    return transformer


def _listed(keys, shown=5):
    keys = sorted(keys)
    return "none" if not keys else ", ".join(keys[:shown]) + (f" and {len(keys) - shown} more" if len(keys) > shown else "")
