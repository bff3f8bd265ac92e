"""Horovod's API where sdp_runtime differs: process sets and the names it does not provide.

- ``global_process_set``: Horovod's set of all processes, the only one there is here. Every
  function that takes ``process_set=`` accepts it (and None); any other set is refused with
  :class:`NotProvidedError` instead of being quietly reduced over every process.
- A Horovod name the runtime does not provide (``hvd.join``, ``hvd.Adasum``, ``hvd.elastic``, ...)
  raises :class:`NotProvidedError` when it is looked up, naming it and saying what to do instead
  (the same advice ``sdp-convert`` gives in its report). It is an ``AttributeError``, so
  ``hasattr(hvd, "join")`` stays False, and a ``NotImplementedError``.

Framework-free: both ``sdp_runtime.torch`` and ``sdp_runtime.tensorflow`` use it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

from . import _comm
from ._advice import ADVICE, PROCESS_SETS
from ._types import NotProvidedError


def not_provided(module: str, horovod: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` that raises :class:`NotProvidedError` for Horovod's names.

    Arguments:
        module: the runtime module's name (``sdp_runtime.torch``).
        horovod: the Horovod module it stands for (``horovod.torch``), for the message.

    Example:
        >>> __getattr__ = not_provided(__name__, "horovod.torch")
    """

    def __getattr__(name: str) -> Any:
        advice = ADVICE.get(name)
        if advice is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        raise NotProvidedError(
            f"{horovod}.{name} is not provided by {module}: {advice} (see 'Migrating Horovod, "
            "SMDDP and SMP scripts' in the sdp-convert docs)"
        )

    return __getattr__


class _GlobalProcessSet:
    """Horovod's ``global_process_set``: every process of the job (the only set there is)."""

    process_set_id = 0
    ranks = None

    def size(self) -> int:
        return _comm.size()

    def rank(self) -> int:
        return _comm.rank()

    def included(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "global_process_set"


global_process_set = _GlobalProcessSet()


def check_process_set(process_set: Any, what: str) -> None:
    """Refuse a ``process_set=`` other than None / ``global_process_set`` (or one of all ranks).

    Example:
        >>> check_process_set(None, "allreduce")
    """
    if process_set is None or process_set is global_process_set:
        return
    ranks = getattr(process_set, "ranks", None)
    if ranks is not None and sorted(ranks) == list(range(_comm.size())):
        return
    refuse(f"{what}(process_set={process_set!r})", PROCESS_SETS)


def refuse(what: str, advice: str) -> NoReturn:
    """Raise :class:`NotProvidedError` for ``what`` with ``advice``.

    Example:
        >>> refuse("allreduce(op=Adasum)", ADVICE["Adasum"])
    """
    raise NotProvidedError(f"{what} is not provided by sdp_runtime: {advice}")
