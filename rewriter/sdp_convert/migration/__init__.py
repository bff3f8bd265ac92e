"""Migrating a script from another data-parallel library to sdp_runtime: the shared machinery.

``Migration`` points a library's imports at sdp_runtime (same names where the runtime has them),
rewrites what maps, and reports what it lacks and the library's usual mistakes (a missing
broadcast, a save on every rank, an unscaled learning rate). ``migrate_horovod`` and
``migrate_smddp`` are this class with their module tables.

By what it maps:

- ``common``: where an old module's names go (``Target``), the names the checks look for;
- ``horovod``: the runtime's Horovod Keras names, advice for the Horovod APIs it lacks;
- ``smddp``: SageMaker's torch.distributed fallbacks and variables;
- ``imports``: the rewriting of imports and names (``Migration``);
- ``checks``: the library's usual mistakes, reported once per file.
"""

from __future__ import annotations

from .common import Target, names
from .common import _dotted as _dotted  # migrate_smp builds names with it
from .horovod import ADVICE, RUNTIME_CALLBACK_NAMES, RUNTIME_KERAS_NAMES
from .imports import Migration
from .smddp import FALLBACK_NAMES

__all__ = [
    "ADVICE", "FALLBACK_NAMES", "RUNTIME_CALLBACK_NAMES", "RUNTIME_KERAS_NAMES", "Migration",
    "Target", "names",
]
