"""Helpers that Horovod's test suites import from Horovod itself (test plumbing only).

``horovod.common.util.is_version_greater_equal_than``, ``horovod.tensorflow.util.
_executing_eagerly`` and ``horovod.runner.util.threads.in_thread``: the suites use them to pick
code paths and run helpers; no training script imports them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from packaging import version


def is_version_greater_equal_than(ver: str, target: str) -> bool:
    return version.parse(ver.replace("-tf", "+tf")) >= version.parse(target)


def _executing_eagerly() -> bool:
    import tensorflow as tf

    return tf.executing_eagerly()


def in_thread(target: Callable[..., Any], args: tuple[Any, ...] = (), name: str | None = None,
              daemon: bool = True, silent: bool = False) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, name=name, daemon=daemon)
    thread.start()
    return thread

