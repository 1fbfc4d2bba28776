"""Eager mt.mhla_attention on its autograd function against the same call through the
torch.library custom op that torch.compile traces (mhla._custom_ops), at small shapes where the
dispatch is most of the time: why eager calls keep the autograd function. Needs torch 2.4 or later.

    PYTHONPATH=build/python $(bash scripts/torch2_env.sh)/bin/python bench/custom_op_dispatch_bench.py \
        [--tokens 64] [--heads 8] [--head-dim 64] [--block 16] [--threads 2] [--repeats 200] [--json out.json]

Medians of interleaved repeats, forward alone and forward and backward.
"""
import json

import torch

import mhla.torch as mt
from attention_timing import median_seconds, operands, parse_args, run_settings
from mhla import _custom_ops, _torch_functions
from mhla._torch_forms.chunk import Geometry


def main():
    args = parse_args(__doc__, tokens=64, block=16)
    if not _custom_ops.AVAILABLE:
        raise SystemExit(f"torch {torch.__version__} has no torch.library.custom_op (torch 2.4 or later)")
    layout, q, k, v, w = operands(args)
    geometry = Geometry.of(layout)
    names = _torch_functions._option_names(masking=None, feature_map="elu1", normalize=None, eps=None, scale=None,
                                           mixing=None)
    calls = {"autograd function": lambda *t: mt.mhla_attention(*t, layout, feature_map="elu1"),
             "custom op": lambda *t: _custom_ops.mhla_attention(*t, geometry, **names)}

    def step(call, backward):
        def run():
            leaves = [t.detach().requires_grad_(backward) for t in (q, k, v, w)]
            o = call(*leaves)
            if backward:
                o.backward(torch.ones_like(o))
        return run

    results = run_settings(args)
    print(f"mt.mhla_attention eagerly, N={args.tokens}, {args.heads} heads of {args.head_dim}, float32, "
          f"{args.threads} threads, torch {torch.__version__}")
    print(f"{'part':>17} {'autograd fn us':>14} {'custom op us':>12} {'difference us':>13}")
    for part, backward in (("forward", False), ("forward+backward", True)):
        seconds = median_seconds({name: step(call, backward) for name, call in calls.items()}, args.repeats)
        us = {name: 1e6 * t for name, t in seconds.items()}
        function, op = us["autograd function"], us["custom op"]
        print(f"{part:>17} {function:>14.1f} {op:>12.1f} {op - function:>13.1f}", flush=True)
        results["rows"].append(dict(part=part, autograd_function_us=function, custom_op_us=op))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
