"""A minimal stand-in for torchvision (not installed here): synthetic datasets, the transforms
the example scripts use, and ``utils.save_image``. Only on the e2e tests' path, after any real
torchvision."""

from . import datasets, transforms, utils

__all__ = ["datasets", "transforms", "utils"]
__version__ = "0.0+sdp-e2e-stub"
