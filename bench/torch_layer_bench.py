"""Forward + backward of an mhla.torch layer against the same layer whose
attention step is written in plain torch (the chunked einsum form of the
authors' code), on the CPU.

    PYTHONPATH=build/python /usr/bin/python3 bench/torch_layer_bench.py \
        [--tokens 16384] [--head-dim 64] [--heads 1 8] [--threads 1 2] [--json out.json]

Both layers share their weights; the script first checks that they agree, then
reports the median of interleaved repeats and the speed-up (torch / mhla), for
the whole layer (projections included, which both spend alike) and for the
attention step alone (q, k, v and W in, gradients of all four out).

Below each attention row, the step's split, timed interleaved with it: the loss
and its autograd alone (the same `.square().mean().backward()` on a leaf shaped
like o, which both steps pay), and the mhla operator alone (mhla.forward keeping
both saved arrays, then mhla.backward: the calls the step makes, without
autograd); with the speed-up of the two steps less the shared loss.
"""
import argparse
import copy
import json
import platform

import torch
import torch.nn.functional as F

import mhla
import mhla.torch as mt
from attention_timing import median_seconds


def torch_attention(q, k, v, w, block, eps=1e-6):
    """Non-causal MHLA in plain torch: q, k, v [B, N, H, D], N a multiple of `block`; elu+1 features."""
    batch, tokens, heads, dk = q.shape
    m = tokens // block
    fq = (F.elu(q) + 1).view(batch, m, block, heads, dk)
    fk = (F.elu(k) + 1).view(batch, m, block, heads, dk)
    vb = v.view(batch, m, block, heads, v.shape[-1])
    summaries = torch.einsum("bmchd,bmche->bhmde", fk, vb)
    sums = fk.sum(2)
    mixed = torch.einsum("ij,bhjde->bhide", w, summaries)
    mixed_sums = torch.einsum("ij,bjhd->bihd", w, sums)
    numerator = torch.einsum("bmchd,bhmde->bmche", fq, mixed)
    denominator = torch.einsum("bmchd,bmhd->bmch", fq, mixed_sums)
    return (numerator / (denominator[..., None] + eps)).reshape(batch, tokens, heads, -1)


class TorchAttention:
    def __init__(self, block):
        self.block = block

    def __call__(self, q, k, v, w, layout):
        return torch_attention(q, k, v, w, self.block)


def layer_step(layer, x):
    def run():
        layer.zero_grad(set_to_none=True)
        layer(x).square().mean().backward()

    return run


def attention_step(attend, q, k, v, w, layout):
    def run():
        for t in (q, k, v, w):
            t.grad = None
        attend(q, k, v, w, layout).square().mean().backward()

    return run


def loss_step(shape):
    """The loss and autograd both attention steps run after their forward, on a leaf."""
    x = torch.randn(shape, requires_grad=True)

    def run():
        x.grad = None
        x.square().mean().backward()

    return run


def operator_step(layer, q, k, v, w, layout):
    """The mhla operator's calls in the attention step (forward keeping its state, backward), without autograd."""
    options = mhla.Options(layout, masking=layer.masking, feature_map=layer.feature_map, normalize=layer.normalize)
    q, k, v, w = (t.detach() for t in (q, k, v, w))
    grad_o = torch.randn_like(v)

    def run():
        state = mhla.ForwardState()
        o = mhla.forward(q, k, v, w, options=options, state=state)
        mhla.backward(q, k, v, w, o, grad_o, options=options, state=state)

    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--heads", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--block", type=int, default=128, help="block size (default: M = N / 128 blocks)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    if args.tokens % args.block:
        parser.error("--tokens must be a multiple of --block (the plain-torch form has no ragged blocks)")

    rows = []
    print(f"MHLA1d forward+backward, N={args.tokens}, head dim {args.head_dim}, blocks of {args.block}, "
          f"float32, torch {torch.__version__}")
    print(f"{'heads':>5} {'dim':>5} {'threads':>7} {'part':>9} {'torch ms':>9} {'mhla ms':>8} {'speed-up':>8} "
          f"{'max rel diff':>12}")
    for heads in args.heads:
        dim = heads * args.head_dim
        torch.manual_seed(0)
        layer = mt.MHLA1d(dim, heads, block_size=args.block, max_tokens=args.tokens)
        reference = copy.deepcopy(layer)
        reference.attend = TorchAttention(args.block)
        x = torch.randn(1, args.tokens, dim)
        with torch.no_grad():
            want, got = reference(x), layer(x)
        diff = ((got - want).abs().max() / want.abs().max()).item()
        if diff > 1e-4:
            raise SystemExit(f"the two layers disagree: max relative difference {diff:.2e}")
        q, k, v = (torch.randn(1, args.tokens, heads, args.head_dim, requires_grad=True) for _ in range(3))
        w = layer.mixing().detach().requires_grad_()
        layout = layer._layout(args.tokens)
        parts = {
            "layer": {"torch": layer_step(reference, x), "mhla": layer_step(layer, x)},
            "attention": {"torch": attention_step(reference.attend, q, k, v, w, layout),
                          "mhla": attention_step(layer.attend, q, k, v, w, layout),
                          "loss": loss_step(v.shape), "operator": operator_step(layer, q, k, v, w, layout)},
        }
        for threads in args.threads:
            torch.set_num_threads(threads)  # also the OpenMP threads of the extension (one runtime)
            for part, runs in parts.items():
                t = median_seconds(runs, args.repeats)
                speedup = t["torch"] / t["mhla"]
                print(f"{heads:>5} {dim:>5} {threads:>7} {part:>9} {1e3 * t['torch']:>9.1f} "
                      f"{1e3 * t['mhla']:>8.1f} {speedup:>7.2f}x {diff:>12.1e}", flush=True)
                row = dict(heads=heads, dim=dim, threads=threads, part=part, torch_ms=1e3 * t["torch"],
                           mhla_ms=1e3 * t["mhla"], speedup=speedup, max_rel_diff=diff)
                if "loss" in t:
                    row.update(loss_ms=1e3 * t["loss"], operator_ms=1e3 * t["operator"],
                               speedup_less_loss=(t["torch"] - t["loss"]) / (t["mhla"] - t["loss"]))
                    print(f"{'':>23} split: loss and autograd alone {row['loss_ms']:.1f} ms, mhla operator "
                          f"alone {row['operator_ms']:.1f} ms; less the loss {row['speedup_less_loss']:.2f}x",
                          flush=True)
                rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(tokens=args.tokens, head_dim=args.head_dim, block=args.block, repeats=args.repeats,
                           torch=torch.__version__, machine=platform.processor() or platform.machine(),
                           rows=rows), f, indent=2)


if __name__ == "__main__":
    main()
