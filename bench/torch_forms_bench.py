"""The plain-torch path's forms timed in one process on the CPU: the lean form (mhla.torch's path,
its backward written by hand), the chunked form under torch's autograd it is written from, and
the einsum formulation (tokens taken in block order), forward and forward + backward (elu+1,
normalised, float32), medians of interleaved repeats.

    PYTHONPATH=build/python:bench python3 bench/torch_forms_bench.py [--tokens 16384] [--block 128] [--json FILE]
"""
import json

import torch

from attention_timing import median_seconds, operands, parse_args, run_settings
from mhla._torch_forms import chunk, lean
from mhla._torch_forms.einsum import einsum_mhla


def step(form, inputs, backward):
    def run():
        leaves = [t.detach().requires_grad_(backward) for t in inputs]
        o = form(*leaves)
        if backward:
            o.backward(torch.ones_like(o))
    return run


def main():
    args = parse_args(__doc__.splitlines()[0], tokens=16384, block=128)
    layout, q, k, v, w = operands(args)
    forms = {"lean": lambda q, k, v, w: lean.mhla_attention(q, k, v, w, layout),
             "chunked": lambda q, k, v, w: chunk.mhla_attention(q, k, v, w, layout),
             "einsum": lambda q, k, v, w: einsum_mhla(q, k, v, w, args.block)}
    results = run_settings(args)
    for backward in (False, True):
        label = "forward+backward" if backward else "forward"
        times = median_seconds({name: step(form, (q, k, v, w), backward) for name, form in forms.items()},
                               args.repeats)
        row = dict(step=label, **{f"{name}_ms": t * 1e3 for name, t in times.items()})
        results["rows"].append(row)
        print(f"{label:17s} " + "   ".join(f"{name} {t * 1e3:8.2f} ms" for name, t in times.items())
              + f"   lean / chunked {times['lean'] / times['chunked']:.2f}   lean / einsum "
              f"{times['lean'] / times['einsum']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
