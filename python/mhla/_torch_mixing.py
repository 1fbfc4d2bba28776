"""The layers' mixing matrices (``MixingMatrix``: the paper's, always valid; ``FreeMixingMatrix``:
the authors' own parameter) and the per-head ``RMSNorm``."""
import torch
from torch import nn
from torch.utils.dlpack import from_dlpack

from . import _core


def _initial_mixing(layout, *, causal, init, sigma, threshold):
    """The locality-biased ``[M, M]`` matrix of ``mhla.init_mixing``, as a torch tensor of the default
    dtype, as ``nn.Linear`` makes its weights (a model built in float64, as ``from_pretrained(...,
    dtype=torch.float64)`` builds it, keeps its mixing parameters in float64)."""
    w0 = from_dlpack(_core.init_mixing(layout, transform=init, sigma=sigma, threshold=threshold, causal=causal))
    return w0.to(torch.get_default_dtype())


def _per_head(matrix, heads):
    """A contiguous copy of ``matrix`` to own as a parameter; ``[heads, M, M]`` copies when ``heads`` is given."""
    if heads is None:
        return matrix.clone(memory_format=torch.contiguous_format)
    return matrix.expand(heads, *matrix.shape).clone(memory_format=torch.contiguous_format)


def _corner_size(covered, blocks):
    """The side of the top-left corner a mixing module returns: all ``covered`` blocks, or ``blocks``."""
    m = covered if blocks is None else blocks
    if not 1 <= m <= covered:
        raise ValueError(f"the mixing matrix covers {covered} blocks; {m} were asked for")
    return m


class MixingMatrix(nn.Module):
    """A learnable ``[M, M]`` (or per-head ``[H, M, M]``) mixing matrix that is always valid.

    ``W = softmax(logits)`` along each row (over ``b <= i`` only when causal), so every
    entry is non-negative and every row sums to 1 whatever the optimiser does. The
    logits start at ``log(W0)`` of the locality-biased ``mhla.init_mixing``, with entries
    below ``floor`` raised to it (a zero would be ``-inf`` and could never learn), so the
    initial W is W0 up to that floor. Calling the module with ``blocks=m`` returns the
    top-left ``m x m`` corner, renormalised (shorter sequences in ``MHLA1d``).
    """

    def __init__(self, layout, *, heads=None, causal=False, init="linear", sigma=1.0, threshold=1.5,
                 floor=1e-4):
        super().__init__()
        w0 = _initial_mixing(layout, causal=causal, init=init, sigma=sigma, threshold=threshold)
        self.logits = nn.Parameter(_per_head(torch.log(w0.clamp_min(floor)), heads))
        self.causal = causal
        self.blocks = w0.shape[0]

    def forward(self, blocks=None):
        m = _corner_size(self.blocks, blocks)
        logits = self.logits[..., :m, :m]
        if self.causal:
            above = torch.ones(m, m, dtype=torch.bool, device=logits.device).triu(1)
            logits = logits.masked_fill(above, float("-inf"))
        return torch.softmax(logits, dim=-1)

    def extra_repr(self):
        return f"blocks={self.blocks}, shape={tuple(self.logits.shape)}, causal={self.causal}"


class RMSNorm(nn.Module):
    """``x / rms(x) * weight`` over the last dimension (here: each head's features)."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class FreeMixingMatrix(nn.Module):
    """A mixing matrix that is its own parameter, as in the authors' code (``variant="authors_*"``).

    Unconstrained (``clamp=None``: the vision layers; the operator then runs unnormalised, where any
    sign is allowed), or clamped into ``[low, high]`` whenever it is read (the language-model layer:
    ``(1e-5, 1)``; entries outside get no gradient, as with ``torch.clamp``). It starts at the
    locality-biased ``mhla.init_mixing`` matrix, transposed when ``transpose_init`` (the authors'
    vision init normalises columns where ``init_mixing`` normalises rows).
    """

    def __init__(self, layout, *, heads=None, causal=False, init="linear", sigma=1.0, threshold=1.5,
                 transpose_init=False, clamp=None):
        super().__init__()
        w0 = _initial_mixing(layout, causal=causal, init=init, sigma=sigma, threshold=threshold)
        self.weight = nn.Parameter(_per_head(w0.t() if transpose_init else w0, heads))
        self.clamp = clamp
        self.blocks = w0.shape[0]

    def forward(self, blocks=None):
        m = _corner_size(self.blocks, blocks)
        w = self.weight[..., :m, :m]
        return w if self.clamp is None else w.clamp(*self.clamp)

    def extra_repr(self):
        return f"blocks={self.blocks}, shape={tuple(self.weight.shape)}, clamp={self.clamp}"
