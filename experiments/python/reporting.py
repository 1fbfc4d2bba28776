"""What the examples share when they report: the mean and spread over seeds, accuracy in batches,
and curves drawn by gnuplot."""
import math
import os
import shutil
import subprocess

import torch


def mean_std(values):
    """The mean and the sample standard deviation (None for a single value)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def mean_pm(values, digits=2, signed=False):
    """``mean ± std`` as text, or the mean alone for a single value."""
    mean, std = mean_std(values)
    text = f"{mean:{'+' if signed else ''}.{digits}f}"
    return text if std is None else f"{text} ± {std:.{digits}f}"


@torch.no_grad()
def accuracy(model, split, batch=1000, device=None):
    """Top-1 accuracy of ``model`` on ``split = (x, y)``, ``batch`` inputs at a time (moved to
    ``device`` where given)."""
    model.eval()
    x, y = split
    correct = 0
    for i in range(0, len(x), batch):
        inputs = x[i:i + batch] if device is None else x[i:i + batch].to(device)
        correct += (model(inputs).argmax(-1).cpu() == y[i:i + batch]).sum().item()
    return correct / len(x)


def plot_curves(path, curves, *, xlabel, ylabel, title, key=None):
    """``curves`` (``{name: [(x, y), ...]}``) as lines with points in the PNG at ``path``; returns the
    file's name, or None where gnuplot is not installed."""
    if shutil.which("gnuplot") is None:
        return None
    folder = os.path.dirname(os.path.abspath(path))
    data = [os.path.join(folder, f".curve-{i}.dat") for i in range(len(curves))]
    plots = []
    for file, (name, points) in zip(data, curves.items()):
        with open(file, "w") as f:
            f.writelines(f"{x} {y}\n" for x, y in points)
        plots.append(f"'{file}' using 1:2 with linespoints title '{name}'")
    script = (f"set terminal pngcairo size 900,560\nset output '{path}'\nset grid\n"
              + (f"set key {key}\n" if key else "")
              + f"set xlabel '{xlabel}'\nset ylabel '{ylabel}'\nset title '{title}'\nplot " + ", ".join(plots) + "\n")
    try:
        subprocess.run(["gnuplot"], input=script, text=True, check=True)
    finally:
        for file in data:
            os.remove(file)
    return os.path.basename(path)
