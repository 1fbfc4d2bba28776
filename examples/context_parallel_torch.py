"""One sequence over several processes with mhla.distributed (gloo on the CPU).

    PYTHONPATH=build/python /usr/bin/python3 -m torch.distributed.run --standalone \\
        --redirects 1 --tee 1 --nproc_per_node 2 examples/context_parallel_torch.py

(--redirects 1 --tee 1 only because Debian's torch 1.13 under Python 3.11
cannot parse their default, 0; other torch builds need neither.)

Each rank holds a contiguous range of whole blocks of a 4,096-token sequence,
runs a causal MHLA layer on its shard, and takes one optimiser step after
summing the gradients over the ranks (as DistributedDataParallel would). Rank 0
checks the shard outputs against the same layer on the whole sequence.
"""
import torch
import torch.distributed as dist

import mhla
from mhla import distributed as md
from mhla import torch as mt

TOKENS, BLOCK, DIM, HEADS = 4096, 64, 64, 4


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same weights and data on every rank
    layer = md.ContextParallelMHLA1d(DIM, HEADS, block_size=BLOCK, max_tokens=TOKENS, causal=True)
    x = torch.randn(1, TOKENS, DIM)
    whole = mt.MHLA1d(DIM, HEADS, block_size=BLOCK, max_tokens=TOKENS, causal=True)
    whole.load_state_dict(layer.state_dict())  # for the check below, before the step

    # Whole blocks per rank, the remainder to the last ranks.
    blocks = TOKENS // BLOCK
    counts = [blocks // world + (r >= world - blocks % world) for r in range(world)]
    shard = mhla.plan_shards(mhla.Layout.sequence(TOKENS, BLOCK), [c * BLOCK for c in counts])[rank]
    rows = slice(shard.first_token, shard.first_token + shard.tokens)

    y = layer(x[:, rows])
    y.pow(2).mean().backward()
    for p in layer.parameters():  # every gradient is this rank's share
        dist.all_reduce(p.grad)
    torch.optim.SGD(layer.parameters(), lr=0.1).step()

    # The check: every rank's shard, gathered on rank 0, against the whole sequence.
    parts = [None] * world
    dist.all_gather_object(parts, (shard.first_token, y.detach()))
    if rank == 0:
        o_whole = whole(x).detach()
        o = torch.cat([p for _, p in sorted(parts, key=lambda t: t[0])], dim=1)
        print(f"{world} ranks, {TOKENS} tokens in {blocks} blocks; rank 0 held {shard}")
        print(f"max |o - o_whole| = {(o - o_whole).abs().max().item():.3g}")
    # Every rank leaves together: a rank that tears its group down while
    # another still runs can abort at exit under torch 2.x's gloo.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
