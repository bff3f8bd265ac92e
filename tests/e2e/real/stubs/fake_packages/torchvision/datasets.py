"""Synthetic MNIST / FashionMNIST / CIFAR10 with torchvision's constructor signature."""

from __future__ import annotations

import os

import numpy as np

SAMPLES = int(os.environ.get("SDP_REAL_SAMPLES", "256"))


class _Synthetic:
    shape: tuple[int, ...] = (28, 28)
    classes = ("0", "1", "2", "3", "4", "5", "6", "7", "8", "9")

    def __init__(self, root, train=True, download=False, transform=None, target_transform=None):
        n = SAMPLES if train else max(SAMPLES // 4, 1)
        rng = np.random.RandomState(1 if train else 2)
        self.targets = rng.randint(0, 10, size=n).tolist()
        self.data = rng.randint(0, 256, size=(n, *self.shape)).astype("uint8")
        band = max(self.shape[0] // 10, 1)
        for i, label in enumerate(self.targets):
            self.data[i, label * band:(label + 1) * band] = 255
        self.transform, self.target_transform = transform, target_transform

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index):
        image, target = self.data[index], self.targets[index]
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target


class MNIST(_Synthetic):
    pass


class FashionMNIST(_Synthetic):
    pass


class CIFAR10(_Synthetic):
    shape = (32, 32, 3)
