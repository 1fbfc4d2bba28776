"""What the plain-torch path's finite-result check costs (python/mhla/_finite_results.py):
mt.mhla_attention(backend="torch"), forward and forward + backward, with the check synchronous,
deferred, and taken out (its three entry points replaced by no-ops, which no user can choose:
the measure of the check alone), medians of interleaved repeats.

    PYTHONPATH=build/python /usr/bin/python3 bench/finite_check_bench.py \\
        [--tokens 16384] [--heads 8] [--head-dim 64] [--block 128] [--threads 2] [--device cpu] [--json out.json]

On a CUDA device "sync" waits for the device once per check; "deferred" (the default there)
never does, and its device-side test reads o, q, k, v (and in backward the gradients, o and
grad_o) once more.
"""
import argparse
import json
import platform
from unittest import mock

import torch

import mhla
import mhla.torch as mt
from mhla import _finite_results
from attention_timing import median_seconds


def step(q, k, v, w, layout, backward):
    def run():
        leaves = [t.detach().requires_grad_(backward) for t in (q, k, v, w)]
        o = mt.mhla_attention(*leaves, layout, feature_map="elu1", backend="torch")
        if backward:
            o.backward(torch.ones_like(o))
        mt.check_finite_results()  # every mode's answer is read within the timed call
        if q.device.type == "cuda":
            torch.cuda.synchronize()
    return run


# The check taken out: its three entry points as no-ops.
UNCHECKED = dict(check_results=lambda *args, **kwargs: None, check_mixing=lambda *args, **kwargs: None,
                 watch=lambda q, k, v, w, message: (q, k, v, w, lambda o: o))


def in_mode(name, run):
    def timed():
        if name == "unchecked":
            with mock.patch.multiple(_finite_results, **UNCHECKED):
                run()
        else:
            previous = _finite_results.set_mode(name)
            run()
            _finite_results.set_mode(previous)
    return timed


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    layout = mhla.Layout.sequence(args.tokens, args.block)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, args.tokens, args.heads, args.head_dim, generator=g).to(args.device)
               for _ in range(3))
    w = torch.from_numpy(mhla.init_mixing(layout)).to(args.device)
    results = {}
    for backward in (False, True):
        label = "forward+backward" if backward else "forward"
        runs = {name: in_mode(name, step(q, k, v, w, layout, backward)) for name in ("sync", "deferred", "unchecked")}
        times = median_seconds(runs, args.repeats)
        results[label] = {name: t * 1e3 for name, t in times.items()}
        for name in ("sync", "deferred"):
            print(f"{label:17s} {name:8s} {times[name] * 1e3:9.2f} ms   unchecked {times['unchecked'] * 1e3:9.2f} ms"
                  f"   the check {100 * (times[name] / times['unchecked'] - 1):+5.1f}%")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(tokens=args.tokens, heads=args.heads, head_dim=args.head_dim, block=args.block,
                           threads=args.threads, device=args.device, machine=platform.processor(),
                           torch=torch.__version__, milliseconds=results), f, indent=1)


if __name__ == "__main__":
    main()
