"""The transforms, in the order they run.

All of them run in one traversal (see ``engine``); the order decides which transform's
``leave_*`` hook sees a node first, and in which order statements inserted after the same
statement appear.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .transforms import (
    add_runtime_init,
)

if TYPE_CHECKING:
    from .base import Transform

PIPELINE: tuple[type[Transform], ...] = (
    # First: every other transform's output calls the runtime this one imports and initialises.
    add_runtime_init.AddRuntimeInit,
)


def transform_names() -> list[str]:
    return [t.NAME for t in PIPELINE]
