"""One OpenMP runtime per process: torch's, where torch is installed, whichever is imported first.

PyPI's torch carries its own GNU OpenMP runtime (``torch/lib/libgomp.so.1``) and loads it globally;
a wheel of this package carries another. Two runtimes in one process each keep a pool of workers
that spin after their parallel regions and take the cores from the other's next region: a torch
op and an mhla call in turn took twice as long as the two alone. The extension binds its OpenMP
symbols when it loads (``-z now``) and the global scope comes first, so loading torch's runtime
globally before the extension puts both on torch's pool, and ``torch.set_num_threads`` sets the
threads of both. Torch itself, imported later, finds that runtime loaded under its soname. Torch
builds without such a file (Debian's, conda's) and NumPy-only installs are left as they are.
"""
import ctypes
import importlib.util
import pathlib


def load_torch_runtime():
    """Loads torch's bundled libgomp globally, without importing torch; returns its path or None."""
    spec = importlib.util.find_spec("torch")
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        for runtime in sorted(pathlib.Path(location, "lib").glob("libgomp*.so*")):
            ctypes.CDLL(str(runtime), mode=ctypes.RTLD_GLOBAL)
            return runtime
    return None


TORCH_RUNTIME = load_torch_runtime()
