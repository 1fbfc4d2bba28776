"""Class-conditional image generation with a small DiT: softmax attention, linear attention and MHLA.

The paper's strongest claim is image generation (DiT on ImageNet: FID 59.8 with MHLA, 89.7 with linear
attention, 68.4 with softmax attention). This script trains the same small DiT on Fashion-MNIST with each of
the three attentions and nothing else changed: patch tokens with a fixed 2D sine-cosine position embedding,
adaLN-Zero conditioning on the class and the time, rectified-flow matching, AdamW, an exponential moving
average of the weights, the same steps and seeds. The attentions are ``mhla.torch.MHLA2d`` (MHLA),
``MHLA2d`` with one block covering the grid (linear attention: the same layer with a single summary) and
``mhla.torch.softmax_attention`` with the same projections.

Each model is scored by the Frechet distance (FD) between its samples and real images in the 128
penultimate features of a small CNN classifier trained once on the training images and kept in the output
folder (``OUT/fd-classifier.pt``), so that a results folder carries the classifier that scored it: its training
is not bit-reproducible across machines, and FDs compare only under one classifier. The learning
rate of each model is chosen on the first seed by short runs scored on the validation images; every seed then
trains at it for the full budget and is scored against the 10,000 test images.

    PYTHONPATH=build/python $(bash scripts/torch2_env.sh)/bin/python experiments/python/dit_generation.py \\
        [--out dit-generation] [--device cpu|cuda] [--quick]

Finished runs are saved as they finish (``OUT/runs/*.json``) and read back when the command is run again
with the same ``--out``, so a stopped comparison continues where it stopped. Writes ``results.json``,
``results.md``, one class-by-sample grid per model (``samples-<model>.png``, first seed) and, with gnuplot,
``loss.png`` and ``fd.png``.
"""
import argparse
import copy
import hashlib
import json
import math
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image

import fashion_mnist
from reporting import accuracy, mean_pm, mean_std, plot_curves
from mhla.torch import MHLA2d, softmax_attention

MODELS = ("softmax", "linear", "mhla")
# The settings a saved run must share with the command that reads it back.
CONFIG = ("steps", "batch", "patch", "tile", "width", "depth", "heads", "ema", "sample_steps", "samples",
          "eval_samples", "evals", "classifier_steps", "sweep_fraction", "device", "images")
# --quick: every step of the protocol in seconds (a smoke test, not a result).
QUICK = dict(steps=6, width=32, depth=1, heads=2, patch=4, tile="2,2", samples=100, eval_samples=50, evals=2,
             sample_steps=2, ema=0.0, lrs="1e-3,2e-3", seeds="0,1", sweep_fraction=0.5, batch=16, classifier_steps=20,
             images=1000)


# ---------------------------------------------------------------------------------------------- the model

class SoftmaxAttention(nn.Module):
    """Softmax attention with MHLA2d's projections (q, k, v and output, with biases)."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x):
        split = (*x.shape[:2], self.heads, x.shape[2] // self.heads)
        q, k, v = (proj(x).view(split) for proj in (self.q_proj, self.k_proj, self.v_proj))
        return self.out_proj(softmax_attention(q, k, v).reshape(x.shape))


def attention(kind, dim, heads, grid, tile):
    if kind == "softmax":
        return SoftmaxAttention(dim, heads)
    # Linear attention is MHLA with one block: one summary of all tokens, W = [1].
    return MHLA2d(dim, heads, grid=grid, tile=grid if kind == "linear" else tile)


def modulate(x, shift, scale):
    return x * (1 + scale) + shift


class Block(nn.Module):
    """A DiT block with adaLN-Zero: the conditioning sets each branch's shift, scale and gate, the gates
    starting at zero so that every block starts as the identity."""

    def __init__(self, kind, dim, heads, grid, tile, mlp_ratio):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.attn = attention(kind, dim, heads, grid, tile)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(approximate="tanh"),
                                 nn.Linear(mlp_ratio * dim, dim))
        self.ada = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        nn.init.zeros_(self.ada[1].weight)
        nn.init.zeros_(self.ada[1].bias)

    def forward(self, x, c):
        shift1, scale1, gate1, shift2, scale2, gate2 = self.ada(c).unsqueeze(1).chunk(6, dim=-1)
        x = x + gate1 * self.attn(modulate(self.norm1(x), shift1, scale1))
        return x + gate2 * self.mlp(modulate(self.norm2(x), shift2, scale2))


def sincos_2d(dim, grid):
    """The fixed 2D sine-cosine position embedding [grid * grid, dim]: half the channels for rows, half for
    columns."""
    def one_axis(channels, positions):
        freqs = 1.0 / 10000 ** (torch.arange(channels // 2, dtype=torch.float64) / (channels // 2))
        angles = positions[:, None].double() * freqs[None]
        return torch.cat([angles.sin(), angles.cos()], dim=1)

    rows, cols = torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij")
    return torch.cat([one_axis(dim // 2, rows.flatten()), one_axis(dim // 2, cols.flatten())], dim=1).float()


def time_features(t, channels=256):
    """Sinusoidal features of the flow time t in [0, 1] (scaled to [0, 1000] as DiT scales its steps)."""
    freqs = torch.exp(-math.log(10000) * torch.arange(channels // 2, device=t.device) / (channels // 2))
    angles = 1000 * t[:, None] * freqs[None]
    return torch.cat([angles.cos(), angles.sin()], dim=1)


class DiT(nn.Module):
    """Predicts the flow velocity of 1 x 28 x 28 images from (x_t, t, class)."""

    def __init__(self, kind, *, width, depth, heads, patch, tile, mlp_ratio=4, classes=10):
        super().__init__()
        if 28 % patch:
            raise ValueError(f"patch must divide 28, got {patch}")
        self.patch, self.grid = patch, 28 // patch
        grid = (self.grid, self.grid)
        self.embed = nn.Conv2d(1, width, patch, stride=patch)
        self.register_buffer("position", sincos_2d(width, self.grid), persistent=False)
        self.time = nn.Sequential(nn.Linear(256, width), nn.SiLU(), nn.Linear(width, width))
        self.label = nn.Embedding(classes, width)
        self.blocks = nn.ModuleList(Block(kind, width, heads, grid, tile, mlp_ratio) for _ in range(depth))
        self.norm = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.final_ada = nn.Sequential(nn.SiLU(), nn.Linear(width, 2 * width))
        self.out = nn.Linear(width, patch * patch)
        for layer in (self.final_ada[1], self.out):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, x, t, y):
        tokens = self.embed(x).flatten(2).transpose(1, 2) + self.position
        c = self.time(time_features(t)) + self.label(y)
        for block in self.blocks:
            tokens = block(tokens, c)
        shift, scale = self.final_ada(c).unsqueeze(1).chunk(2, dim=-1)
        patches = self.out(modulate(self.norm(tokens), shift, scale))  # [B, grid^2, p^2]
        b, g, p = x.shape[0], self.grid, self.patch
        return patches.view(b, g, g, p, p).permute(0, 1, 3, 2, 4).reshape(b, 1, 28, 28)


def flow_loss(model, x, y, generator):
    """Rectified flow: x_t = (1 - t) x + t noise with t logit-normal; the target velocity is noise - x."""
    noise = torch.randn(x.shape, generator=generator, device=x.device)
    t = torch.sigmoid(torch.randn(x.shape[0], generator=generator, device=x.device))
    xt = (1 - t[:, None, None, None]) * x + t[:, None, None, None] * noise
    return F.mse_loss(model(xt, t, y), noise - x)


@torch.no_grad()
def sample(model, labels, steps, generator, batch=500):
    """Images for `labels`, by `steps` Euler steps of the flow from noise (t = 1) to data (t = 0)."""
    model.eval()
    out = []
    for i in range(0, len(labels), batch):
        y = labels[i:i + batch]
        x = torch.randn((len(y), 1, 28, 28), generator=generator, device=y.device)
        for s in range(steps, 0, -1):
            t = torch.full((len(y),), s / steps, device=y.device)
            x = x - model(x, t, y) / steps
        out.append(x.clamp(-1, 1))
    model.train()
    return torch.cat(out)


# --------------------------------------------------------------------------- the Frechet distance's features

class Classifier(nn.Module):
    """A small CNN; its 128 penultimate features are the space the Frechet distance is measured in."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU())
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        return self.head(self.features(x))


def train_classifier(data, steps, device, batch=128):
    torch.manual_seed(0)
    model = Classifier().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = data["train"]
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        index = torch.randint(len(x), (batch,), generator=generator)
        loss = F.cross_entropy(model(x[index].to(device)), y[index].to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    return model


def classifier_for(data, path, steps, device):
    """The cached classifier at `path` (trained and saved there when missing) and its test accuracy."""
    if os.path.exists(path):
        saved = torch.load(path, map_location="cpu")
        if saved["steps"] == steps:
            model = Classifier()
            model.load_state_dict(saved["state"])
            return model.to(device).eval(), saved["test_accuracy"]
    start = time.time()
    model = train_classifier(data, steps, device)
    test_accuracy = accuracy(model, data["test"], device=device)
    print(f"feature classifier: {steps} steps in {time.time() - start:.0f} s, test accuracy {test_accuracy:.2%}",
          flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    torch.save({"steps": steps, "state": model.state_dict(), "test_accuracy": test_accuracy}, path)
    return model.eval(), test_accuracy


def fingerprint(classifier):
    """A short hash of the classifier's weights. Runs scored with another classifier have FDs on another scale
    (its training depends even on the thread count), so a saved run is read back only with the same one."""
    weights = b"".join(t.detach().cpu().contiguous().numpy().tobytes() for t in classifier.state_dict().values())
    return hashlib.sha256(weights).hexdigest()[:16]


@torch.no_grad()
def features(classifier, images, batch=1000):
    device = next(classifier.parameters()).device
    return torch.cat([classifier.features(images[i:i + batch].to(device)).double().cpu()
                      for i in range(0, len(images), batch)]).numpy()


def moments(f):
    return f.mean(axis=0), np.cov(f, rowvar=False)


def frechet_distance(mean1, cov1, mean2, cov2):
    """|m1 - m2|^2 + tr(C1 + C2 - 2 (C1 C2)^(1/2)) for symmetric positive semi-definite C1, C2.

    tr (C1 C2)^(1/2) is the sum of the square roots of the eigenvalues of R C2 R with R = C1^(1/2): that
    matrix is similar to C1 C2 and symmetric, so a symmetric eigensolver suffices (no general sqrtm)."""
    values, vectors = np.linalg.eigh(cov1)
    root = (vectors * np.sqrt(np.clip(values, 0, None))) @ vectors.T
    product = root @ cov2 @ root
    cross = np.sqrt(np.clip(np.linalg.eigvalsh((product + product.T) / 2), 0, None)).sum()
    return float(((mean1 - mean2) ** 2).sum() + np.trace(cov1) + np.trace(cov2) - 2 * cross)


# ------------------------------------------------------------------------------------------------ training

def train_one(kind, args, data, reference, classifier, *, lr, seed, steps, log, start_from=None):
    """One model trained for `steps` steps, from a new DiT of `kind` or from `start_from()`'s model; returns
    its record (loss curve, validation FD points and, for a full run, the test FD) and the EMA model."""
    torch.manual_seed(seed)
    device = torch.device(args.device)
    model = (start_from() if start_from is not None else
             DiT(kind, width=args.width, depth=args.depth, heads=args.heads, patch=args.patch, tile=args.tile))
    model = model.to(device)
    ema = copy.deepcopy(model).eval()
    for p in ema.parameters():
        p.requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * s / steps))))
    generator = torch.Generator(device=device).manual_seed(seed)
    order_generator = torch.Generator().manual_seed(seed)
    x, y = data["train"]
    record = {"model": kind, "lr": lr, "seed": seed, "steps": steps,
              "parameters": sum(p.numel() for p in model.parameters()), "loss": [], "validation_fd": []}
    every = max(1, steps // args.evals)
    losses, start = [], time.time()
    for step in range(steps):
        index = torch.randint(len(x), (args.batch,), generator=order_generator)
        loss = flow_loss(model, x[index].to(device), y[index].to(device), generator)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        # The average's decay warms up as (1 + t) / (10 + t) towards --ema: a fixed 0.999 would keep
        # half of the initial weights in the average after 700 steps.
        decay = min(args.ema, (step + 1) / (step + 10))
        with torch.no_grad():
            for e, p in zip(ema.parameters(), model.parameters()):
                e.lerp_(p, 1 - decay)
        losses.append(loss.item())
        if (step + 1) % every == 0 or step + 1 == steps:
            record["loss"].append([step + 1, sum(losses) / len(losses)])
            losses = []
            fd = score(ema, classifier, reference["validation"], args.eval_samples, args, seed)
            record["validation_fd"].append([step + 1, fd])
            print(f"  {log} step {step + 1}/{steps}: loss {record['loss'][-1][1]:.4f}, validation FD "
                  f"({args.eval_samples} samples) {fd:.2f}, {time.time() - start:.0f} s", flush=True)
    record["train_seconds"] = time.time() - start
    return record, ema


def balanced_labels(count, device):
    return (torch.arange(count, device=device) % 10).sort().values


def score(model, classifier, reference_moments, count, args, seed):
    generator = torch.Generator(device=args.device).manual_seed(10_000 + seed)
    images = sample(model, balanced_labels(count, torch.device(args.device)), args.sample_steps, generator)
    return frechet_distance(*moments(features(classifier, images)), *reference_moments)


def save_grid(model, path, args, seed, per_class=10):
    """A PNG of `per_class` samples (columns) of each class (rows)."""
    generator = torch.Generator(device=args.device).manual_seed(20_000 + seed)
    images = sample(model, balanced_labels(10 * per_class, torch.device(args.device)), args.sample_steps, generator)
    pixels = ((images.cpu().squeeze(1) + 1) * 127.5).round().clamp(0, 255).to(torch.uint8)
    grid = pixels.view(10, per_class, 28, 28).permute(0, 2, 1, 3).reshape(280, per_class * 28)
    Image.fromarray(grid.numpy()).resize((per_class * 56, 560), Image.NEAREST).save(path)


# -------------------------------------------------------------------------------------------- the protocol

def load(folder, limit=None):
    def prepare(x, y):
        x, y = x[:limit], y[:limit]
        return torch.from_numpy(x.astype(np.float32) / 127.5 - 1).unsqueeze(1), torch.from_numpy(y.astype(np.int64))

    return {name: prepare(*split) for name, split in fashion_mnist.splits(folder).items()}


def run(kind, args, data, reference, classifier, *, lr, seed, steps, sweep, start_from=None, config_extra=None):
    """A finished run's record, read back from OUT/runs when there, else trained, scored and saved.
    `start_from` gives the starting model (train_one); `config_extra`, what else a read-back run must share."""
    name = f"{kind}-lr{lr:g}-seed{seed}" + ("-sweep" if sweep else "")
    path = os.path.join(args.out, "runs", name + ".json")
    config = {key: getattr(args, key) for key in CONFIG}
    config["tile"] = list(config["tile"])
    config["classifier"] = fingerprint(classifier)
    config.update(config_extra or {})
    if os.path.exists(path):
        with open(path) as f:
            record = json.load(f)
        if record["config"] != config:
            changed = ", ".join(f"{k} {record['config'].get(k)} -> {v}" for k, v in config.items()
                                if record["config"].get(k) != v)
            other = "another --out" + (", or the --classifier it was scored with"
                                       if record["config"].get("classifier") != config["classifier"] else "")
            raise SystemExit(f"{path} was trained with other settings ({changed}): pass {other}")
        print(f"  {name}: read back", flush=True)
        return record
    record, ema = train_one(kind, args, data, reference, classifier, lr=lr, seed=seed, steps=steps, log=name,
                            start_from=start_from)
    record["config"] = config
    if not sweep:
        start = time.time()
        record["test_fd"] = score(ema, classifier, reference["test"], args.samples, args, seed)
        record["sample_seconds"] = time.time() - start
        if seed == args.seeds[0]:
            save_grid(ema, os.path.join(args.out, f"samples-{kind}.png"), args, seed)
        print(f"  {name}: test FD ({args.samples} samples) {record['test_fd']:.2f}", flush=True)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
    return record


# Extensions of the rate grid beyond its given rates, as in `mhla-lab compare`.
MAX_EXTENSIONS = 3


def widened_grid_choice(lrs, validation_fd, max_extensions=MAX_EXTENSIONS):
    """The rate with the lowest validation_fd(rate) over the grid lrs, widened by a factor of 2 beyond the edge
    the best rate sits on, at most max_extensions times. Returns (rate, every tried rate ascending, whether the
    rate is still at an edge of a grid of two or more rates)."""
    fd = {lr: validation_fd(lr) for lr in sorted(lrs)}
    for _ in range(max_extensions if len(fd) > 1 else 0):
        tried = sorted(fd)
        best = min(tried, key=fd.get)
        if best not in (tried[0], tried[-1]):
            break
        beyond = best / 2 if best == tried[0] else best * 2
        fd[beyond] = validation_fd(beyond)
    tried = sorted(fd)
    best = min(tried, key=fd.get)
    return best, tried, len(tried) > 1 and best in (tried[0], tried[-1])


def choose_rate(kind, args, data, reference, classifier, **run_options):
    """The rate whose short run of the first seed ends with the lowest validation FD (widened_grid_choice);
    returns it, the short runs' records by rate, and whether it is at an edge of the tried grid.
    `run_options` go to run (the starting model)."""
    steps = max(1, int(args.steps * args.sweep_fraction))
    records = {}

    def validation_fd(lr):
        records[lr] = run(kind, args, data, reference, classifier, lr=lr, seed=args.seeds[0], steps=steps, sweep=True,
                          **run_options)
        return records[lr]["validation_fd"][-1][1]

    if len(args.lrs) == 1:
        return args.lrs[0], [], False
    lr, tried, at_edge = widened_grid_choice(args.lrs, validation_fd)
    return lr, [records[r] for r in tried], at_edge


def write_results(args, result):
    rows = []
    for kind in args.models:
        runs = result["models"][kind]["runs"]
        seconds = mean_std([r["train_seconds"] for r in runs])[0]
        per_seed = " / ".join(f"{r['test_fd']:.2f}" for r in runs)
        rows.append(f"| {kind} | {mean_pm([r['test_fd'] for r in runs])} | {per_seed} | "
                    f"{result['models'][kind]['lr']:g}{' (edge)' if result['models'][kind]['lr_at_grid_edge'] else ''} | "
                    f"{runs[0]['parameters']:,} | {seconds / 60:.1f} |")
    lines = [f"Frechet distance (lower is better) between {args.samples:,} samples (balanced over the classes) and "
             f"the {result['test_images']:,} test images, in the 128 penultimate features of a CNN classifier (test accuracy "
             f"{result['classifier_test_accuracy']:.2%}); {args.steps:,} steps of {args.batch} images, "
             f"{len(args.seeds)} seed(s), the learning rate chosen on validation.", "",
             "| model | test FD | per seed | lr | parameters | minutes per run |", "|---|---:|---|---:|---:|---:|"]
    lines += rows + paired_lines(args, result)
    table = "\n".join(lines) + "\n"
    print("\n" + table)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(table)


def paired_lines(args, result, qualifier=""):
    """The lines of MHLA's test FD minus each other model's, paired by seed (none for one seed or without
    MHLA), after a blank line; `qualifier` follows "MHLA minus <model>"."""
    if len(args.seeds) < 2 or "mhla" not in args.models:
        return []
    by_seed = {kind: {r["seed"]: r["test_fd"] for r in result["models"][kind]["runs"]} for kind in args.models}
    lines = [""]
    for other in (k for k in args.models if k != "mhla"):
        paired = mean_pm([by_seed["mhla"][s] - by_seed[other][s] for s in args.seeds], signed=True)
        lines.append(f"MHLA minus {other}{qualifier}, paired by seed: {paired}")
    return lines


def comma_list(kind, smallest_positive=True):
    def parse(text):
        try:
            values = [kind(t) for t in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__} values, got {text!r}")
        if any(v <= 0 if smallest_positive else v < 0 for v in values):
            raise argparse.ArgumentTypeError(f"expected {'positive' if smallest_positive else 'non-negative'} "
                                             f"values, got {text!r}")
        return values
    return parse


def positive(text):
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def parse(description=__doc__.split("\n")[0], out="dit-generation", extra=None, defaults=None, quick=None):
    """The command line; `extra(parser)` adds a caller's options, `defaults` and `quick` its defaults and
    its --quick ones."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", default=out)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (the CUDA path is mhla's pure-torch one)")
    parser.add_argument("--quick", action="store_true", help="a smoke test of every step in seconds")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--seeds", type=comma_list(int, smallest_positive=False), default="0,1,2")
    parser.add_argument("--lrs", type=comma_list(float), default="2e-3,4e-3,8e-3,1.6e-2",
                        help="the learning-rate grid of the first seed's short runs")
    parser.add_argument("--sweep-fraction", type=float, default=0.25, help="the short runs' share of --steps")
    parser.add_argument("--steps", type=positive, default=2400)
    parser.add_argument("--batch", type=positive, default=64)
    parser.add_argument("--patch", type=positive, default=2)
    parser.add_argument("--tile", type=comma_list(int), default="4,4",
                        help="MHLA's tile over the patch grid (blocks of tokens)")
    parser.add_argument("--width", type=positive, default=64)
    parser.add_argument("--depth", type=positive, default=4)
    parser.add_argument("--heads", type=positive, default=2)
    parser.add_argument("--ema", type=float, default=0.999,
                        help="largest decay of the weights' moving average (warmed up from 0.1)")
    parser.add_argument("--sample-steps", type=positive, default=25, help="Euler steps per sample")
    parser.add_argument("--samples", type=positive, default=2000, help="samples per model for the test FD")
    parser.add_argument("--eval-samples", type=positive, default=400, help="samples per validation FD")
    parser.add_argument("--evals", type=positive, default=3, help="validation FDs per run")
    parser.add_argument("--classifier", help="the FD classifier's file, trained there when missing "
                                             "(default: OUT/fd-classifier.pt)")
    parser.add_argument("--classifier-steps", type=positive, default=2000)
    parser.add_argument("--data", default=fashion_mnist.DATA,
                        help="the folder of Fashion-MNIST's four *-ubyte.gz files (default: the Debian package's)")
    parser.add_argument("--images", type=positive, help="only the first IMAGES of each split (smoke tests)")
    parser.add_argument("--threads", type=positive, default=os.cpu_count())
    if extra is not None:
        extra(parser)
    parser.set_defaults(**(defaults or {}))
    # --quick changes the defaults; options given beside it still apply.
    if parser.parse_known_args()[0].quick:
        parser.set_defaults(**QUICK, **(quick or {}))
    args = parser.parse_args()
    if args.classifier is None:
        args.classifier = os.path.join(args.out, "fd-classifier.pt")
    args.models = args.models.split(",")
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; expected some of {', '.join(MODELS)}")
    if 28 % args.patch:
        parser.error(f"--patch must divide 28, got {args.patch}")
    if not 0 < args.sweep_fraction <= 1:
        parser.error(f"--sweep-fraction is a share of --steps in (0, 1], got {args.sweep_fraction}")
    if len(args.tile) != 2:
        parser.error(f"--tile takes two sizes (rows,columns), got {args.tile}")
    args.tile = tuple(args.tile)
    if min(args.samples, args.eval_samples) < 10:
        parser.error("--samples and --eval-samples must be at least 10 (one per class)")
    if not 0 <= args.ema < 1:
        parser.error(f"--ema is a decay in [0, 1), got {args.ema}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda, but torch sees no CUDA device")
    if problem := fashion_mnist.folder_problem(args.data):
        parser.error(f"--data: {problem}")
    return args


def main():
    args = parse()
    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    start = time.time()
    data = load(args.data, args.images)
    classifier, accuracy = classifier_for(data, args.classifier, args.classifier_steps, torch.device(args.device))
    reference = {name: moments(features(classifier, data[name][0])) for name in ("validation", "test")}
    result = {"args": vars(args), "classifier_test_accuracy": accuracy, "classifier": fingerprint(classifier),
              "test_images": len(data["test"][0]), "models": {}}
    # Every model's rate first, then seed by seed, so that a stopped comparison has whole seeds.
    for kind in args.models:
        lr, sweep, at_edge = choose_rate(kind, args, data, reference, classifier)
        result["models"][kind] = {"lr": lr, "lr_at_grid_edge": at_edge, "runs": [],
                                  "sweep": [{"lr": r["lr"], "validation_fd": r["validation_fd"][-1][1]} for r in sweep]}
    for seed in args.seeds:
        for kind in args.models:
            result["models"][kind]["runs"].append(run(kind, args, data, reference, classifier,
                                                      lr=result["models"][kind]["lr"], seed=seed, steps=args.steps,
                                                      sweep=False))
    first = {kind: result["models"][kind]["runs"][0] for kind in args.models}
    for column, name, ylabel in (("loss", "loss", "flow-matching loss (training, mean per interval)"),
                                 ("validation_fd", "fd", f"validation FD ({args.eval_samples} samples)")):
        result[f"{name}_png"] = plot_curves(os.path.join(args.out, f"{name}.png"),
                                            {kind: record[column] for kind, record in first.items()},
                                            xlabel="training step", ylabel=ylabel,
                                            title="DiT on Fashion-MNIST (first seed)")
    result["seconds"] = time.time() - start
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(result, f, indent=1)
    write_results(args, result)


if __name__ == "__main__":
    main()
