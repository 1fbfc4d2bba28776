"""Fashion-MNIST for the examples, split as ``mhla-lab train`` splits it.

The images come from the Debian package ``fashion-mnist`` (``/usr/share/datasets/fashion-mnist``).
The last 5,000 of the 60,000 training images are the validation split; the 10,000 test images are
the test split.
"""
import gzip
import os

import numpy as np

DATA = "/usr/share/datasets/fashion-mnist"
FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
         "t10k-labels-idx1-ubyte.gz")
VALIDATION = 5000


def folder_problem(folder):
    """Why ``folder`` cannot serve as the dataset (the files it lacks), or None: for a command line's
    error message before any work starts."""
    missing = [name for name in FILES if not os.path.isfile(os.path.join(folder, name))]
    if not missing:
        return None
    return (f"{folder} lacks {', '.join(missing)}: install Debian's fashion-mnist package or give the folder "
            "that holds the four *-ubyte.gz files")


def read_idx(name, folder=DATA):
    """One IDX file of the dataset as a uint8 array (images [n, 28, 28], labels [n])."""
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        raise FileNotFoundError(folder_problem(folder) or f"{path} is missing")
    try:
        with gzip.open(path) as f:
            data = f.read()
    except (OSError, EOFError) as e:
        raise ValueError(f"{path} is not a gzip file ({e})") from None
    # The IDX header: two zero bytes, the element type (0x08: unsigned byte), the number of dimensions, then
    # each dimension as a big-endian 32-bit count.
    dims = data[3] if len(data) >= 4 else 0
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    if data[:3] != b"\0\0\x08" or dims == 0 or len(data) != 4 + 4 * dims + int(np.prod(shape)):
        raise ValueError(f"{path} is not an IDX file of unsigned bytes (header {data[:4].hex() or 'missing'}, "
                         f"{len(data)} bytes)")
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def splits(folder=DATA):
    """``{"train", "validation", "test"}`` -> (images uint8 [n, 28, 28], labels uint8 [n])."""
    if problem := folder_problem(folder):
        raise FileNotFoundError(problem)
    train_x, train_y, test_x, test_y = (read_idx(name, folder) for name in FILES)
    return {"train": (train_x[:-VALIDATION], train_y[:-VALIDATION]),
            "validation": (train_x[-VALIDATION:], train_y[-VALIDATION:]),
            "test": (test_x, test_y)}
