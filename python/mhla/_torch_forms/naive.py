"""MHLA and its baselines written from the operator's definition (docs/operator.md) in plain torch.

The dense form: A[t, s] = W[blk(t), blk(s)] * phi(q_t) . phi(k_s), masked, then
o_t = sum_s A[t, s] v_s / (sum_s A[t, s] + eps) (normalized) or
o_t = scale * sum_s A[t, s] v_s. N x N memory: small shapes only. It shares no
code with the operator; torch's autograd differentiates it.
"""
import torch

from .. import _core


def phi(x, feature_map):
    if feature_map == "identity":
        return x
    if feature_map == "relu":
        return torch.relu(x)
    if feature_map == "elu1":
        # elu(x) + 1 written as exp(x) for x <= 0: F.elu(x) + 1 cancels there
        # (1 - 0.99999999999869 at x = -27) and loses a dozen digits.
        return torch.where(x > 0, x + 1, torch.exp(torch.clamp(x, max=0)))
    raise ValueError(feature_map)


def block_of_tokens(layout):
    return torch.tensor([layout.block_of(t) for t in range(layout.num_tokens)])


def dense_mixing(w, mixing, blocks):
    """[M, M] or [H, M, M] from a dense or Toeplitz w."""
    if mixing == "dense":
        return w
    i = torch.arange(blocks)
    distance = i[:, None] - i[None, :]
    length = w.shape[-1] - 1
    expanded = w[..., distance.clamp(0, length)]
    return expanded * (distance >= 0)


def mhla_attention(q, k, v, w, layout, masking="none", feature_map="elu1", normalize=True, eps=1e-6, scale=None,
         mixing="dense"):
    blk = block_of_tokens(layout)
    W = dense_mixing(w, mixing, layout.num_blocks)
    token_w = W[..., blk[:, None], blk[None, :]]  # [N, N] or [H, N, N]
    mask = torch.ones(len(blk), len(blk), dtype=torch.bool)
    if masking == "causal":
        mask = torch.ones_like(mask).tril()
    elif masking == "block_causal":
        mask = blk[None, :] <= blk[:, None]
    scores = torch.einsum("bthd,bshd->bhts", phi(q, feature_map), phi(k, feature_map))
    a = scores * token_w * mask
    numerator = torch.einsum("bhts,bshd->bthd", a, v)
    if normalize:
        return numerator / (a.sum(-1).transpose(1, 2)[..., None] + eps)
    return numerator * (q.shape[-1] ** -0.5 if scale is None else scale)


def linear_attention(q, k, v, masking="none", feature_map="elu1", normalize=True, eps=1e-6, scale=None):
    n = q.shape[1]
    one_block = _core.Layout.sequence(n, max(n, 1))
    return mhla_attention(q, k, v, torch.ones(1, 1, dtype=q.dtype), one_block, masking, feature_map, normalize, eps, scale)


def softmax_attention(q, k, v, causal=False, scale=None):
    logits = torch.einsum("bthd,bshd->bhts", q, k) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if causal:
        n = q.shape[1]
        logits = logits.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    return torch.einsum("bhts,bshd->bthd", torch.softmax(logits, -1), v)
