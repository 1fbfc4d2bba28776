"""Results in the caller's tensor type.

The extension returns ``_core.Buffer`` objects that speak the DLPack protocol;
each becomes a tensor of the same library as the caller's first argument,
sharing memory: ``torch.utils.dlpack.from_dlpack`` for torch, ``numpy.asarray``
for NumPy (writable, where ``numpy.from_dlpack`` would be read-only), and the
``from_dlpack`` of the argument's top-level module otherwise.
"""
import functools
import importlib

from . import _core


def _from_dlpack_of(obj):
    root = "numpy" if obj is None else type(obj).__module__.split(".")[0]
    if root == "numpy":
        try:
            import numpy
        except ImportError as error:  # the torch layers need no NumPy; these defaults do
            raise ModuleNotFoundError(
                "this mhla function returns a NumPy array unless given like=, and NumPy is not installed: "
                "install numpy, or pass like= a tensor of the kind wanted (e.g. like=torch.empty(0))") from error
        return numpy.asarray
    if root == "torch":
        import torch.utils.dlpack

        return torch.utils.dlpack.from_dlpack
    module = importlib.import_module(root)
    convert = getattr(module, "from_dlpack", None)
    if convert is None:
        raise TypeError(f"cannot return results as {type(obj).__name__}: module {root!r} has no from_dlpack")
    return convert


def to_kind_of(obj, result):
    """Converts Buffers in ``result`` (a Buffer, a tuple, or None) to ``obj``'s kind."""
    if isinstance(result, tuple):
        return tuple(to_kind_of(obj, r) for r in result)
    if isinstance(result, _core.Buffer):
        return _from_dlpack_of(obj)(result)
    return result


def like_input(function):
    """Wraps an extension function so that its results take the kind of its first argument."""

    @functools.wraps(function)
    def wrapper(first, *args, **kwargs):
        return to_kind_of(first, function(first, *args, **kwargs))

    return wrapper
