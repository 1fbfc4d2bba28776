"""Non-causal MHLA with elu+1 as the plain einsum formulation (the paper authors' form), every op
in the dtype of its inputs, on tokens already in block order (consecutive runs of ``block``): the
yardstick of the torch path's bfloat16 error (test_reduced_precision.py) and of its speed on a
GPU (bench/gpu_check.py)."""
import torch


def einsum_mhla(q, k, v, w, block):
    batch, tokens, heads, dk = q.shape
    m = tokens // block
    fq = (torch.nn.functional.elu(q) + 1).reshape(batch, m, block, heads, dk)
    fk = (torch.nn.functional.elu(k) + 1).reshape(batch, m, block, heads, dk)
    vb = v.reshape(batch, m, block, heads, v.shape[-1])
    mixed = torch.einsum("ij,bjhde->bihde", w, torch.einsum("bmchd,bmche->bmhde", fk, vb))
    mixed_sums = torch.einsum("ij,bjhd->bihd", w, fk.sum(2))
    numerator = torch.einsum("bmchd,bmhde->bmche", fq, mixed)
    denominator = torch.einsum("bmchd,bmhd->bmch", fq, mixed_sums)
    return (numerator / (denominator[..., None] + 1e-6)).reshape(batch, tokens, heads, -1)
