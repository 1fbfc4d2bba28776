"""Hashes of o and the four gradients of mhla.torch.mhla_attention over a fixed catalogue of
modes, layouts and dtypes, on both paths (the C++ operator and the plain-torch path), so that a
change meant to keep every answer can show it did: run it before and after, compare the lines.

    PYTHONPATH=build/python python3 scripts/answer_hashes.py

One line per path and dtype (the hash of every call's results, bit for bit), then one for all.
"""
import hashlib
import itertools

import torch

import mhla
import mhla.torch as mt

LAYOUTS = {"1D ragged": lambda: mhla.Layout.sequence(45, 8), "2D ragged": lambda: mhla.Layout.grid2d(7, 9, 3, 4)}
DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def catalogue():
    for layout, masking, feature_map, normalize, mixing, per_head in itertools.product(
            LAYOUTS, ("none", "causal", "block_causal"), ("identity", "relu", "elu1"), (True, False),
            ("dense", "toeplitz"), (False, True)):
        if layout != "1D ragged" and masking != "none":
            continue  # causal masking is for sequences
        if mixing == "toeplitz" and masking == "none":
            continue  # Toeplitz mixing defines b <= i only
        if feature_map == "identity" and normalize:
            continue  # signed sums may cancel: not a catalogue case
        yield layout, masking, feature_map, normalize, mixing, per_head


def results(case, dtype, backend, seed):
    layout_name, masking, feature_map, normalize, mixing, per_head = case
    layout = LAYOUTS[layout_name]()
    n, m, heads = layout.num_tokens, layout.num_blocks, 3
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(2, n, heads, 5, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(2, n, heads, 6, generator=gen, dtype=torch.float64)
    grad_o = torch.randn(2, n, heads, 6, generator=gen, dtype=torch.float64)
    shape = ((heads,) if per_head else ()) + ((4,) if mixing == "toeplitz" else (m, m))
    w = torch.rand(*shape, generator=gen, dtype=torch.float64) + 0.1
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    q, k, v = (t.to(dtype).requires_grad_() for t in (q, k, v))
    w = w.to(wide).requires_grad_()
    o = mt.mhla_attention(q, k, v, w, layout, masking=masking, feature_map=feature_map, normalize=normalize,
                          mixing=mixing, backend=backend)
    o.backward(grad_o.to(dtype))
    return [o.detach(), q.grad, k.grad, v.grad, w.grad]


def main():
    total = hashlib.sha256()
    for backend in ("cpp", "torch"):
        for dtype in DTYPES:
            digest = hashlib.sha256()
            for seed, case in enumerate(catalogue()):
                for t in results(case, dtype, backend, seed):
                    digest.update(t.contiguous().view(torch.uint8).numpy().tobytes()
                                  if t.dtype in (torch.bfloat16, torch.float16) else t.contiguous().numpy().tobytes())
            total.update(digest.digest())
            print(f"{backend:5} {str(dtype).replace('torch.', ''):8} {digest.hexdigest()[:16]}")
    print(f"all            {total.hexdigest()[:16]}")


if __name__ == "__main__":
    main()
