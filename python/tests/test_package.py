"""The package's version and where it was imported from."""
import importlib.metadata
import os
import pathlib
import re

import mhla
import package_location
import pytest


def test_version_is_the_cmake_project_version():
    cmake = (package_location.REPO / "CMakeLists.txt").read_text()
    assert mhla.__version__ == re.search(r"project\(mhla VERSION ([0-9.]+)", cmake).group(1)
    assert mhla.__version__ == mhla._core.__version__


@pytest.mark.skipif(not package_location.INSTALLED, reason="testing the build tree, not an installed package")
def test_installed_package_is_the_one_imported():
    package = pathlib.Path(mhla.__file__).resolve().parent
    assert package_location.REPO not in package.parents, f"mhla was imported from the source tree: {package}"
    assert importlib.metadata.version("mhla") == mhla.__version__
    assert next(package.glob("_core*.so"), None) is not None


@pytest.mark.skipif(os.environ.get("MHLA_TEST_REPAIRED_WHEEL") != "1", reason="testing a wheel that auditwheel repaired")
def test_the_repaired_wheel_loads_the_libraries_it_carries():
    # auditwheel copies Highway and the OpenMP runtime into mhla.libs (renamed with a hash) and points
    # the extension there, so that it imports where the system has neither; zlib, the C and C++
    # runtimes are the manylinux platform's. Read after import, from what this process has mapped.
    carried = pathlib.Path(mhla.__file__).resolve().parent.parent / "mhla.libs"
    mapped = {pathlib.Path(line.split()[-1]) for line in pathlib.Path("/proc/self/maps").read_text().splitlines()
              if line.count(" ") >= 5 and "/" in line}
    for library in ("libhwy", "libgomp"):
        from_wheel = [path for path in mapped if path.name.startswith(library + "-") and path.parent == carried]
        assert from_wheel, f"{library} is not loaded from {carried}: {sorted(str(p) for p in mapped)}"
    assert not any(path.name.startswith("libhwy") and path.parent != carried for path in mapped)
