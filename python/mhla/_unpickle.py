"""What pickle calls to rebuild the extension's objects.

``Layout`` and the C++ ``Decoder`` reduce to one of these functions and its
arguments. They are Python functions because pickle cannot name a function of
the extension module, and a reduction to a function (rather than
``__getstate__``/``__setstate__``) is what every pickle protocol, 0 and 1
included, can rebuild.
"""
from . import _core


def layout(rank, grid, tile):
    """A Layout from its rank, (T, H, W) extents and tile; lower ranks have leading 1s."""
    if rank == 1:
        return _core.Layout.sequence(grid[2], tile[2])
    if rank == 2:
        return _core.Layout.grid2d(grid[1], grid[2], tile[1], tile[2])
    return _core.Layout.grid3d(*grid, *tile)


def decoder(snapshot):
    return _core.Decoder.deserialize(snapshot, source="pickled mhla.Decoder")
