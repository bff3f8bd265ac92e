"""Test plumbing, not a product: ``horovod`` mapped onto ``sdp_runtime`` for Horovod's own tests.

``import horovod.torch as hvd`` gives exactly the module a migrated script gets after
``sdp-convert`` (``sdp_runtime.torch``), through the migration's own module table
(``sdp_convert.transforms.migrate_horovod.HOROVOD_MODULES``), so an API the runtime lacks shows up
as a failing Horovod test, never as something this shim papers over. The only other modules here
are the test suites' own helpers (``horovod.common.util``, ``horovod.tensorflow.util``,
``horovod.runner.util.threads``), which no training script imports.

Used by ``benchmarks/horovod_suites.py``; never installed, never imported by the project.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any

from sdp_convert.transforms.migrate_horovod import HOROVOD_MODULES

__version__ = "0.28.1"  # the Horovod release whose tests this shim runs

#: Horovod's own test helpers -> the plumbing module here that provides them.
_PLUMBING = {
    "horovod.common": "horovod._plumbing",
    "horovod.common.util": "horovod._plumbing",
    "horovod.tensorflow.util": "horovod._plumbing",
    "horovod.runner": "horovod._plumbing",
    "horovod.runner.util": "horovod._plumbing",
    "horovod.runner.util.threads": "horovod._plumbing",
}


class _Alias(importlib.abc.Loader):
    """Loads ``horovod.X`` as the already imported module ``target`` itself (no copy)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.module: ModuleType | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        self.module = importlib.import_module(self.target)
        self.spec = self.module.__spec__
        return self.module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.spec  # importlib stamped the alias's spec on it: put it back


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname in HOROVOD_MODULES:
            aim = HOROVOD_MODULES[fullname].module
        elif fullname in _PLUMBING:
            aim = _PLUMBING[fullname]
        else:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(aim), is_package=True)


sys.meta_path.insert(0, _Finder())
