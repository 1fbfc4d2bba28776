"""Converting a trained softmax DiT to MHLA with mhla.diffusers, then fine-tuning it.

A class-conditional diffusers ``DiTTransformer2DModel`` (1 x 28 x 28 Fashion-MNIST images in 2 x 2 patches:
a 14 x 14 grid) is trained here with softmax attention for ``--base-steps``, with the data, rectified flow,
EMA, sampler and Frechet distance (FD) of ``dit_generation.py``. Its EMA weights are then converted with
``mhla.diffusers.swap_attention``, every pretrained weight kept: to MHLA (``--tile``, 4 x 4 by default: M = 16)
and to linear attention (one tile over the whole grid: the same processor with one summary, M = 1). Each
conversion, and the softmax model itself as the control, is fine-tuned for ``--steps`` from those weights at
the learning rate it chose on validation (short runs of the first seed, the grid widened at its edges), for
every seed. Reported per model: the test FD before fine-tuning (the conversion as it is) and after.

    PYTHONPATH=build/python $(bash scripts/torch2_env.sh)/bin/python experiments/python/dit_conversion.py \\
        [--out dit-conversion] [--device cpu|cuda] [--quick]

The base model is kept as ``OUT/base.pt`` (or ``--base``) and read back when its settings match; finished fine-tuning runs
are kept in ``OUT/runs/`` (as in dit_generation.py), so a stopped command continues where it stopped. Writes
``results.md``, ``results.json`` and the first seed's sample grids.
"""
import hashlib
import json
import os
import time

import torch
from torch import nn

import dit_generation as dg
from reporting import mean_pm
from diffusers import DiTTransformer2DModel
from mhla.diffusers import swap_attention

# What the base model's read-back must share with the command.
BASE_CONFIG = ("base_steps", "base_lr", "batch", "patch", "width", "depth", "heads", "ema", "device", "images",
               "classifier_steps")
QUICK = dict(base_steps=6, base_lr=2e-3)


class DiffusersDiT(nn.Module):
    """diffusers' class-conditional DiT as the flow model ``(x_t, t, class) -> velocity`` of dit_generation."""

    def __init__(self, args):
        super().__init__()
        self.transformer = DiTTransformer2DModel(
            num_attention_heads=args.heads, attention_head_dim=args.width // args.heads, in_channels=1,
            out_channels=1, num_layers=args.depth, sample_size=28, patch_size=args.patch, num_embeds_ada_norm=10,
            norm_num_groups=1)

    def forward(self, x, t, y):
        # DiT's timestep embedding expects diffusion steps: the flow time t in [0, 1] scaled to [0, 1000].
        return self.transformer(x, timestep=1000 * t, class_labels=y).sample


def converted(base_state, kind, args):
    """The base model with its self-attention `kind`: softmax as trained, MHLA in `--tile` tiles, or linear
    attention (one tile over the patch grid)."""
    model = DiffusersDiT(args)
    model.load_state_dict(base_state)
    grid = 28 // args.patch
    if kind != "softmax":
        swap_attention(model.transformer, tile=(grid, grid) if kind == "linear" else args.tile)
    return model


def base_model(args, data, reference, classifier):
    """The softmax DiT's EMA weights after --base-steps (read back from --base when its settings match, else
    trained and written there) and its record."""
    path = args.base or os.path.join(args.out, "base.pt")
    config = {key: getattr(args, key) for key in BASE_CONFIG}
    config["classifier"] = dg.fingerprint(classifier)
    if os.path.exists(path):
        saved = torch.load(path, map_location="cpu")
        if saved["config"] == config:
            print("base softmax model: read back", flush=True)
            return saved["state"], saved["record"]
    record, ema = dg.train_one("softmax", args, data, reference, classifier, lr=args.base_lr, seed=0,
                               steps=args.base_steps, log="base softmax", start_from=lambda: DiffusersDiT(args))
    state = {key: value.cpu() for key, value in ema.state_dict().items()}
    torch.save({"config": config, "state": state, "record": record}, path)
    return state, record


def before_fine_tuning(base_state, kind, args, classifier, reference):
    """The conversion's test FD as it is (sampled with the first seed's generator)."""
    model = converted(base_state, kind, args).to(args.device)
    return dg.score(model, classifier, reference["test"], args.samples, args, args.seeds[0])


def write_results(args, result):
    lines = [f"Test Frechet distance (lower is better; {args.samples:,} samples against the {result['test_images']:,} "
             f"test images, features of the FD classifier at {result['classifier_test_accuracy']:.2%} test accuracy) of "
             f"a diffusers DiT trained {args.base_steps:,} steps with softmax attention (test FD "
             f"{result['base_test_fd']:.2f}), converted, then fine-tuned {args.steps:,} steps of {args.batch} images "
             f"at each model's rate chosen on validation; {len(args.seeds)} seed(s).", "",
             "| attention after conversion | before fine-tuning | after fine-tuning | per seed | lr |",
             "|---|---:|---:|---|---:|"]
    for kind in args.models:
        entry = result["models"][kind]
        after = [r["test_fd"] for r in entry["runs"]]
        lines.append(f"| {kind} | {entry['before_fine_tuning']:.2f} | {mean_pm(after)} | "
                     f"{' / '.join(f'{fd:.2f}' for fd in after)} | {entry['lr']:g}{' (edge)' if entry['lr_at_grid_edge'] else ''} |")
    lines += dg.paired_lines(args, result, " after fine-tuning")
    table = "\n".join(lines) + "\n"
    print("\n" + table)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(table)


def extra_options(parser):
    parser.add_argument("--base-steps", type=dg.positive, default=2400, help="the softmax base model's training steps")
    parser.add_argument("--base-lr", type=float, default=1.6e-2, help="the base model's learning rate")
    parser.add_argument("--base", help="the base model's file (default OUT/base.pt): read back when its settings "
                                       "match, else trained and written there")


def main():
    # Fine-tuning runs a quarter of the base model's steps, at rates around the base's.
    args = dg.parse(__doc__.split("\n")[0], out="dit-conversion", extra=extra_options,
                    defaults=dict(steps=600, lrs="1e-3,2e-3,4e-3,8e-3"), quick=QUICK)
    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    start = time.time()
    data = dg.load(args.data, args.images)
    classifier, accuracy = dg.classifier_for(data, args.classifier, args.classifier_steps, torch.device(args.device))
    reference = {name: dg.moments(dg.features(classifier, data[name][0])) for name in ("validation", "test")}
    base_state, base_record = base_model(args, data, reference, classifier)
    base = {"base_steps": args.base_steps, "base_lr": args.base_lr,
            "base": hashlib.sha256(json.dumps(base_record["loss"]).encode()).hexdigest()[:16]}
    result = {"args": vars(args), "classifier_test_accuracy": accuracy, "classifier": dg.fingerprint(classifier),
              "test_images": len(data["test"][0]), "base_record": base_record, "models": {}}
    result["base_test_fd"] = before_fine_tuning(base_state, "softmax", args, classifier, reference)
    # Each run starts from a fresh conversion (load_state_dict copies the base's values in).
    options = {kind: dict(start_from=lambda kind=kind: converted(base_state, kind, args), config_extra=base)
               for kind in args.models}
    for kind in args.models:
        lr, sweep, at_edge = dg.choose_rate(kind, args, data, reference, classifier, **options[kind])
        result["models"][kind] = {
            "before_fine_tuning": (result["base_test_fd"] if kind == "softmax" else
                                   before_fine_tuning(base_state, kind, args, classifier, reference)),
            "lr": lr, "lr_at_grid_edge": at_edge, "runs": [],
            "sweep": [{"lr": r["lr"], "validation_fd": r["validation_fd"][-1][1]} for r in sweep]}
    for seed in args.seeds:
        for kind in args.models:
            entry = result["models"][kind]
            entry["runs"].append(dg.run(kind, args, data, reference, classifier, lr=entry["lr"], seed=seed,
                                        steps=args.steps, sweep=False, **options[kind]))
    result["seconds"] = time.time() - start
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(result, f, indent=1)
    write_results(args, result)


if __name__ == "__main__":
    main()
