"""Where mhla.torch's pure-torch path spends a GPU's time: torch.profiler's kernel table for
forward+backward of mhla.torch.mhla_attention and of the einsum formulation at one of
bench/gpu_check.py's shapes (bf16, B = 1), each kernel's total over five calls.

    PYTHONPATH=build/python python3 bench/torch_path_profile.py [--shape 1] [--rows 16]

Run it through the GPU check script: MHLA_GPU_CHECK_PARTS=python
MHLA_GPU_CHECK_PYTHON="bench/torch_path_profile.py" bash scripts/gpu_check.sh
"""
import argparse
import os
import sys

import torch

import mhla
import mhla.torch as mt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_check import SHAPES, einsum_mhla  # noqa: E402  (gpu_check finds the tests' einsum formulation)


def profile(name, forward, inputs, rows):
    leaves = [t.detach().requires_grad_(True) for t in inputs]
    grad = torch.randn_like(forward(*leaves))
    for _ in range(3):
        forward(*leaves).backward(grad)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            forward(*leaves).backward(grad)
        torch.cuda.synchronize()
    print(f"\n== {name}: forward+backward, 5 calls ==")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=70))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=int, default=1, help="index into bench/gpu_check.py's SHAPES")
    parser.add_argument("--rows", type=int, default=16, help="kernels listed per table")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(f"no CUDA device (torch {torch.__version__}): nothing to profile here")
        return 0
    name, tokens, heads, dim, layout, masking = SHAPES[args.shape]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: {name}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, tokens, heads, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
               for _ in range(3))
    w = torch.as_tensor(mhla.init_mixing(layout, causal=masking == "causal")).cuda()
    profile("mhla.torch", lambda q, k, v: mt.mhla_attention(q, k, v, w, layout, masking=masking), (q, k, v),
            args.rows)
    if masking == "none":
        w_reduced = w.to(torch.bfloat16)
        block = tokens // layout.num_blocks
        profile("einsum formulation", lambda q, k, v: einsum_mhla(q, k, v, w_reduced, block), (q, k, v), args.rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
