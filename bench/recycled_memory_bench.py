"""mt.mhla_attention with result memory recycled (the default) against fresh
memory for every result (mhla.release_memory() before each call, untimed).

    PYTHONPATH=build/python /usr/bin/python3 bench/recycled_memory_bench.py \
        [--tokens 65536] [--heads 8] [--head-dim 64] [--threads 2] [--json out.json]

A fresh result is mapped by the kernel page by page as the operator first
writes it; a recycled one is already mapped. Medians of interleaved repeats.
"""
import json

import torch

import mhla
from attention_timing import attention_step, median_seconds, operands, parse_args, run_settings


def main():
    args = parse_args(__doc__)
    layout, q, k, v, w = operands(args)

    results = run_settings(args)
    print(f"mt.mhla_attention, N={args.tokens}, {args.heads} heads of {args.head_dim}, float32, "
          f"{args.threads} threads")
    print(f"{'part':>17} {'recycled ms':>11} {'fresh ms':>9} {'fresh/recycled':>14}")
    def before(name):
        if name == "fresh":
            mhla.release_memory()

    for part, backward in (("forward", False), ("forward+backward", True)):
        run = attention_step(q, k, v, w, layout, backward)
        seconds = median_seconds({"recycled": run, "fresh": run}, args.repeats, before)
        ms = {name: 1e3 * t for name, t in seconds.items()}
        print(f"{part:>17} {ms['recycled']:>11.1f} {ms['fresh']:>9.1f} {ms['fresh'] / ms['recycled']:>13.2f}x",
              flush=True)
        results["rows"].append(dict(part=part, recycled_ms=ms["recycled"], fresh_ms=ms["fresh"],
                                    speedup=ms["fresh"] / ms["recycled"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
