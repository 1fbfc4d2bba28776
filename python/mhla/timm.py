"""MHLA in timm's Vision Transformers (ViT, DeiT): a drop-in attention module and a one-call swap.

``swap_attention(model, tile=(4, 4))`` replaces every ``timm.layers.Attention`` of a model built by
``timm.create_model(...)`` (or ``VisionTransformer(...)``) with ``MHLAAttention`` over the model's
patch grid, starting from the softmax attention's q/k/v/output weights: a trained softmax model
converts and fine-tunes, as the paper does for Wan2.1. ``kind="linear"`` swaps in linear attention
(one block) instead, for comparison. Needs ``timm``.
"""
import torch
from torch import nn

from . import torch as mt

try:
    from timm.layers import Attention as TimmAttention
except ImportError as error:  # pragma: no cover - the message is the point
    raise ImportError("mhla.timm needs timm (python3 -m pip install timm)") from error

__all__ = ["MHLAAttention", "swap_attention"]

KINDS = ("mhla", "linear")


class MHLAAttention(nn.Module):
    """``timm.layers.Attention``'s interface (``x [B, N, dim]`` in and out, ``proj``, ``proj_drop``)
    on an ``mhla.torch.MHLA2d`` over a ``grid = (H, W)`` of patch tokens in ``tile`` tiles.

    ``layer`` is the MHLA2d (its q/k/v projections, mixing matrix, and ``out_proj``, which is this
    module's ``proj``). Options are MHLA2d's (``pos_conv``, ``per_head_mixing``, ``feature_map``, ...).
    """

    def __init__(self, dim, num_heads, *, grid, tile, head_dim=None, dim_out=None, qkv_bias=False,
                 proj_bias=True, proj_drop=0.0, gated=False, **options):
        super().__init__()
        self.layer = mt.MHLA2d(dim, num_heads, grid=grid, tile=tile, head_dim=head_dim, bias=qkv_bias, gate=gated,
                               **options)
        # The output projection has its own bias setting in timm.
        self.layer.out_proj = nn.Linear(self.layer.heads * self.layer.head_dim, dim_out or dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_drop)

    @property
    def proj(self):
        return self.layer.out_proj

    @classmethod
    def from_attention(cls, attention, *, grid, tile, **options):
        """The MHLA counterpart of a ``timm.layers.Attention`` with its weights: q, k, v from its
        fused ``qkv``, its ``proj``, its q/k norms and gate. The attention itself (softmax scores,
        ``attn_drop``) is what changes."""
        if not isinstance(attention.norm, nn.Identity):
            raise ValueError("this timm Attention normalises its output before the projection (scale_norm=True); "
                             "MHLAAttention has no such norm")
        qkv, proj = attention.qkv, attention.proj
        module = cls(qkv.in_features, attention.num_heads, grid=grid, tile=tile, head_dim=attention.head_dim,
                     dim_out=proj.out_features, qkv_bias=qkv.bias is not None, proj_bias=proj.bias is not None,
                     proj_drop=attention.proj_drop.p, gated=attention.gate is not None, **options)
        layer = module.layer
        with torch.no_grad():
            for part, target in enumerate((layer.q_proj, layer.k_proj, layer.v_proj)):
                rows = slice(part * attention.attn_dim, (part + 1) * attention.attn_dim)
                target.weight.copy_(qkv.weight[rows])
                if qkv.bias is not None:
                    target.bias.copy_(qkv.bias[rows])
        layer.out_proj = proj
        if attention.gate is not None:
            layer.gate_proj = attention.gate
        if not isinstance(attention.q_norm, nn.Identity):
            # timm normalises q and k per head over head_dim, as MHLA2d does.
            layer.q_norm, layer.k_norm = attention.q_norm, attention.k_norm
        return module.to(device=qkv.weight.device, dtype=qkv.weight.dtype)

    def forward(self, x, attn_mask=None, is_causal=False):
        if attn_mask is not None or is_causal:
            raise ValueError("MHLAAttention attends over the whole patch grid; it takes no attn_mask or is_causal")
        return self.proj_drop(self.layer(x))


def swap_attention(model, *, tile, kind="mhla", **options):
    """Replaces every ``timm.layers.Attention`` in ``model`` with an ``MHLAAttention`` started from its
    weights, in place; returns the model. The block layout is the model's patch grid
    (``model.patch_embed.grid_size``) in ``tile = (th, tw)`` tiles; ``kind="linear"`` makes one block
    of the whole grid (linear attention) and ignores ``tile``. ``options`` go to ``MHLA2d``.

    The model's tokens must be its patches only: a class or register token has no place in the
    patch grid, so such models are refused (build them with ``class_token=False,
    global_pool="avg"``), as are models whose grid changes with the image (``dynamic_img_size``).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
    patch_embed = getattr(model, "patch_embed", None)
    if patch_embed is None or not hasattr(patch_embed, "grid_size"):
        raise ValueError(f"{type(model).__name__} has no patch_embed.grid_size: swap_attention takes timm Vision "
                         "Transformers (VisionTransformer and the models built on it)")
    prefix = getattr(model, "num_prefix_tokens", 0)
    if prefix:
        raise ValueError(f"{type(model).__name__} has {prefix} prefix token(s) (class or register tokens) besides "
                         "its patches; MHLA's blocks tile the patch grid only: build the model with "
                         "class_token=False, global_pool='avg' (and no reg_tokens)")
    if getattr(patch_embed, "dynamic_img_size", False):
        raise ValueError("the model's patch grid changes with the image (dynamic_img_size=True); MHLA's layout is "
                         "fixed when the attention is built")
    grid = tuple(patch_embed.grid_size)
    tile = grid if kind == "linear" else tuple(tile)
    targets = [(name, module) for name, module in model.named_modules() if isinstance(module, TimmAttention)]
    if not targets:
        raise ValueError(f"{type(model).__name__} has no timm.layers.Attention to swap")
    for name, attention in targets:
        parent_name, _, attribute = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attribute, MHLAAttention.from_attention(attention, grid=grid, tile=tile, **options))
    return model
