"""A stand-in for TensorFlow 1.x's `tensorflow.examples.tutorials.mnist.input_data`, which
TensorFlow 2 no longer has: `read_data_sets(directory, one_hot=True)` reads the four MNIST
files in their idx .gz form from `directory` (as FfDL's examples keep them in DATA_DIR) and
gives `.train.next_batch(n)`, `.test.images` and `.test.labels` as input_data did.
NumPy only; nothing is downloaded."""

import gzip
import os

import numpy as np

FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


def _idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


class DataSet:
    def __init__(self, images, labels, one_hot):
        self.images = images.reshape(len(images), -1).astype(np.float32) / 255.0
        self.labels = np.eye(10, dtype=np.float32)[labels] if one_hot else labels
        self._next = 0

    def next_batch(self, size):
        if self._next + size > len(self.images):
            order = np.random.permutation(len(self.images))
            self.images, self.labels = self.images[order], self.labels[order]
            self._next = 0
        start, self._next = self._next, self._next + size
        return self.images[start : self._next], self.labels[start : self._next]


class DataSets:
    def __init__(self, train, test):
        self.train, self.test = train, test


def read_data_sets(directory, one_hot=False):
    sets = {
        name: DataSet(
            _idx(os.path.join(directory, images)), _idx(os.path.join(directory, labels)), one_hot
        )
        for name, (images, labels) in FILES.items()
    }
    return DataSets(sets["train"], sets["test"])
