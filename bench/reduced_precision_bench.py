"""mt.mhla_attention on bfloat16 inputs against float32 inputs, forward and
forward+backward, on the CPU.

    PYTHONPATH=build/python /usr/bin/python3 bench/reduced_precision_bench.py \
        [--tokens 65536] [--heads 8] [--head-dim 64] [--threads 2] [--json out.json]

bfloat16 has no kernel of its own: mhla.torch widens q, k, v (and incoming
gradients) to float32 and rounds the results back. "bfloat16, torch casts" is
the same call with those conversions done by torch's own .float() and
.to(torch.bfloat16) instead of the extension's, for comparison. Times are
medians of interleaved repeats; ratios are float32 time / bfloat16 time, so
above 1 means bfloat16 is faster.
"""
import argparse
import json
import platform
import statistics
import time
from unittest import mock

import torch

import mhla
import mhla.torch as mt


def step(q, k, v, w, layout, backward):
    def run():
        leaves = [t.detach().requires_grad_(backward) for t in (q, k, v, w)]
        o = mt.mhla_attention(*leaves, layout, feature_map="elu1")
        if backward:
            o.backward(torch.ones_like(o))

    return run


def torch_casts():
    """mhla.torch's conversion helpers replaced by torch's own casts."""
    return mock.patch.multiple(mt, _to_float32=lambda t: t.float(), _to_dtype=lambda o, dtype: o.to(dtype))


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
    reduced = [t.to(torch.bfloat16) for t in (q, k, v, w)]

    results = {"tokens": args.tokens, "heads": args.heads, "head_dim": args.head_dim, "block": args.block,
               "threads": args.threads, "repeats": args.repeats, "torch": torch.__version__,
               "machine": platform.processor() or platform.machine(), "rows": []}
    print(f"mt.mhla_attention, N={args.tokens}, {args.heads} heads of {args.head_dim}, blocks of {args.block}, "
          f"{args.threads} threads, torch {torch.__version__}")
    print(f"{'part':>17} {'float32 ms':>10} {'bf16 ms':>8} {'bf16, torch casts ms':>20} {'fp32/bf16':>9} "
          f"{'fp32/bf16 torch casts':>21}")
    for part, backward in (("forward", False), ("forward+backward", True)):
        runs = {"float32": step(q, k, v, w, layout, backward), "bfloat16": step(*reduced, layout, backward)}
        torch_cast_run = step(*reduced, layout, backward)

        def with_torch_casts():
            with torch_casts():
                torch_cast_run()

        runs["bfloat16, torch casts"] = with_torch_casts
        times = {name: [] for name in runs}
        for run in runs.values():  # warm-up
            run()
        for _ in range(args.repeats):  # interleaved, so drifts of the machine hit all three
            for name, run in runs.items():
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
        ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
        ratio, ratio_torch = ms["float32"] / ms["bfloat16"], ms["float32"] / ms["bfloat16, torch casts"]
        print(f"{part:>17} {ms['float32']:>10.1f} {ms['bfloat16']:>8.1f} {ms['bfloat16, torch casts']:>20.1f} "
              f"{ratio:>8.2f}x {ratio_torch:>20.2f}x", flush=True)
        results["rows"].append(dict(part=part, float32_ms=ms["float32"], bfloat16_ms=ms["bfloat16"],
                                    bfloat16_torch_casts_ms=ms["bfloat16, torch casts"],
                                    float32_over_bfloat16=ratio, float32_over_bfloat16_torch_casts=ratio_torch))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
