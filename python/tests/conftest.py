"""Finds the built package: $MHLA_PYTHON_PATH, else <repo>/build/python (scripts/build.sh's output)."""
import os
import pathlib
import sys

_built = os.environ.get("MHLA_PYTHON_PATH", str(pathlib.Path(__file__).resolve().parents[2] / "build" / "python"))
if _built not in sys.path:
    sys.path.insert(0, _built)
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # spec_reference

try:
    import mhla  # noqa: F401
except ImportError as error:  # a clear message instead of one failure per test file
    raise ImportError(f"the mhla package is not built in {_built} (run scripts/build.sh): {error}") from error
