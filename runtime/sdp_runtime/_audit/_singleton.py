"""One state per process for a framework's audit hooks, made by the first hook that needs it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Singleton(Generic[T]):
    """``get(rec)`` makes the state once (``make(rec)``) and adds ``end`` to the recorder's end
    record; ``get.current()`` is the state, or None when no hook ever made it.

    Example:
        >>> _get = Singleton(_State, lambda record: _end(record))
        >>> state = _get(rec)
    """

    def __init__(self, make: Callable[[Any], T], end: Callable[[dict[str, Any]], None]):
        self.make = make
        self.end = end
        self.value: T | None = None

    def __call__(self, rec: Any) -> T:
        if self.value is None:
            self.value = self.make(rec)
            rec.end_parts.append(self.end)
        return self.value

    def current(self) -> T | None:
        return self.value
