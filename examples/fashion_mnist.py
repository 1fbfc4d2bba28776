"""Fashion-MNIST for the examples, split as ``mhla train`` splits it.

The images come from the Debian package ``fashion-mnist`` (``/usr/share/datasets/fashion-mnist``).
The last 5,000 of the 60,000 training images are the validation split; the 10,000 test images are
the test split.
"""
import gzip
import os

import numpy as np

DATA = "/usr/share/datasets/fashion-mnist"
VALIDATION = 5000


def read_idx(name, folder=DATA):
    """One IDX file of the dataset as a uint8 array (images [n, 28, 28], labels [n])."""
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is missing: install Debian's fashion-mnist package or pass the folder "
                                "that holds the four *-ubyte.gz files")
    with gzip.open(path) as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def splits(folder=DATA):
    """``{"train", "validation", "test"}`` -> (images uint8 [n, 28, 28], labels uint8 [n])."""
    train_x, train_y = read_idx("train-images-idx3-ubyte.gz", folder), read_idx("train-labels-idx1-ubyte.gz", folder)
    test_x, test_y = read_idx("t10k-images-idx3-ubyte.gz", folder), read_idx("t10k-labels-idx1-ubyte.gz", folder)
    return {"train": (train_x[:-VALIDATION], train_y[:-VALIDATION]),
            "validation": (train_x[-VALIDATION:], train_y[-VALIDATION:]),
            "test": (test_x, test_y)}
