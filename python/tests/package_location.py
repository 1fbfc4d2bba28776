"""Where the tests import mhla from.

By default the build tree: $MHLA_PYTHON_PATH, else <repo>/build/python
(scripts/build.sh's output). With MHLA_TEST_INSTALLED=1 the installed package
(pip, a wheel): nothing is put on the path, and the package must come from
outside the source tree.
"""
import os
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[2]
INSTALLED = os.environ.get("MHLA_TEST_INSTALLED") == "1"
BUILT = None if INSTALLED else os.environ.get("MHLA_PYTHON_PATH", str(REPO / "build" / "python"))


def paths():
    """The directories to put first on sys.path / PYTHONPATH (none for the installed package)."""
    return [] if BUILT is None else [BUILT]


def subprocess_env(**extra):
    """os.environ with these directories first on PYTHONPATH (and the extra variables): for a child Python
    process that must import the same mhla as the tests."""
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join([*paths(), env.get("PYTHONPATH", "")])
    return env
