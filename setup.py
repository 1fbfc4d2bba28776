"""Builds the extension module mhla._core with CMake for pyproject.toml's build.

The version is the one of CMakeLists.txt's project() call, so the C++ library,
the wheel's metadata and ``mhla.__version__`` agree. The build is portable by
default (``-DMHLA_NATIVE=OFF``: the SIMD kernels still pick the CPU's best
instruction set at run time); ``MHLA_CMAKE_ARGS`` adds CMake arguments, e.g.
``MHLA_CMAKE_ARGS=-DMHLA_NATIVE=ON`` for a build tuned to this machine.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def project_version():
    match = re.search(r"project\(mhla VERSION ([0-9]+\.[0-9]+\.[0-9]+)", (ROOT / "CMakeLists.txt").read_text())
    if match is None:
        raise RuntimeError("CMakeLists.txt has no `project(mhla VERSION x.y.z ...)`")
    return match.group(1)


class CMakeBuild(build_ext):
    """Configures the project for this interpreter and builds only the extension target."""

    def build_extension(self, ext):
        build_dir = Path(self.build_temp).resolve() / "cmake"
        configure = [
            "cmake", "-S", str(ROOT), "-B", str(build_dir),
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DPython_EXECUTABLE={sys.executable}",
            "-DMHLA_NATIVE=OFF", "-DMHLA_BUILD_TESTS=OFF", "-DMHLA_BUILD_BENCH=OFF",
            *shlex.split(os.environ.get("MHLA_CMAKE_ARGS", "")),
        ]
        subprocess.run(configure, check=True)
        jobs = str(self.parallel or os.cpu_count() or 1)
        subprocess.run(["cmake", "--build", str(build_dir), "--target", "mhla_python_core", "-j", jobs],
                       check=True)
        built = build_dir / "python" / "mhla" / Path(self.get_ext_filename(ext.name)).name
        if not built.exists():
            raise RuntimeError(f"CMake did not produce {built}")
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, target)


# Apart from the CMake build tree (build/), which the wheel build does not touch; the
# package's metadata (mhla.egg-info) goes there too, not into the source tree.
BUILD_BASE = "build/python-package"
(ROOT / BUILD_BASE).mkdir(parents=True, exist_ok=True)

setup(
    version=project_version(),
    ext_modules=[Extension("mhla._core", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    options={"build": {"build_base": BUILD_BASE}, "egg_info": {"egg_base": BUILD_BASE}},
)
