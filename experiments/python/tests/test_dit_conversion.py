"""experiments/python/dit_conversion.py: the conversions keep the pretrained weights, and its --quick form end to end."""
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch


for package, why in (("PIL", "the example writes its sample grids with Pillow"), ("diffusers", "the example's model")):
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{why} ({package}: torch 2.x environment)", allow_module_level=True)
if not os.path.isdir("/usr/share/datasets/fashion-mnist"):
    pytest.skip("Debian's fashion-mnist is not installed (the example's data)", allow_module_level=True)

EXAMPLES = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(EXAMPLES))
import dit_conversion  # noqa: E402
from mhla.diffusers import MHLAAttnProcessor  # noqa: E402

SMALL = SimpleNamespace(heads=2, width=16, depth=2, patch=4, tile=(2, 2))


@pytest.mark.parametrize("kind, blocks", [("softmax", None), ("linear", 1), ("mhla", 16)])
def test_a_conversion_keeps_every_pretrained_weight(kind, blocks):
    torch.manual_seed(0)
    base = dit_conversion.DiffusersDiT(SMALL).state_dict()
    model = dit_conversion.converted(base, kind, SMALL)
    state = model.state_dict()
    for key, value in base.items():
        assert torch.equal(state[key], value), key
    added = sorted(key for key in state if key not in base)
    processor = model.transformer.transformer_blocks[0].attn1.processor
    if blocks is None:
        assert added == [] and not isinstance(processor, MHLAAttnProcessor)
    else:  # a 7 x 7 patch grid: one block over all of it, or 2 x 2 tiles (4 x 4 blocks)
        assert added == [f"transformer.transformer_blocks.{i}.attn1.processor.mixing.logits" for i in range(2)]
        assert processor.layout.num_blocks == blocks
    x, t, y = torch.randn(3, 1, 28, 28), torch.rand(3), torch.tensor([0, 4, 9])
    assert model(x, t, y).shape == x.shape


def test_quick_run_reports_every_conversion_before_and_after_and_continues(tmp_path):
    env = dict(os.environ)
    command = [sys.executable, str(EXAMPLES / "dit_conversion.py"), "--quick", "--threads", "1", "--out", str(tmp_path)]
    r = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads((tmp_path / "results.json").read_text())
    table = (tmp_path / "results.md").read_text()
    assert result["models"]["softmax"]["before_fine_tuning"] == result["base_test_fd"]
    for kind in ("softmax", "linear", "mhla"):
        model = result["models"][kind]
        assert [run["seed"] for run in model["runs"]] == [0, 1]
        assert all(np.isfinite(run["test_fd"]) for run in model["runs"]) and np.isfinite(model["before_fine_tuning"])
        assert model["lr"] == min(model["sweep"], key=lambda s: s["validation_fd"])["lr"]
        assert f"| {kind} | {model['before_fine_tuning']:.2f} |" in table
    assert "MHLA minus linear after fine-tuning, paired by seed" in table
    again = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "step " not in again.stdout and "base softmax model: read back" in again.stdout
    assert json.loads((tmp_path / "results.json").read_text())["models"] == result["models"]
