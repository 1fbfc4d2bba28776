"""mt.mhla_attention on bfloat16 and float16 inputs against float32 inputs,
forward and forward+backward, on the CPU.

    PYTHONPATH=build/python /usr/bin/python3 bench/reduced_precision_bench.py \
        [--tokens 65536] [--heads 8] [--head-dim 64] [--threads 2] [--json out.json]

bfloat16 runs the operator's bfloat16 path (block products on AVX512-BF16
dot products where the CPU has them, forward and backward; elsewhere float32
on widened copies);
float16 runs the operator's float16 path (on the CPU, float32 on copies
widened inside the operator, each result rounded once). "torch casts" is the call
on float32 copies made by torch's own .float(), rounded back by .to(dtype),
for comparison. Forward runs without gradients (nothing saved for backward),
as inference does. Times are medians of interleaved repeats; ratios are
float32 time / reduced time, so above 1 means the reduced dtype is faster.
"""
import json
import platform

import torch

import mhla.torch as mt
from attention_timing import attention_step, median_seconds, operands, parse_args


def with_torch_casts(q, k, v, w, layout, backward, dtype):
    """attention_step on float32 copies cast by torch, the output cast back to dtype."""
    def run():
        leaves = [t.detach().requires_grad_(backward) for t in (q, k, v, w)]
        o = mt.mhla_attention(*(t.float() for t in leaves), layout, feature_map="elu1").to(dtype)
        if backward:
            o.backward(torch.ones_like(o))

    return run


def main():
    args = parse_args(__doc__)
    layout, q, k, v, w = operands(args)

    results = {"tokens": args.tokens, "heads": args.heads, "head_dim": args.head_dim, "block": args.block,
               "threads": args.threads, "repeats": args.repeats, "torch": torch.__version__,
               "machine": platform.processor() or platform.machine(), "rows": []}
    print(f"mt.mhla_attention, N={args.tokens}, {args.heads} heads of {args.head_dim}, blocks of {args.block}, "
          f"{args.threads} threads, torch {torch.__version__}")
    print(f"{'dtype':>8} {'part':>17} {'float32 ms':>10} {'reduced ms':>10} {'torch casts ms':>14} "
          f"{'fp32/reduced':>12} {'fp32/torch casts':>16}")
    for dtype in (torch.bfloat16, torch.float16):
        name = str(dtype).replace("torch.", "")
        reduced = [t.to(dtype) for t in (q, k, v, w)]
        for part, backward in (("forward", False), ("forward+backward", True)):
            runs = {"float32": attention_step(q, k, v, w, layout, backward),
                    "reduced": attention_step(*reduced, layout, backward),
                    "torch casts": with_torch_casts(*reduced, layout, backward, dtype)}
            ms = {run: 1e3 * t for run, t in median_seconds(runs, args.repeats).items()}
            ratio, ratio_torch = ms["float32"] / ms["reduced"], ms["float32"] / ms["torch casts"]
            print(f"{name:>8} {part:>17} {ms['float32']:>10.1f} {ms['reduced']:>10.1f} {ms['torch casts']:>14.1f} "
                  f"{ratio:>11.2f}x {ratio_torch:>15.2f}x", flush=True)
            results["rows"].append(dict(dtype=name, part=part, float32_ms=ms["float32"], reduced_ms=ms["reduced"],
                                        torch_casts_ms=ms["torch casts"], float32_over_reduced=ratio,
                                        float32_over_torch_casts=ratio_torch))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
