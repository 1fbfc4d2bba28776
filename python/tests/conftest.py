"""Puts the package under test first on the path (see package_location.py)."""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # package_location

import package_location  # noqa: E402

for _path in package_location.paths():
    if _path not in sys.path:
        sys.path.insert(0, _path)

try:
    import mhla  # noqa: F401,E402
except ImportError as error:  # a clear message instead of one failure per test file
    where = "installed" if package_location.INSTALLED else f"built in {package_location.BUILT} (run scripts/build.sh)"
    raise ImportError(f"the mhla package is not {where}: {error}") from error
