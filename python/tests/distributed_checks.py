"""Checks of mhla.distributed run on every rank, launched by test_distributed.py as

    python3 -m torch.distributed.run --standalone --nproc_per_node R distributed_checks.py CHECK

Each rank compares its results with mhla.torch on the whole sequence (computed by
every rank itself) and exits non-zero on a mismatch; the launcher then fails.
"""
import sys

import torch
import torch.distributed as dist

import mhla
from mhla import distributed as md
from mhla import torch as mt

RANK, WORLD = None, None


def split(total_slices, slice_tokens, tile, extent, single_first):
    counts = [1] * WORLD
    rest, others = total_slices - 1, WORLD - 1
    for r in range(others):
        counts[r + 1 if single_first else r] = rest // others + (1 if r < rest % others else 0)
    tokens, start = [], 0
    for r in range(WORLD):
        end = extent if r == WORLD - 1 else start + counts[r] * tile
        tokens.append((end - start) * slice_tokens)
        start = end
    return tokens


# (name, layout, tokens per slice, tile along the first axis, slices, extent, options)
def cases():
    out = []
    seq = mhla.Layout.sequence(37, 4)  # 10 blocks, ragged
    for masking in ("none", "causal", "block_causal"):
        for per_head in (False, True):
            out.append((f"1d-{masking}-{'per-head' if per_head else 'shared'}", seq, 1, 4, 10, 37,
                        dict(masking=masking, feature_map="elu1"), per_head, None))
    out.append(("1d-causal-toeplitz", seq, 1, 4, 10, 37, dict(masking="causal", mixing="toeplitz"), False, 3))
    out.append(("1d-unnormalized-relu", seq, 1, 4, 10, 37, dict(normalize=False, feature_map="relu"), False, None))
    grid = mhla.Layout.grid2d(11, 5, 2, 3)  # 6 tile rows, ragged both ways
    out.append(("2d-none", grid, 5, 2, 6, 11, dict(feature_map="elu1"), False, None))
    out.append(("2d-block-causal", grid, 5, 2, 6, 11, dict(masking="block_causal"), True, None))
    return out


def inputs(layout, heads, dk, dv, per_head, toeplitz, dtype):
    g = torch.Generator().manual_seed(7)
    n, m = layout.num_tokens, layout.num_blocks
    q = torch.rand(2, n, heads, dk, generator=g, dtype=torch.float64) * 2 - 1
    k = torch.rand(2, n, heads, dk, generator=g, dtype=torch.float64) * 2 - 1
    v = torch.rand(2, n, heads, dv, generator=g, dtype=torch.float64) * 2 - 1
    shape = ([heads] if per_head else []) + ([toeplitz + 1] if toeplitz is not None else [m, m])
    w = torch.rand(*shape, generator=g, dtype=torch.float64) * 0.9 + 0.05
    grad_o = torch.rand(2, n, heads, dv, generator=g, dtype=torch.float64) * 2 - 1
    return [t.to(dtype) for t in (q, k, v, w, grad_o)]


def run_shard(q, k, v, w, grad_o, layout, first, count, options):
    q, k, v, w = (t[:, first:first + count].clone() if t.dim() == 4 else t.clone() for t in (q, k, v, w))
    for t in (q, k, v, w):
        t.requires_grad_(True)
    o = md.context_parallel_attention(q, k, v, w, layout, **options)
    o.backward(grad_o[:, first:first + count])
    gw = w.grad.clone()
    dist.all_reduce(gw)  # the rank's share, summed over the group
    return [o.detach(), q.grad, k.grad, v.grad, gw]


def check_exact():
    failures = 0
    for name, layout, slice_tokens, tile, slices, extent, options, per_head, toeplitz in cases():
        if slices < WORLD:
            continue
        for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 2e-4)):
            for single_first in (True, False):
                tokens = split(slices, slice_tokens, tile, extent, single_first)
                shard = mhla.plan_shards(layout, tokens)[RANK]
                q, k, v, w, grad_o = inputs(layout, 2, 3, 4, per_head, toeplitz, dtype)
                got = run_shard(q, k, v, w, grad_o, layout, shard.first_token, shard.tokens, options)
                # The whole sequence in one process, in float64.
                full = [t.double().clone().requires_grad_(True) for t in (q, k, v, w)]
                o = mt.mhla_attention(*full, layout, **options)
                o.backward(grad_o.double())
                rows = slice(shard.first_token, shard.first_token + shard.tokens)
                want = [o.detach()[:, rows], full[0].grad[:, rows], full[1].grad[:, rows], full[2].grad[:, rows],
                        full[3].grad]
                for label, a, b in zip(("o", "grad_q", "grad_k", "grad_v", "grad_w"), got, want):
                    err = (a.double() - b).abs().max().item() / max(b.abs().max().item(), 1.0)
                    if not err <= tol:
                        print(f"rank {RANK}: {name} {dtype} {label}: relative error {err:.3g} > {tol}")
                        failures += 1
                if single_first:
                    again = run_shard(q, k, v, w, grad_o, layout, shard.first_token, shard.tokens, options)
                    if not all(torch.equal(a, b) for a, b in zip(got, again)):
                        print(f"rank {RANK}: {name} {dtype}: a second call differs")
                        failures += 1
    return failures


def expect_error(call, fragment):
    try:
        call()
    except ValueError as e:
        if fragment in str(e):
            return 0
        print(f"rank {RANK}: expected '{fragment}' in: {e}")
        return 1
    print(f"rank {RANK}: expected an error containing '{fragment}', got none")
    return 1


def check_faults():
    layout = mhla.Layout.sequence(8 * WORLD, 4)
    m = layout.num_blocks

    def call(tokens=8, masking="block_causal", w=None, dv=4):
        q = torch.rand(1, tokens, 2, 3, dtype=torch.float64)
        v = torch.rand(1, tokens, 2, dv, dtype=torch.float64)
        w = torch.full((m, m), 0.5, dtype=torch.float64) if w is None else w
        return lambda: md.context_parallel_attention(q, q, v, w, layout, masking=masking)

    failures = expect_error(call(tokens={0: 6, 1: 10}.get(RANK, 8)),
                            "rank 0 holds tokens 0..5, which ends inside block 1")
    failures += expect_error(call(masking="none" if RANK == 1 else "block_causal"),
                             "rank 1 disagrees with rank 0 on options")
    w = torch.full((m, m), 0.5, dtype=torch.float64)
    if RANK == 1:
        w[0, 0] = 0.25
    failures += expect_error(call(w=w), "rank 1 disagrees with rank 0 on w_checksum")
    failures += expect_error(call(dv=5 if RANK == 1 else 4), "rank 1 disagrees with rank 0 on sizes")
    # A rank whose own inputs the operator refuses: every rank raises, naming it.
    bad = torch.full((m, m), 0.5, dtype=torch.float64)
    bad[1, 0] = -1.0  # negative weights are refused in normalized mode (same w everywhere)
    failures += expect_error(call(w=bad), "rank 0: mhla::mix_summaries")
    return failures


def check_layer():
    torch.manual_seed(0)
    full = mt.MHLA1d(16, 2, block_size=4, max_tokens=40, causal=True).double()
    cp = md.ContextParallelMHLA1d(16, 2, block_size=4, max_tokens=40, causal=True).double()
    cp.load_state_dict(full.state_dict())
    x = torch.rand(2, 37, 16, dtype=torch.float64)
    tokens = split(10, 1, 4, 37, True)
    shard = mhla.plan_shards(mhla.Layout.sequence(37, 4), tokens)[RANK]
    rows = slice(shard.first_token, shard.first_token + shard.tokens)
    want = full(x)
    want.sum().backward()
    got = cp(x[:, rows].clone())
    got.sum().backward()
    failures = 0
    if not torch.allclose(got, want[:, rows], rtol=0, atol=1e-12):
        print(f"rank {RANK}: layer output differs")
        failures += 1
    for (name, p), (_, q) in zip(full.named_parameters(), cp.named_parameters()):
        g = q.grad.clone()
        dist.all_reduce(g)  # every parameter's gradient is this rank's share
        if not torch.allclose(g, p.grad, rtol=0, atol=1e-10):
            print(f"rank {RANK}: gradient of {name} differs by {(g - p.grad).abs().max().item():.3g}")
            failures += 1
    return failures


def main():
    global RANK, WORLD
    dist.init_process_group("gloo")
    RANK, WORLD = dist.get_rank(), dist.get_world_size()
    failures = {"exact": check_exact, "faults": check_faults, "layer": check_layer}[sys.argv[1]]()
    total = torch.tensor([failures])
    dist.all_reduce(total)
    if RANK == 0:
        print(f"{sys.argv[1]}: {WORLD} ranks, {int(total.item())} failures")
    dist.destroy_process_group()
    sys.exit(1 if total.item() else 0)


if __name__ == "__main__":
    main()
