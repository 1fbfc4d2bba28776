"""mt.mhla_attention with result memory recycled (the default) against fresh
memory for every result (mhla.release_memory() before each call, untimed).

    PYTHONPATH=build/python /usr/bin/python3 bench/recycled_memory_bench.py \
        [--tokens 65536] [--heads 8] [--head-dim 64] [--threads 2] [--json out.json]

A fresh result is mapped by the kernel page by page as the operator first
writes it; a recycled one is already mapped. Medians of interleaved repeats.
"""
import argparse
import json
import platform
import statistics
import time

import torch

import mhla
import mhla.torch as mt


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=65536)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--block", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    layout = mhla.Layout.sequence(args.tokens, args.block)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, args.tokens, args.heads, args.head_dim, generator=g) for _ in range(3))
    w = torch.from_numpy(mhla.init_mixing(layout))

    def run(backward):
        leaves = [t.detach().requires_grad_(backward) for t in (q, k, v, w)]
        o = mt.mhla_attention(*leaves, layout, feature_map="elu1")
        if backward:
            o.backward(torch.ones_like(o))

    results = dict(tokens=args.tokens, heads=args.heads, head_dim=args.head_dim, block=args.block,
                   threads=args.threads, repeats=args.repeats, torch=torch.__version__,
                   machine=platform.processor() or platform.machine(), rows=[])
    print(f"mt.mhla_attention, N={args.tokens}, {args.heads} heads of {args.head_dim}, float32, "
          f"{args.threads} threads")
    print(f"{'part':>17} {'recycled ms':>11} {'fresh ms':>9} {'fresh/recycled':>14}")
    for part, backward in (("forward", False), ("forward+backward", True)):
        times = {"recycled": [], "fresh": []}
        run(backward)
        for _ in range(args.repeats):
            for name, samples in times.items():
                if name == "fresh":
                    mhla.release_memory()
                start = time.perf_counter()
                run(backward)
                samples.append(time.perf_counter() - start)
        ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
        print(f"{part:>17} {ms['recycled']:>11.1f} {ms['fresh']:>9.1f} {ms['fresh'] / ms['recycled']:>13.2f}x",
              flush=True)
        results["rows"].append(dict(part=part, recycled_ms=ms["recycled"], fresh_ms=ms["fresh"],
                                    speedup=ms["fresh"] / ms["recycled"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
