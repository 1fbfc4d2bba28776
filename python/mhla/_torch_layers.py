"""``mhla.torch``'s layers: ``MHLA1d`` (with its decoding cache), ``MHLA2d`` and ``MHLA3d``."""
import torch
import torch.nn.functional as F
from torch import nn

from . import _core, _plan, _wan_rotary
from ._torch_forms import chunk, lean
from ._authors import authors_video_attention, authors_vision_attention
from ._torch_functions import mhla_attention
from ._torch_mixing import FreeMixingMatrix, MixingMatrix, RMSNorm
from .streaming import Decoder


# The layers' semantics: the paper's (default), or the authors' public code's, for porting
# their checkpoints (docs/authors-compat.md).
VARIANTS = ("paper", "authors_vision", "authors_video", "authors_lm")


class _MHLALayer(nn.Module):
    """What the 1D, 2D and 3D layers share; subclasses give the layout and the positional conv."""

    def __init__(self, dim, heads, *, layout, causal, head_dim=None, qk_norm=False, gate=False, pos_conv=None,
                 per_head_mixing=False, mixing_init="linear", feature_map="elu1", bias=True, variant="paper",
                 backend=None):
        super().__init__()
        _plan.check_backend(backend)  # names an unknown backend now, not at the first forward
        if variant not in VARIANTS:
            raise ValueError(f"unknown variant {variant!r}; expected one of {', '.join(VARIANTS)}")
        if variant == "authors_vision" and causal:
            raise ValueError("variant='authors_vision' is the authors' non-causal vision layer; use 'authors_lm' "
                             "for their causal language-model layer")
        if variant == "authors_lm" and not causal:
            raise ValueError("variant='authors_lm' is the authors' causal language-model layer; pass causal=True")
        if variant == "authors_video" and len(getattr(self, "grid", ())) != 3:
            raise ValueError("variant='authors_video' is the authors' Wan2.1 video layer: build it as MHLA3d")
        if variant == "authors_video" and (qk_norm or gate or pos_conv):
            raise ValueError("variant='authors_video' has its own q/k RMSNorm and SiLU gate and no positional "
                             "conv; drop qk_norm, gate and pos_conv")
        if dim <= 0 or heads <= 0:
            raise ValueError(f"dim and heads must be positive, got dim={dim}, heads={heads}")
        if head_dim is None:
            if dim % heads != 0:
                raise ValueError(f"dim={dim} is not divisible by heads={heads}; pass head_dim")
            head_dim = dim // heads
        if pos_conv is not None and (not isinstance(pos_conv, int) or pos_conv <= 0 or pos_conv % 2 == 0):
            raise ValueError(f"pos_conv is the kernel size of the positional conv: a positive odd int, got {pos_conv!r}")
        inner = heads * head_dim
        self.dim, self.heads, self.head_dim = dim, heads, head_dim
        self.feature_map = feature_map
        self.masking = "causal" if causal else "none"
        self.q_proj = nn.Linear(dim, inner, bias=bias)
        self.k_proj = nn.Linear(dim, inner, bias=bias)
        self.v_proj = nn.Linear(dim, inner, bias=bias)
        self.out_proj = nn.Linear(inner, dim, bias=bias)
        self.q_norm = RMSNorm(head_dim) if qk_norm else None
        self.k_norm = RMSNorm(head_dim) if qk_norm else None
        self.gate_proj = nn.Linear(dim, inner, bias=bias) if gate else None
        self.pos_conv = self._make_pos_conv(inner, pos_conv) if pos_conv else None
        self.variant = variant
        self.backend = backend
        self.normalize = variant not in ("authors_lm", "authors_video")
        mixing_heads = heads if per_head_mixing else None
        if variant == "paper":
            self.mixing = MixingMatrix(layout, heads=mixing_heads, causal=causal, init=mixing_init)
        elif variant in ("authors_vision", "authors_video"):
            self.feature_map = "relu+eps"
            self.mixing = FreeMixingMatrix(layout, heads=mixing_heads, init=mixing_init, transpose_init=True)
            if variant == "authors_video":
                self._build_authors_video(dim, inner, bias)
        else:
            self.mixing = FreeMixingMatrix(layout, heads=mixing_heads, causal=True, init=mixing_init,
                                           clamp=(1e-5, 1.0))

    def _build_authors_video(self, dim, inner, bias):
        # Their q/k RMSNorm spans the whole width; the output is RMS-normalised per head, then
        # SiLU-gated. The rotary tables are Wan's for the layer's grid (float64; cast where used).
        self.q_norm, self.k_norm = RMSNorm(inner), RMSNorm(inner)
        self.gate_proj = nn.Linear(dim, inner, bias=bias)
        self.out_norm = RMSNorm(self.head_dim)
        cos, sin = _wan_rotary.tables(self.grid, self.head_dim)
        self.register_buffer("rotary_cos", cos.unsqueeze(1), persistent=False)
        self.register_buffer("rotary_sin", sin.unsqueeze(1), persistent=False)

    def forward(self, x):
        self._check_input(x)
        batch, tokens, _ = x.shape
        q, k, v = self._project(x)
        if self.variant in ("paper", "authors_lm") and _plan.plan(
                "mhla", (q,), backend=self.backend, needs_grad=torch.is_grad_enabled(),
                masking=self.masking).path == "torch":
            # In torch ops on plain Python values, so torch.compile traces the whole layer. The
            # operator's checks are not needed: the layer makes q, k, v and w consistent itself.
            geometry = self._geometry(tokens)
            o = lean.mhla_attention(q, k, v, self.mixing(geometry.num_blocks), geometry,
                                           masking=self.masking, feature_map=self.feature_map,
                                           normalize=self.normalize)
        else:
            # Compiled, the operator takes the layout as plain values.
            layout = self._geometry(tokens) if chunk.compiling() else self._layout(tokens)
            o = self.attend(q, k, v, self.mixing(layout.num_blocks), layout)
        o = o.reshape(batch, tokens, -1)
        if self.pos_conv is not None:
            o = o + self._positional(v.reshape(batch, tokens, -1))
        return self._output(x, o)

    def _check_input(self, x):
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.dim:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"{type(self).__name__} expects x of shape [B, N, {self.dim}], got {shape}")
        if not x.dtype.is_floating_point:
            raise TypeError(f"{type(self).__name__} expects a floating-point x, got {str(x.dtype).replace('torch.', '')}")

    def _project(self, x):
        """q, k, v ``[B, N, H, D]`` of ``x [B, N, dim]`` (with the q/k norms)."""
        split = (*x.shape[:2], self.heads, self.head_dim)
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.variant == "authors_video":
            return self.q_norm(q).view(split), self.k_norm(k).view(split), v.view(split)
        q, k, v = q.view(split), k.view(split), v.view(split)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v

    def _output(self, x, o):
        """The gate and the output projection of the attention result ``o [B, N, H * D]``."""
        if self.variant == "authors_video":
            o = self.out_norm(o.unflatten(-1, (self.heads, self.head_dim))).flatten(2) * F.silu(self.gate_proj(x))
        elif self.gate_proj is not None:
            o = o * torch.sigmoid(self.gate_proj(x))
        return self.out_proj(o)

    def attend(self, q, k, v, w, layout):
        """The attention step: ``[B, N, H, D]`` in and out. The operator's, here."""
        if self.variant == "authors_vision":
            return authors_vision_attention(q, k, v, w, layout, backend=self.backend)
        if self.variant == "authors_video":
            return authors_video_attention(q, k, v, w, layout, self.rotary_cos, self.rotary_sin, backend=self.backend)
        return mhla_attention(q, k, v, w, layout, masking=self.masking, feature_map=self.feature_map,
                              normalize=self.normalize, backend=self.backend)

    def _positional(self, v):
        # Depthwise conv over the token grid, channels first: [B, N, C] -> [B, C, *grid] and back.
        grid = self._grid(v.shape[1])
        out = self.pos_conv(v.transpose(1, 2).reshape(v.shape[0], v.shape[2], *grid))
        return out.flatten(2).transpose(1, 2)


class MHLA1d(_MHLALayer):
    """MHLA over sequences of up to ``max_tokens`` tokens in blocks of ``block_size``.

    ``causal=True`` makes token t read only tokens s <= t (language models); the
    positional conv then looks only backwards. Shorter sequences use the top-left
    corner of the mixing matrix, which for a causal layer is exactly the prefix.
    """

    def __init__(self, dim, heads, *, block_size, max_tokens, causal=False, **options):
        if block_size <= 0 or max_tokens <= 0:
            raise ValueError(f"block_size and max_tokens must be positive, got {block_size} and {max_tokens}")
        self.block_size, self.max_tokens = block_size, max_tokens
        super().__init__(dim, heads, layout=_core.Layout.sequence(max_tokens, block_size), causal=causal,
                         **options)

    def _geometry(self, tokens):
        if not 1 <= tokens <= self.max_tokens:
            raise ValueError(f"MHLA1d was built for 1..{self.max_tokens} tokens, got {tokens}")
        return chunk.Geometry.sequence(tokens, self.block_size)

    def _layout(self, tokens):
        self._geometry(tokens)
        return _core.Layout.sequence(tokens, self.block_size)

    def new_cache(self, batch=1):
        """A cache for generating ``batch`` sequences token by token with ``decode``.

        It holds a float32 copy of the current mixing matrix: make a new cache after the weights change.
        """
        if self.masking != "causal":
            raise ValueError("MHLA1d.new_cache needs a causal layer (causal=True): decoding reads no later tokens")
        with torch.no_grad():
            w = self.mixing().to(torch.float32).contiguous()
        # The state lives where the layer's weights are (the C++ decoder's for CPU weights).
        decoder = Decoder(w, heads=self.heads, dk=self.head_dim, dv=self.head_dim, block=self.block_size,
                          batch=batch, feature_map=self.feature_map, normalize=self.normalize, backend=self.backend)
        return MHLA1dCache(decoder)

    @torch.no_grad()
    def decode(self, x, cache):
        """The next tokens ``x [B, T, dim]`` of every sequence in ``cache``; returns ``[B, T, dim]``.

        The result equals ``forward`` on each whole sequence so far, at the new positions, at
        O(1) cost per token (a prompt on empty sequences is prefilled in blocks). The attention
        runs in float32, as the decoder does.
        """
        self._check_input(x)
        if not isinstance(cache, MHLA1dCache):
            raise TypeError(f"cache must come from new_cache(), not {type(cache).__name__}")
        batch, tokens, _ = x.shape
        if batch != cache.batch:
            raise ValueError(f"the cache holds {cache.batch} sequences, x has {batch}")
        if tokens == 0:
            raise ValueError(f"MHLA1d.decode needs at least one new token per sequence; x has shape {tuple(x.shape)}")
        q, k, v = self._project(x)
        q32, k32, v32 = (t.to(torch.float32).contiguous() for t in (q, k, v))
        decoder = cache.decoder
        if tokens > 1 and all(decoder.position(s) == 0 for s in range(batch)):
            parts = [decoder.prefill(s, q32[s:s + 1], k32[s:s + 1], v32[s:s + 1]) for s in range(batch)]
            o = torch.cat(parts, dim=0)
        else:
            token = [[t[:, i:i + 1].contiguous() for t in (q32, k32, v32)] for i in range(tokens)]
            parts = [decoder.step(*qkv) for qkv in token]
            o = torch.cat(parts, dim=1)
        o = o.to(x.dtype).reshape(batch, tokens, -1)
        if self.pos_conv is not None:
            o = o + cache.positional(self.pos_conv, v.reshape(batch, tokens, -1))
        return self._output(x, o)

    def _grid(self, tokens):
        return (tokens,)

    def _make_pos_conv(self, channels, kernel):
        # Causal: pad on the left only, so position t sees t-kernel+1 .. t.
        return _CausalConv1d(channels, kernel) if self.masking == "causal" else \
            nn.Conv1d(channels, channels, kernel, padding=kernel // 2, groups=channels)


class MHLA1dCache:
    """What a causal ``MHLA1d`` keeps between ``decode`` calls: the attention's streaming decoder
    (``mhla.Decoder``) and the last inputs of the causal positional conv, per sequence."""

    def __init__(self, decoder):
        self.decoder = decoder
        self._history = None  # [B, channels, kernel - 1], zeros before the first token (the conv's padding)

    @property
    def batch(self):
        return self.decoder.options.batch

    def position(self, seq=0):
        """Tokens seen by sequence ``seq``."""
        return self.decoder.position(seq)

    def reset(self, seq):
        """Empties sequence ``seq``; the others keep their state."""
        self.decoder.reset(seq)
        if self._history is not None:
            self._history[seq].zero_()

    def positional(self, conv, v):
        """The causal depthwise conv of ``v [B, T, channels]`` continuing the history; ``[B, T, channels]``."""
        v = v.transpose(1, 2)
        if self._history is None:
            self._history = v.new_zeros(v.shape[0], v.shape[1], conv.kernel_size[0] - 1)
        window = torch.cat([self._history.to(v.dtype), v], dim=2)
        out = F.conv1d(window, conv.weight, conv.bias, groups=conv.groups)
        self._history = window[:, :, window.shape[2] - self._history.shape[2]:]
        return out.transpose(1, 2)


class _CausalConv1d(nn.Conv1d):
    def __init__(self, channels, kernel):
        super().__init__(channels, channels, kernel, groups=channels)

    def forward(self, x):
        return super().forward(F.pad(x, (self.kernel_size[0] - 1, 0)))


class _GridLayer(_MHLALayer):
    """A layer over a fixed token grid; subclasses name the axes, the Layout factory and the conv."""

    def __init__(self, dim, heads, *, grid, tile, **options):
        self.grid = tuple(grid)
        rank = len(self._axes)
        if len(self.grid) != rank or len(tuple(tile)) != rank:
            axes = ", ".join(self._axes)
            tiles = ", ".join("t" + a.lower() for a in self._axes)
            raise ValueError(f"{type(self).__name__} needs grid=({axes}) and tile=({tiles}), got {grid} and {tile}")
        self.layout = type(self)._make_layout(*self.grid, *tile)
        self.geometry = chunk.Geometry.of(self.layout)
        super().__init__(dim, heads, layout=self.layout, causal=False, **options)

    def _geometry(self, tokens):
        if tokens != self.geometry.num_tokens:
            raise ValueError(f"{type(self).__name__} was built for a {'x'.join(map(str, self.grid))} grid "
                             f"({self.geometry.num_tokens} tokens), got {tokens} tokens")
        return self.geometry

    def _layout(self, tokens):
        self._geometry(tokens)
        return self.layout

    def _grid(self, tokens):
        return self.grid

    def _make_pos_conv(self, channels, kernel):
        return self._conv(channels, channels, kernel, padding=kernel // 2, groups=channels)


class MHLA2d(_GridLayer):
    """MHLA over a ``grid = (H, W)`` of image tokens (row-major) in tiles ``tile = (th, tw)``.

    Any grid works, square or not, divisible by the tile or not (edge tiles are
    smaller). ``pos_conv=k`` adds a depthwise ``k x k`` conv of v (LePE-style).
    """

    _axes = ("H", "W")
    _make_layout = _core.Layout.grid2d
    _conv = nn.Conv2d


class MHLA3d(_GridLayer):
    """MHLA over video tokens on a ``grid = (T, H, W)`` in tiles ``tile = (tt, th, tw)``."""

    _axes = ("T", "H", "W")
    _make_layout = _core.Layout.grid3d
    _conv = nn.Conv3d
