"""experiments/python/timm_conversion.py: bad data folders are refused before anything is written."""
import importlib.util
import pathlib
import subprocess
import sys

import pytest

if importlib.util.find_spec("timm") is None:
    pytest.skip("the experiment's model (timm: torch 2.x environment)", allow_module_level=True)

EXPERIMENT = pathlib.Path(__file__).resolve().parents[1] / "timm_conversion.py"


def test_a_data_folder_without_the_dataset_is_refused(tmp_path):
    command = [sys.executable, str(EXPERIMENT), "--data", str(tmp_path), "--out", str(tmp_path / "out")]
    r = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and f"--data: {tmp_path} lacks train-images-idx3-ubyte.gz" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "out").exists()
