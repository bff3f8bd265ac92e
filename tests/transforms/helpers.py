"""Before/after checks for one transform (django-upgrade's ``check_transformed``/``check_noop``)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from sdp_convert.base import Options
from sdp_convert.engine import Result, convert


def run(source: str, only: str | None = None, **options: object) -> Result:
    """Convert ``source`` (dedented) with the pipeline, or just ``add_runtime_init`` + ``only``.

    A snippet that imports sdp_runtime (to keep it short) is looked at as the engine's fixed-point
    check does (``recheck``): the transforms run on it, where a user's run would leave it alone.
    """
    options.setdefault("recheck", True)
    # Each transform's own edits, as written: laying out long lines is the engine's
    # (tests/test_formatting.py, and every golden case).
    options.setdefault("line_length", 10_000)
    opts = Options(
        only=frozenset({only, "add_runtime_init"}) if only else frozenset(), **options  # type: ignore[arg-type]
    )
    return convert(textwrap.dedent(source), opts)


def check_transformed(before: str, after: str, only: str | None = None, **options: object) -> Result:
    result = run(before, only, **options)
    assert result.output.decode() == textwrap.dedent(after)
    return result


def check_noop(source: str, only: str | None = None, **options: object) -> Result:
    result = run(source, only, **options)
    assert result.output.decode() == textwrap.dedent(source)
    return result


def messages(result: Result, transform: str | None = None, manual: bool | None = None) -> list[str]:
    return [
        c.message
        for c in result.changes
        if (transform is None or c.transform == transform) and (manual is None or c.manual == manual)
    ]


#: A hand-converted TF2 script (a golden fixture): every TF transform must leave it alone.
TF_ALREADY_CONVERTED = (
    Path(__file__).resolve().parents[2] / "fixtures/tensorflow/already_converted/input.py"
)


def reported(result: Result, transform: str, manual: bool) -> list[tuple[int, str]]:
    """``(line, message)`` of what ``transform`` reported: its manual notes or its changes."""
    return [
        (c.line, c.message) for c in result.changes if c.transform == transform and c.manual == manual
    ]
