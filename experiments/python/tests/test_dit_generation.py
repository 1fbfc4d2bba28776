"""experiments/python/dit_generation.py: its Frechet distance, its model and its --quick form end to end."""
import gzip
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch


if importlib.util.find_spec("PIL") is None:
    pytest.skip("the generation example writes its sample grids with Pillow (torch 2.x environment)",
                allow_module_level=True)
if not os.path.isdir("/usr/share/datasets/fashion-mnist"):
    pytest.skip("Debian's fashion-mnist is not installed (the example's data)", allow_module_level=True)

EXAMPLES = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(EXAMPLES))
import dit_generation  # noqa: E402


def test_a_data_folder_without_the_dataset_is_refused_by_name(tmp_path):
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(b"")
    problem = dit_generation.fashion_mnist.folder_problem(str(tmp_path))
    assert problem.startswith(f"{tmp_path} lacks train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, "
                              "t10k-labels-idx1-ubyte.gz:")
    assert dit_generation.fashion_mnist.folder_problem(dit_generation.fashion_mnist.DATA) is None
    with pytest.raises(FileNotFoundError, match="lacks train-labels"):
        dit_generation.fashion_mnist.splits(str(tmp_path))
    # A file that is not the dataset's: named, not a numpy error from deep inside.
    with pytest.raises(ValueError, match=r"not an IDX file of unsigned bytes \(header missing, 0 bytes\)"):
        dit_generation.fashion_mnist.read_idx("train-images-idx3-ubyte.gz", str(tmp_path))
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(b"<html>")
    with pytest.raises(ValueError, match="train-images-idx3-ubyte.gz is not a gzip file"):
        dit_generation.fashion_mnist.read_idx("train-images-idx3-ubyte.gz", str(tmp_path))
    with gzip.open(tmp_path / "train-images-idx3-ubyte.gz", "wb") as f:
        f.write(bytes([0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 28, 0, 0, 0, 28]) + bytes(28 * 28))  # one image short
    with pytest.raises(ValueError, match=r"not an IDX file of unsigned bytes \(header 00000803, 800 bytes\)"):
        dit_generation.fashion_mnist.read_idx("train-images-idx3-ubyte.gz", str(tmp_path))
    # The command line refuses it before any work starts, naming the option and the folder.
    command = [sys.executable, str(EXAMPLES / "dit_generation.py"), "--quick", "--data", str(tmp_path / "none"),
               "--out", str(tmp_path / "out")]
    env = dict(os.environ)
    r = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and f"--data: {tmp_path / 'none'} lacks train-images-idx3-ubyte.gz" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "out").exists()


def test_frechet_distance_matches_the_closed_form_of_commuting_covariances():
    # Diagonal covariances commute: tr(C1 + C2 - 2 (C1 C2)^(1/2)) = sum (s1 - s2)^2 over the std devs.
    rng = np.random.default_rng(0)
    s1, s2 = rng.uniform(0.1, 2, 6), rng.uniform(0.1, 2, 6)
    m1, m2 = rng.normal(size=6), rng.normal(size=6)
    expected = ((m1 - m2) ** 2).sum() + ((s1 - s2) ** 2).sum()
    got = dit_generation.frechet_distance(m1, np.diag(s1 ** 2), m2, np.diag(s2 ** 2))
    assert got == pytest.approx(expected, rel=1e-10)
    # The same rotation of both distributions leaves the distance as it is.
    q, _ = np.linalg.qr(rng.normal(size=(6, 6)))
    rotated = dit_generation.frechet_distance(q @ m1, q @ np.diag(s1 ** 2) @ q.T, q @ m2, q @ np.diag(s2 ** 2) @ q.T)
    assert rotated == pytest.approx(expected, rel=1e-8)
    # Between one set of samples and itself: zero (up to rounding).
    f = rng.normal(size=(500, 8))
    assert abs(dit_generation.frechet_distance(*dit_generation.moments(f), *dit_generation.moments(f))) < 1e-9


def test_frechet_distance_of_a_non_commuting_pair_against_an_eigen_square_root():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(5, 5)), rng.normal(size=(5, 5))
    c1, c2 = a @ a.T, b @ b.T
    # (C1 C2)^(1/2) by the eigen decomposition of the (diagonalisable, positive-spectrum) product.
    values, vectors = np.linalg.eig(c1 @ c2)
    root = (vectors * np.sqrt(values)) @ np.linalg.inv(vectors)
    expected = np.trace(c1) + np.trace(c2) - 2 * np.trace(root).real
    assert dit_generation.frechet_distance(np.zeros(5), c1, np.zeros(5), c2) == pytest.approx(expected, rel=1e-8)


def test_rate_grid_widens_beyond_the_edge_the_best_rate_sits_on():
    def choice(target, lrs=(1e-3, 2e-3, 4e-3)):
        tried = []

        def validation_fd(lr):
            tried.append(lr)
            return (np.log2(lr) - np.log2(target)) ** 2

        best, grid, at_edge = dit_generation.widened_grid_choice(list(lrs), validation_fd)
        assert len(tried) == len(set(tried)) and sorted(tried) == grid  # every rate run once
        return best, grid, at_edge

    # Inside the given grid: nothing more is run.
    assert choice(2e-3) == (2e-3, [1e-3, 2e-3, 4e-3], False)
    # Two steps above the top: widened until a tried rate lies on either side.
    assert choice(1.6e-2) == (pytest.approx(1.6e-2), pytest.approx([1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2]), False)
    # Below the bottom: widened downwards.
    assert choice(4e-4) == (pytest.approx(5e-4), pytest.approx([2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3]), False)
    # Far beyond the top: three extensions, and the choice says it is still at the edge.
    best, grid, at_edge = choice(1.0)
    assert best == pytest.approx(3.2e-2) and len(grid) == 3 + dit_generation.MAX_EXTENSIONS and at_edge
    # One rate: no grid to widen.
    assert choice(1.0, lrs=(1e-3,)) == (1e-3, [1e-3], False)


@pytest.mark.parametrize("kind", dit_generation.MODELS)
def test_the_three_models_differ_only_in_their_attention(kind):
    torch.manual_seed(0)
    model = dit_generation.DiT(kind, width=32, depth=2, heads=2, patch=4, tile=(2, 2))
    x, t, y = torch.randn(3, 1, 28, 28), torch.rand(3), torch.tensor([0, 4, 9])
    assert model(x, t, y).shape == x.shape
    attention = model.blocks[0].attn
    blocks = {"softmax": None, "linear": 1, "mhla": 16}[kind]  # a 7 x 7 grid in 2 x 2 tiles: 4 x 4 blocks
    assert getattr(getattr(attention, "layout", None), "num_blocks", None) == blocks
    # Apart from MHLA's mixing logits (M x M per layer), the same parameters.
    shapes = sorted(tuple(p.shape) for name, p in model.named_parameters() if "mixing" not in name)
    softmax = dit_generation.DiT("softmax", width=32, depth=2, heads=2, patch=4, tile=(2, 2))
    assert shapes == sorted(tuple(p.shape) for p in softmax.parameters())


def test_quick_run_scores_every_model_and_continues_where_it_stopped(tmp_path):
    env = dict(os.environ)
    command = [sys.executable, str(EXAMPLES / "dit_generation.py"), "--quick", "--threads", "1", "--out", str(tmp_path)]
    r = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads((tmp_path / "results.json").read_text())
    for kind in dit_generation.MODELS:
        model = result["models"][kind]
        assert [run["seed"] for run in model["runs"]] == [0, 1]
        assert all(np.isfinite(run["test_fd"]) and run["test_fd"] > 0 for run in model["runs"])
        # The chosen rate is the sweep's best by validation FD; the results say whether it is at the grid's edge.
        sweep = model["sweep"]
        assert model["lr"] == min(sweep, key=lambda s: s["validation_fd"])["lr"]
        rates = [s["lr"] for s in sweep]
        assert rates == sorted(rates) and model["lr_at_grid_edge"] == (model["lr"] in (rates[0], rates[-1]))
        row = next(line for line in (tmp_path / "results.md").read_text().splitlines() if line.startswith(f"| {kind} |"))
        assert (f"| {model['lr']:g} (edge) |" in row) == model["lr_at_grid_edge"]
        assert (tmp_path / f"samples-{kind}.png").stat().st_size > 0
    assert "| mhla |" in (tmp_path / "results.md").read_text()
    # Run again: every run is read back, the results are the same.
    again = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "step " not in again.stdout and "read back" in again.stdout
    assert json.loads((tmp_path / "results.json").read_text())["models"] == result["models"]
    # With another setting, the saved runs are refused by name.
    changed = subprocess.run(command + ["--ema", "0.5"], capture_output=True, text=True, env=env, timeout=600)
    assert changed.returncode != 0 and "trained with other settings (ema 0.0 -> 0.5)" in changed.stderr
    # Scored with another feature classifier, their FDs are on another scale: refused, naming the classifier.
    saved = torch.load(tmp_path / "fd-classifier.pt")
    before = dit_generation.fingerprint(classifier_with(saved["state"]))
    saved["state"]["features.0.bias"] += 0.01  # the first convolution
    torch.save(saved, tmp_path / "fd-classifier.pt")
    after = dit_generation.fingerprint(classifier_with(saved["state"]))
    assert result["classifier"] == before != after
    other = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert other.returncode != 0 and f"(classifier {before} -> {after}): pass another --out, or the --classifier " \
                                     "it was scored with" in other.stderr


def classifier_with(state):
    model = dit_generation.Classifier()
    model.load_state_dict(state)
    return model
