"""A small causal byte-level language model built from mhla.torch layers,
trained for a few minutes on the King James Bible (Debian's bible-kjv), then
sampled token by token with MHLA1d's decode cache. It also times generation
with and without the cache at several context lengths.

    PYTHONPATH=build/python /usr/bin/python3 examples/generate_text.py
        [--minutes 3] [--contexts 1024,8192,65536] [--threads 2] [--json out.json]

Without the cache every new token reruns the model on the whole text so far
(O(n) per token); with it, a token costs the same at any length (the
decoder's state per head is O(M Dk Dv), M = blocks of context).
"""
import argparse
import json
import math
import os
import subprocess
import time

import torch
from torch import nn

import mhla.torch as mt

BIBLE = ["bible", "-l100000", "gen1:1-rev22:21"]  # the text as Debian's bible-kjv prints it


class Block(nn.Module):
    """Pre-norm Transformer block whose attention is a causal MHLA1d (with a causal positional conv)."""

    def __init__(self, dim, heads, block_size, max_tokens):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = mt.MHLA1d(dim, heads, block_size=block_size, max_tokens=max_tokens, causal=True, pos_conv=3)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x, cache=None):
        y = self.norm1(x)
        x = x + (self.attn(y) if cache is None else self.attn.decode(y, cache))
        return x + self.mlp(self.norm2(x))


class ByteLM(nn.Module):
    def __init__(self, dim=128, heads=4, layers=2, block_size=64, max_tokens=65536 + 1024):
        super().__init__()
        self.embed = nn.Embedding(256, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, block_size, max_tokens) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 256)

    def forward(self, tokens, caches=None):
        """Logits [B, T, 256] of the next byte; with caches (new_caches()), T new tokens continue them."""
        x = self.embed(tokens)
        for i, block in enumerate(self.blocks):
            x = block(x, None if caches is None else caches[i])
        return self.head(self.norm(x))

    def new_caches(self, batch=1):
        return [block.attn.new_cache(batch) for block in self.blocks]


def corpus():
    try:
        text = subprocess.run(BIBLE, capture_output=True, check=True).stdout
    except FileNotFoundError:
        raise SystemExit("the 'bible' program is missing: apt-get install bible-kjv bible-kjv-text")
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
    split = int(0.95 * len(data))
    return data[:split], data[split:]  # train on the first 95%, report loss on the rest


def batches(data, batch, length, generator):
    while True:
        starts = torch.randint(0, len(data) - length - 1, (batch,), generator=generator)
        window = torch.stack([data[s:s + length + 1] for s in starts.tolist()])
        yield window[:, :-1], window[:, 1:]


@torch.no_grad()
def bits_per_byte(model, data, length=512, windows=16):
    g = torch.Generator().manual_seed(1)
    x, y = next(batches(data, windows, length, g))
    return nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).item() / math.log(2)


def train(model, data, held_out, minutes, length=512, batch=8):
    g = torch.Generator().manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    print(f"held-out bits/byte before training: {bits_per_byte(model, held_out):.3f}")
    start, step = time.perf_counter(), 0
    for x, y in batches(data, batch, length, g):
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        elapsed = time.perf_counter() - start
        if step % 50 == 0:
            print(f"step {step:5d}  {elapsed:6.0f} s  train bits/byte {loss.item() / math.log(2):.3f}")
        if elapsed > 60 * minutes:
            break
    print(f"held-out bits/byte after {step} steps ({elapsed:.0f} s): {bits_per_byte(model, held_out):.3f}")


@torch.no_grad()
def sample(model, prompt, tokens, temperature=0.8, seed=0):
    g = torch.Generator().manual_seed(seed)
    caches = model.new_caches()
    logits = model(torch.tensor([list(prompt)]), caches)[:, -1]
    out = bytearray(prompt)
    for _ in range(tokens):
        token = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=g)
        out.append(token.item())
        logits = model(token, caches)[:, -1]
    return bytes(out).decode("utf-8", errors="replace")


@torch.no_grad()
def generation_speed(model, context, steps_cached=64, steps_uncached=None):
    """Tokens/s after `context` tokens: with the cache (prefill, then timed steps) and without it
    (each token reruns the model on the whole text so far)."""
    g = torch.Generator().manual_seed(2)
    text = torch.randint(0, 256, (1, context + steps_cached), generator=g)
    caches = model.new_caches()
    model(text[:, :context], caches)  # prefill
    start = time.perf_counter()
    for t in range(context, context + steps_cached):
        model(text[:, t:t + 1], caches)
    cached = steps_cached / (time.perf_counter() - start)
    steps_uncached = steps_uncached or max(2, min(16, 16384 // context))
    start = time.perf_counter()
    for t in range(context, context + steps_uncached):
        model(text[:, :t + 1])[:, -1]
    uncached = steps_uncached / (time.perf_counter() - start)
    # The two paths agree: a step after the prefill gives the full forward's logits.
    full = model(text[:, :context + 1])[:, -1]
    again = model.new_caches()
    model(text[:, :context], again)
    step = model(text[:, context:context + 1], again)[:, -1]
    return cached, uncached, (full - step).abs().max().item()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0, help="training time")
    parser.add_argument("--contexts", default="1024,8192,65536", help="context lengths for the speed table")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--sample", type=int, default=300, help="bytes to generate")
    parser.add_argument("--json", help="write the measurements here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    model = ByteLM()
    data, held_out = corpus()
    print(f"corpus: {len(data) + len(held_out):,} bytes; model: {sum(p.numel() for p in model.parameters()):,} "
          f"parameters (mixing matrices included); {args.threads} threads")
    train(model, data, held_out, args.minutes)
    model.eval()
    print("\nsample (temperature 0.8):\n" + sample(model, b"And God said", args.sample) + "\n")

    rows = []
    print(f"{'context':>8} {'cached tok/s':>13} {'uncached tok/s':>15} {'speed-up':>9} {'max |diff|':>11}")
    for context in (int(c) for c in args.contexts.split(",")):
        cached, uncached, diff = generation_speed(model, context)
        rows.append(dict(context=context, cached_tokens_per_s=cached, uncached_tokens_per_s=uncached,
                         max_logit_difference=diff))
        print(f"{context:>8} {cached:>13.1f} {uncached:>15.2f} {cached / uncached:>8.1f}x {diff:>11.2e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(threads=args.threads, minutes=args.minutes, speed=rows), f, indent=2)


if __name__ == "__main__":
    main()
