"""The package's version and where it was imported from."""
import importlib.metadata
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
