"""Errors of bfloat16 MHLA against float64 on the same (rounded) inputs, over random calls: the
distribution (median, 99th percentile, worst) of each result's error in units of that result's
largest magnitude, on both paths, and the worst call of each.

    PYTHONPATH=build/python python3 bench/reduced_precision_errors.py [--calls 400] [--json FILE]

A random call draws its layout (1D or 2D, ragged or not, 1 to 12 blocks), masking, feature map,
normalisation, mixing form, per-head mixing, Dk and Dv (1 to 48) and the inputs' scale. The
reference is the float64 C++ operator on the bfloat16-rounded q, k, v, grad_o and the float32 w.
"""
import argparse
import json
import random

import torch

import mhla
import mhla.torch as mt

RESULTS = ("o", "grad_q", "grad_k", "grad_v", "grad_w")


def random_call(rng):
    if rng.random() < 0.5:
        block = rng.randint(1, 16)
        layout = mhla.Layout.sequence(rng.randint(1, 12) * block - rng.randint(0, block - 1), block)
        masking = rng.choice(["none", "causal", "block_causal"])
    else:
        th, tw = rng.randint(1, 4), rng.randint(1, 4)
        layout = mhla.Layout.grid2d(th * rng.randint(1, 3) + rng.randint(0, 1), tw * rng.randint(1, 3), th, tw)
        masking = "none"
    mixing = "toeplitz" if masking != "none" and rng.random() < 0.3 else "dense"
    return dict(layout=layout, masking=masking, mixing=mixing, feature_map=rng.choice(["relu", "elu1"]),
                normalize=rng.random() < 0.8, per_head=rng.random() < 0.3, heads=rng.randint(1, 3),
                dk=rng.choice([1, 2, 3, 8, 16, 32, 48]), dv=rng.choice([1, 4, 16, 32, 48]),
                batch=rng.randint(1, 2), scale=rng.choice([0.1, 1.0, 3.0]), seed=rng.randrange(2 ** 31))


def describe(c):
    layout = c["layout"]
    return (f"N={layout.num_tokens} M={layout.num_blocks} {c['masking']} {c['feature_map']} "
            f"{'normalized' if c['normalize'] else 'unnormalized'} {c['mixing']}{' per head' if c['per_head'] else ''} "
            f"H={c['heads']} Dk={c['dk']} Dv={c['dv']} scale={c['scale']}")


def run(c, dtype, backend):
    layout, m = c["layout"], c["layout"].num_blocks
    gen = torch.Generator().manual_seed(c["seed"])
    b, n, h = c["batch"], layout.num_tokens, c["heads"]
    q, k = (torch.randn(b, n, h, c["dk"], generator=gen) * c["scale"] for _ in range(2))
    v, grad_o = (torch.randn(b, n, h, c["dv"], generator=gen) for _ in range(2))
    shape = ((h,) if c["per_head"] else ()) + ((min(m, 3) + 1,) if c["mixing"] == "toeplitz" else (m, m))
    w = torch.rand(*shape, generator=gen) + 0.05
    q, k, v, grad_o = (t.to(torch.bfloat16).to(dtype) for t in (q, k, v, grad_o))
    w = w.to(torch.float64 if dtype == torch.float64 else torch.float32)
    q, k, v, w = (t.clone().requires_grad_() for t in (q, k, v, w))
    o = mt.mhla_attention(q, k, v, w, layout, masking=c["masking"], feature_map=c["feature_map"],
                          normalize=c["normalize"], mixing=c["mixing"], backend=backend)
    o.backward(grad_o)
    return [t.detach().double() for t in (o, q.grad, k.grad, v.grad, w.grad)]


def ill_conditioned(c, name):
    """Where the normalised read-out makes a result zero up to eps in exact arithmetic, so that its
    rounding errors are not small against it: phi(q) cancels when Dk = 1 (grad_q), W[i, i] when
    there is one block (grad_w), and q and k when the only query sees only its own key (N = 1:
    o = v)."""
    if not c["normalize"]:
        return False
    layout = c["layout"]
    return ((name == "grad_q" and c["dk"] == 1) or (name == "grad_w" and layout.num_blocks == 1)
            or (name in ("grad_q", "grad_k") and layout.num_tokens == 1))


def quantiles(errors):
    values = sorted(errors)
    return dict(median=values[len(values) // 2], p99=values[min(len(values) - 1, int(0.99 * len(values)))],
                worst=values[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    calls = [random_call(rng) for _ in range(args.calls)]
    report = {"calls": args.calls, "torch": torch.__version__, "paths": {}}
    for backend in ("cpp", "torch"):
        errors = {name: [] for name in RESULTS}
        worst = {name: (0.0, None) for name in RESULTS}
        ill = {name: (0, 0.0, None) for name in RESULTS}  # count, worst error, its call
        for c in calls:
            try:
                want = run(c, torch.float64, "cpp")
                got = run(c, torch.bfloat16, backend)
            except ValueError:
                continue  # a named error (a result not representable) on either: not an error size
            for name, x, y in zip(RESULTS, got, want):
                error = float((x - y).abs().max() / y.abs().max().clamp_min(1e-300))
                if ill_conditioned(c, name):
                    count, largest, call = ill[name]
                    ill[name] = (count + 1, max(largest, error), call if largest >= error else describe(c))
                    continue
                errors[name].append(error)
                if error > worst[name][0]:
                    worst[name] = (error, describe(c))
        report["paths"][backend] = {
            name: dict(quantiles(errors[name]), worst_call=worst[name][1], ill_conditioned_calls=ill[name][0],
                       ill_conditioned_worst=ill[name][1], ill_conditioned_worst_call=ill[name][2])
            for name in RESULTS}
        print(f"{backend} path, bfloat16 against float64 ({len(errors['o'])} calls; error / largest |result|):")
        for name in RESULTS:
            s = report["paths"][backend][name]
            print(f"  {name:7} median {s['median']:.4f}  99th {s['p99']:.4f}  worst {s['worst']:.4f}  "
                  f"({s['worst_call']})")
            if s["ill_conditioned_calls"]:
                print(f"  {'':7} ill-conditioned: {s['ill_conditioned_calls']} calls, worst "
                      f"{s['ill_conditioned_worst']:.4g} ({s['ill_conditioned_worst_call']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
