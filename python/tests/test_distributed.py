"""mhla.distributed on 2 and 3 ranks (gloo on the CPU), launched with torch.distributed.run.

The checks run in distributed_checks.py on every rank; here each launch must exit 0.
"""
import pathlib
import subprocess
import sys

import package_location
import pytest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def launch(ranks, *args, script=HERE / "distributed_checks.py", timeout=300):
    env = package_location.subprocess_env(OMP_NUM_THREADS="1")
    # --redirects 1 --tee 1: Debian's torch 1.13 under Python 3.11 cannot parse
    # the default "0" (its enum lookup misses Std.NONE) and stops before starting.
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--redirects", "1",
                           "--tee", "1", f"--nproc_per_node={ranks}", str(script), *args],
                          capture_output=True, text=True, env=env, timeout=timeout)


@pytest.mark.parametrize("ranks", [2, 3])
def test_equals_one_process_on_the_whole_sequence(ranks):
    r = launch(ranks, "exact")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"exact: {ranks} ranks, 0 failures" in r.stdout


def test_a_problem_on_one_rank_is_raised_on_every_rank():
    r = launch(2, "faults")
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_layer_equals_mhla1d_on_the_whole_sequence():
    r = launch(2, "layer")
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_example_runs():
    r = launch(2, script=ROOT / "examples" / "context_parallel_torch.py")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "max |o - o_whole| =" in r.stdout
