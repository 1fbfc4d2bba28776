"""What the Python benchmarks of mt.mhla_attention share: their options, the
operands, one timed call and interleaved medians."""
import argparse
import platform
import statistics
import time

import torch

import mhla
import mhla.torch as mt


def parse_args(description, tokens=65536, block=256):
    """--tokens, --heads, --head-dim, --block, --threads, --repeats and --json; sets torch's
    (and so the extension's) thread count."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=tokens)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--block", type=int, default=block)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    return args


def run_settings(args):
    """The settings a results file records beside its rows (``rows`` left empty)."""
    return dict(tokens=args.tokens, heads=args.heads, head_dim=args.head_dim, block=args.block, threads=args.threads,
                repeats=args.repeats, torch=torch.__version__, machine=platform.processor() or platform.machine(),
                rows=[])


def operands(args):
    """A 1D layout and float32 q, k, v [1, N, H, D] and its locality-initialised w."""
    layout = mhla.Layout.sequence(args.tokens, args.block)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, args.tokens, args.heads, args.head_dim, generator=g) for _ in range(3))
    return layout, q, k, v, torch.from_numpy(mhla.init_mixing(layout))


def attention_step(q, k, v, w, layout, backward):
    """mt.mhla_attention with elu+1 features, and its backward from ones when asked."""
    def run():
        leaves = [t.detach().requires_grad_(backward) for t in (q, k, v, w)]
        o = mt.mhla_attention(*leaves, layout, feature_map="elu1")
        if backward:
            o.backward(torch.ones_like(o))

    return run


def median_seconds(runs, repeats, before=None):
    """Median seconds of each run after one warm-up, the runs interleaved so that drifts of the
    machine hit all of them; before(name), when given, runs untimed ahead of each."""
    times = {name: [] for name in runs}
    for run in runs.values():
        run()
    for _ in range(repeats):
        for name, run in runs.items():
            if before:
                before(name)
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}
