"""Converting a trained softmax Vision Transformer to MHLA and to linear attention.

A small timm ViT is trained with softmax attention on Fashion-MNIST until its
validation accuracy stops improving. ``mhla.timm.swap_attention`` then replaces
its attention with MHLA and, separately, with linear attention, each starting
from the softmax q/k/v/output weights. Each converted model is fine-tuned for
the same short budget with the same optimiser, for several seeds (data order).
The paper converts a pretrained video model this way and reports that MHLA
recovers its quality where linear attention does not.

    PYTHONPATH=build/python $(bash scripts/torch2_env.sh)/bin/python experiments/python/timm_conversion.py \\
        [--out experiments/results/timm-conversion] [--seeds 0,1,2] [--finetune-epochs 1]

Data: the last 5,000 of the 60,000 training images are the validation split
(as in ``mhla-lab train``), the 10,000 test images are the test split. Writes
``results.json``, ``results.md`` and ``curves.png`` (with gnuplot) to --out.
"""
import argparse
import copy
import json
import math
import os
import time

import numpy as np
import timm
import torch
import torch.nn.functional as F

import fashion_mnist
from reporting import accuracy, mean_pm, plot_curves
from mhla.timm import swap_attention


def load(folder):
    raw = fashion_mnist.splits(folder)
    images = torch.from_numpy(raw["train"][0].astype(np.float32) / 255)
    mean, std = images.mean().item(), images.std().item()

    def prepare(x, y):
        return (torch.from_numpy(x.astype(np.float32) / 255).sub(mean).div(std).unsqueeze(1),
                torch.from_numpy(y.astype(np.int64)))

    return {name: prepare(*split) for name, split in raw.items()}


def make_model(args):
    torch.manual_seed(0)
    return timm.models.vision_transformer.VisionTransformer(
        img_size=28, patch_size=args.patch, in_chans=1, num_classes=10, embed_dim=args.width, depth=args.depth,
        num_heads=args.heads, mlp_ratio=2.0, qkv_bias=True, class_token=False, global_pool="avg")


@torch.no_grad()
def train(model, data, *, epochs, lr, seed, batch, evals_per_epoch, patience=None, log=""):
    """AdamW with a cosine schedule over ``epochs``; validation accuracy ``evals_per_epoch`` times per
    epoch. With ``patience``, stops after that many evaluations without a new best and restores the
    best weights. Returns the curve [(epoch, train loss, validation accuracy)]."""
    x, y = data["train"]
    steps_per_epoch = len(x) // batch
    total = int(round(epochs * steps_per_epoch))
    every = max(1, steps_per_epoch // evals_per_epoch)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * s / total)))
    generator = torch.Generator().manual_seed(seed)
    curve, best, best_state, since_best, losses = [], -1.0, None, 0, []
    for step in range(total):
        if step % steps_per_epoch == 0:
            order = torch.randperm(len(x), generator=generator)
        model.train()
        index = order[(step % steps_per_epoch) * batch:(step % steps_per_epoch + 1) * batch]
        loss = F.cross_entropy(model(x[index]), y[index])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if (step + 1) % every == 0 or step + 1 == total:
            validation = accuracy(model, data["validation"])
            curve.append(((step + 1) / steps_per_epoch, sum(losses) / len(losses), validation))
            losses = []
            print(f"  {log} epoch {curve[-1][0]:.2f}: train loss {curve[-1][1]:.4f}, validation {validation:.2%}",
                  flush=True)
            if validation > best:
                best, since_best = validation, 0
                best_state = copy.deepcopy(model.state_dict())
            else:
                since_best += 1
                if patience is not None and since_best >= patience:
                    break
    if patience is not None:
        model.load_state_dict(best_state)
    return curve


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="timm-conversion")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--patch", type=int, default=4)
    parser.add_argument("--tile", default="2,2", help="MHLA tile over the 7 x 7 patch grid")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--softmax-epochs", type=int, default=12)
    parser.add_argument("--softmax-lr", type=float, default=2e-3)
    parser.add_argument("--finetune-epochs", type=float, default=1.0)
    parser.add_argument("--finetune-lr", type=float, default=5e-4)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--data", default=fashion_mnist.DATA,
                        help="the folder of Fashion-MNIST's four *-ubyte.gz files (default: the Debian package's)")
    args = parser.parse_args()
    if problem := fashion_mnist.folder_problem(args.data):
        parser.error(f"--data: {problem}")
    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    data = load(args.data)
    start = time.time()

    softmax = make_model(args)
    print(f"softmax ViT, {sum(p.numel() for p in softmax.parameters())} parameters, up to {args.softmax_epochs} "
          "epochs (early stopping on validation)")
    softmax_curve = train(softmax, data, epochs=args.softmax_epochs, lr=args.softmax_lr, seed=1000,
                          batch=args.batch, evals_per_epoch=1, patience=3, log="softmax")
    result = {"args": vars(args), "softmax": {"curve": softmax_curve,
                                              "validation": accuracy(softmax, data["validation"]),
                                              "test": accuracy(softmax, data["test"]),
                                              "seconds": time.time() - start}}
    tile = tuple(int(t) for t in args.tile.split(","))
    curves = {}
    for kind in ("mhla", "linear"):
        result[kind] = []
        for seed in (int(s) for s in args.seeds.split(",")):
            t0 = time.time()
            model = swap_attention(copy.deepcopy(softmax), tile=tile, kind=kind)
            before = accuracy(model, data["test"])
            curve = train(model, data, epochs=args.finetune_epochs, lr=args.finetune_lr, seed=seed, batch=args.batch,
                          evals_per_epoch=8, log=f"{kind} seed {seed}")
            result[kind].append({"seed": seed, "test_before": before, "curve": curve,
                                 "validation": curve[-1][2], "test": accuracy(model, data["test"]),
                                 "seconds": time.time() - t0})
            if kind not in curves:
                curves[kind] = curve
            with open(os.path.join(args.out, "results.json"), "w") as f:
                json.dump(result, f, indent=1)
    result["curves_png"] = plot_curves(os.path.join(args.out, "curves.png"),
                                       {name: [(e, v * 100) for e, _, v in curve] for name, curve in curves.items()},
                                       xlabel="fine-tuning epoch", ylabel="validation accuracy (%)",
                                       title="softmax ViT converted, fine-tuned (first seed)", key="bottom right")
    result["seconds"] = time.time() - start
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(result, f, indent=1)
    write_table(args, result)


def write_table(args, result):
    soft = result["softmax"]

    rows = [f"| softmax (trained) | {100 * soft['test']:.2f} | | {len(soft['curve'])} epochs |"]
    for kind in ("mhla", "linear"):
        runs = result[kind]
        before = mean_pm([100 * r["test_before"] for r in runs])
        after = mean_pm([100 * r["test"] for r in runs])
        recovered = mean_pm([r["test"] / soft["test"] * 100 for r in runs], digits=1)
        rows.append(f"| {kind} (converted) | {after} | {before} | "
                    f"{args.finetune_epochs:g} epoch(s): {recovered}% of softmax |")
    table = ("Test accuracy (%) on all 10,000 Fashion-MNIST test images; converted models: mean ± std over "
             f"{len(result['mhla'])} fine-tuning seeds\n\n| model | test after | test at the swap | "
             "training |\n|---|---:|---:|---|\n" + "\n".join(rows) + "\n")
    print("\n" + table)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(table)


if __name__ == "__main__":
    main()
