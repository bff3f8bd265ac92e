"""Running a list of named checks inside one spawned rank, so one launch serves many tests."""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def checks_in(namespace: Mapping[str, Any]) -> list[tuple[str, Callable[[], Any]]]:
    """The module's ``check_*`` functions, in the order they are defined, without the prefix."""
    return [(name.removeprefix("check_"), fn) for name, fn in namespace.items()
            if name.startswith("check_") and callable(fn)]


def run_checks(checks: Iterable[tuple[str, Callable[[], Any]]]) -> dict[str, str]:
    """Run each check; map its name to ``"ok"`` or the traceback of what it raised."""
    outcome: dict[str, str] = {}
    for name, check in checks:
        try:
            check()
            outcome[name] = "ok"
        except Exception:  # noqa: BLE001 (reported to the test, per check)
            outcome[name] = traceback.format_exc()
    return outcome


def expect_raises(error: type[BaseException], call: Callable[[], Any], contains: str = "") -> str:
    """Call ``call`` and fail unless it raises ``error`` (whose text contains ``contains``)."""
    try:
        call()
    except error as raised:
        assert contains in str(raised), f"{contains!r} not in {raised}"
        return str(raised)
    raise AssertionError(f"{call} did not raise {error.__name__}")
