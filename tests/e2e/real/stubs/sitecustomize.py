"""Put on PYTHONPATH by tests/e2e/test_real_scripts.py, in front of ``tests/e2e/audit``.

Runs the audit (``tests/e2e/audit/sitecustomize.py``: who writes which file), and:

* replaces dataset downloads with small synthetic data: ``keras.datasets.{mnist,fashion_mnist,
  cifar10}.load_data`` and ``torchvision.datasets.{MNIST,FashionMNIST,CIFAR10}`` (a minimal
  ``torchvision`` from ``fake_packages/`` when the real one is not installed; the real one's
  dataset classes are replaced when it is). ``SDP_REAL_SAMPLES`` training samples (default 256),
  a quarter of that for test splits, the same on every run;
* counts optimizer steps per process (torch: a global step hook; Keras: ``optimizer.iterations``
  of every optimizer made) and writes ``steps.<pid>.json`` (``{"rank": ..., "steps": n}``) to
  ``SDP_E2E_AUDIT`` at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.machinery
import importlib.util
import json
import os
import sys
import weakref

_HERE = os.path.dirname(os.path.abspath(__file__))
_AUDIT = os.path.join(os.path.dirname(os.path.dirname(_HERE)), "audit", "sitecustomize.py")
with open(_AUDIT) as _f:
    exec(compile(_f.read(), _AUDIT, "exec"), {"__name__": "_sdp_e2e_audit"})

_LOG_DIR = os.environ.get("SDP_E2E_AUDIT")
SAMPLES = int(os.environ.get("SDP_REAL_SAMPLES", "256"))


def synthetic_images(train: bool, shape: tuple[int, ...], classes: int = 10):  # type: ignore[no-untyped-def]
    import numpy as np

    n = SAMPLES if train else max(SAMPLES // 4, 1)
    rng = np.random.RandomState(1 if train else 2)
    labels = rng.randint(0, classes, size=n).astype("uint8")
    images = rng.randint(0, 256, size=(n, *shape)).astype("uint8")
    # a learnable signal: each class brightens its own band of rows
    band = max(shape[0] // classes, 1)
    for i, label in enumerate(labels):
        images[i, label * band:(label + 1) * band] = 255
    return images, labels


def _keras_loader(shape: tuple[int, ...]):  # type: ignore[no-untyped-def]
    def load_data(*args, **kwargs):  # type: ignore[no-untyped-def]
        train, test = synthetic_images(True, shape), synthetic_images(False, shape)
        if len(shape) == 3:  # cifar10: labels as (n, 1)
            train = (train[0], train[1].reshape(-1, 1))
            test = (test[0], test[1].reshape(-1, 1))
        return train, test

    return load_data


def _patch_keras(module, shape):  # type: ignore[no-untyped-def]
    module.load_data = _keras_loader(shape)


def _patch_torchvision_datasets(module):  # type: ignore[no-untyped-def]
    fake = os.path.join(_HERE, "fake_packages", "torchvision", "datasets.py")
    spec = importlib.util.spec_from_file_location("_sdp_fake_tv_datasets", fake)
    assert spec is not None and spec.loader is not None
    synthetic = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(synthetic)
    for name in ("MNIST", "FashionMNIST", "CIFAR10"):
        setattr(module, name, getattr(synthetic, name))


_optimizers: list = []
_torch_steps = [0]


def _count_torch_steps(module):  # type: ignore[no-untyped-def]
    def hook(optimizer, args, kwargs):  # type: ignore[no-untyped-def]
        _torch_steps[0] += 1

    module.register_optimizer_step_post_hook(hook)


def _track_keras_optimizers(module):  # type: ignore[no-untyped-def]
    cls = module.BaseOptimizer
    init = cls.__init__

    def tracked(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        init(self, *args, **kwargs)
        _optimizers.append(weakref.ref(self))

    cls.__init__ = tracked


_WRAPPERS = {
    "keras.datasets.mnist": lambda m: _patch_keras(m, (28, 28)),
    "keras.datasets.fashion_mnist": lambda m: _patch_keras(m, (28, 28)),
    "keras.datasets.cifar10": lambda m: _patch_keras(m, (32, 32, 3)),
    "torchvision.datasets": _patch_torchvision_datasets,
    "torch.optim.optimizer": _count_torch_steps,
    "keras.src.optimizers.base_optimizer": _track_keras_optimizers,
}


class _WrapOnImport:
    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        wrap = _WRAPPERS.get(name)
        if wrap is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_wrap(module):  # type: ignore[no-untyped-def]
            exec_module(module)
            wrap(module)

        spec.loader.exec_module = exec_and_wrap  # type: ignore[method-assign]
        return spec


def _keras_steps() -> int:
    total = 0
    for ref in _optimizers:
        optimizer = ref()
        iterations = getattr(optimizer, "iterations", None) if optimizer is not None else None
        if iterations is not None:
            with contextlib.suppress(Exception):  # a half-built optimizer at exit
                total += int(iterations.numpy())
    return total


def _report() -> None:
    steps = _torch_steps[0] + _keras_steps()
    if _LOG_DIR and (steps or _optimizers or _torch_steps[0]):
        path = os.path.join(_LOG_DIR, f"steps.{os.getpid()}.json")
        with open(path, "w") as f:
            json.dump({"rank": os.environ.get("RANK", "-"), "steps": steps}, f)


sys.meta_path.insert(0, _WrapOnImport())
sys.path.append(os.path.join(_HERE, "fake_packages"))  # a real torchvision comes first
atexit.register(_report)
