#!/usr/bin/env python3
"""Cost model of context-parallel attention, calibrated on mhla_context_parallel_bench.

Reads the bench's JSON for 1 rank (and, if given, 2 ranks) and projects time
and memory per rank per training step (forward + backward) for 8 to 1,024 ranks
at 1M to 100M tokens, for three ways of splitting one sequence over ranks:

  MHLA-CP   this library: all-to-all of block summaries, O(M H Dk Dv) bytes per rank
  Ring      ring attention (softmax): K and V travel round the ring, O(N H D) per rank
  LASP-2    linear attention: one all-gather of d x d states, O(R H Dk Dv) per rank

Assumptions (stated again in the output):
  * compute: MHLA-CP time per rank = a * N_r + b * M^2 / R (a rank mixes its
    M / R rows of W over M blocks), b fitted on the 1-rank M sweep at fixed N,
    then a on the 1-rank N sweep (through the origin, after the M^2 term). LASP-2 and ring attention run at the FLOP rate MHLA reached in
    those measurements (their FLOPs from the standard formulas; ring attention
    is quadratic: 4 N_r N H D forward, 3.5x that for forward + backward).
  * network: each message costs alpha + bytes / beta; all-to-all and all-gather
    cost (R - 1) messages per rank; ring attention overlaps its transfers with
    compute (time = max of the two), the others do not overlap.
  * bytes: fp32, B = 1; MHLA-CP moves summaries three times per step (forward,
    the backward's recomputed forward, the gradients back) plus a ring
    all-reduce of grad_w (2 M^2 values); LASP-2 gathers states twice (forward,
    backward); ring attention moves K, V forward and K, V, dK, dV backward.
  * memory per rank: the layer's activations and gradients (8 tensors of
    N_r x H x D), plus each method's communication buffers.

Usage: context_parallel_model.py ONE_RANK.json [TWO_RANKS.json] [--beta GB/s] [--alpha us]
"""
import argparse
import json
import sys


def fit_line(xs, ys):
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return slope, my - slope * mx


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("one_rank")
    ap.add_argument("two_ranks", nargs="?")
    ap.add_argument("--beta", type=float, default=25.0, help="link bandwidth, GB/s (default 25: 200 Gb/s)")
    ap.add_argument("--alpha", type=float, default=5.0, help="per-message latency, microseconds")
    ap.add_argument("--blocks", type=int, default=1024, help="M of the projections")
    args = ap.parse_args()
    one = json.load(open(args.one_rank))
    heads, dim = one[0]["heads"], one[0]["dim"]
    m_fixed = max(set(r["blocks"] for r in one), key=lambda m: sum(r["blocks"] == m for r in one))
    n_sweep = [r for r in one if r["blocks"] == m_fixed]
    n_fixed = min(r["tokens"] for r in one)
    m_sweep = [r for r in one if r["tokens"] == n_fixed]
    b, _ = fit_line([r["blocks"] ** 2 for r in m_sweep], [r["step_seconds"] for r in m_sweep])
    b = max(b, 0.0)
    rest = [(r["tokens"], r["step_seconds"] - b * r["blocks"] ** 2) for r in n_sweep]
    a = sum(n * t for n, t in rest) / sum(n * n for n, _ in rest)
    # FLOPs of one MHLA step (forward 4 N H D^2 + 2 M^2 H D^2, backward twice that).
    flops = lambda n, m: 3 * (4 * n * heads * dim * dim + 2 * m * m * heads * dim * dim)
    big = max(n_sweep, key=lambda r: r["tokens"])
    rate = flops(big["tokens"], big["blocks"]) / big["step_seconds"]

    print(f"# Context-parallel attention: projected step time and memory per rank")
    print()
    print(f"Calibrated on {args.one_rank}: H = {heads}, D = {dim}, fp32, B = 1.")
    print(f"MHLA step on one rank = {a * 1e9:.1f} ns x N + {b * 1e9:.1f} ns x M^2 / R; "
          f"achieved {rate / 1e9:.1f} GFLOP/s (one thread per rank).")
    if args.two_ranks:
        two = json.load(open(args.two_ranks))
        print()
        print("Measured with 2 ranks on this machine (same sizes):")
        print()
        print("| N | M | 1 rank ms | 2 ranks ms | model 2 ranks ms | summary bytes sent per rank |")
        print("|---:|---:|---:|---:|---:|---:|")
        by_point = {(r["tokens"], r["blocks"]): r for r in one}
        for r in two:
            o = by_point.get((r["tokens"], r["blocks"]))
            model = a * r["tokens"] / 2 + b * r["blocks"] ** 2 / 2
            print(f"| {r['tokens']} | {r['blocks']} | {o['step_seconds'] * 1e3:.1f} | "
                  f"{r['step_seconds'] * 1e3:.1f} | {model * 1e3:.1f} | {r['summary_bytes_sent']} |"
                  if o else "")
    alpha, beta, m = args.alpha * 1e-6, args.beta * 1e9, args.blocks
    print()
    print(f"Projection: M = {m} blocks, link {args.beta:g} GB/s, latency {args.alpha:g} us per message.")
    print()
    print("| N | ranks | MHLA-CP s | MHLA-CP GB sent | LASP-2 s | LASP-2 GB sent | Ring s | Ring GB sent "
          "| MHLA-CP GiB mem | Ring GiB mem |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    summary = heads * dim * (dim + 1) * 4  # one block's summary, bytes
    for n in (1_000_000, 10_000_000, 100_000_000):
        for ranks in (8, 64, 1024):
            nr = n / ranks
            # MHLA-CP
            comp = a * nr + b * m * m / ranks
            sent = 3 * (m - m / ranks) * summary + 2 * m * m * 4
            mhla_t = comp + 3 * (ranks - 1) * alpha + sent / beta + 2 * (ranks - 1) * alpha
            # LASP-2: linear attention compute (no mix), all-gather of H x D x D states twice
            lin_comp = 3 * 4 * nr * heads * dim * dim / rate
            lasp_sent = 2 * (ranks - 1) * heads * dim * dim * 4
            lasp_t = lin_comp + 2 * (ranks - 1) * alpha + lasp_sent / beta
            # Ring attention: quadratic compute, K/V round the ring, overlapped
            ring_comp = 3.5 * 4 * nr * n * heads * dim / rate
            ring_sent = 3 * (ranks - 1) * nr * heads * 2 * dim * 4
            ring_t = max(ring_comp, ring_sent / beta + 3 * (ranks - 1) * alpha)
            act = 8 * nr * heads * dim * 4
            mhla_mem = act + 3 * m * summary + 2 * m * m * 4
            ring_mem = act + 4 * nr * heads * dim * 4
            print(f"| {n:,} | {ranks} | {mhla_t:.3g} | {sent / 1e9:.3g} | {lasp_t:.3g} | "
                  f"{lasp_sent / 1e9:.3g} | {ring_t:.3g} | {ring_sent / 1e9:.3g} | "
                  f"{mhla_mem / 2**30:.3g} | {ring_mem / 2**30:.3g} |")
    print()
    print("Bytes per rank: MHLA-CP's do not depend on N (they grow with M), LASP-2's grow with the")
    print("rank count, ring attention's with N. Compute rates are this machine's CPU cores; on")
    print("GPUs every time shrinks and the network share grows, which favours the smallest transfers.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
