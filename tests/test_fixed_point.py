"""The fixed-point check (``engine.convert``'s second pass over its own output, ``_check_once``).

The check first runs the transforms with a read-only walk and falls back to the real pass at the
first sign of a change (a hook returning another node, a statement edit, a missing import).
These tests inject transforms that are not idempotent, each changing its output again in one of
those ways, and show they are still caught as before; and that on golden fixtures the check
gives exactly the real second pass's verdict and report.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import libcst as cst
import pytest
from sdp_convert import engine
from sdp_convert.base import Options, Transform

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SOURCE = (FIXTURES / "torch" / "mnist_basic" / "input.py").read_bytes()
UNSTABLE = "not converted: converting the result again would change it"


class _Injected(Transform):
    DESCRIPTION = "A transform a test adds to the pipeline."
    FRAMEWORKS = frozenset({"torch"})


class BumpsIntegers(_Injected):
    """Not idempotent through a hook: every integer literal grows by one, every pass."""

    def leave_Integer(self, original_node: cst.Integer, updated_node: cst.Integer) -> cst.Integer:
        self.record(original_node, "bumped")
        return updated_node.with_changes(value=str(int(original_node.value) + 1))


class InsertsALine(_Injected):
    """Not idempotent through the edit plan: one more line after the first import, every pass."""

    def prepare(self, module: cst.Module) -> None:
        first = module.body[0]
        self.insert_after(first, cst.parse_statement("MARK = 1\n"))
        self.record(first, "inserted a line")


class ImportsByLength(_Injected):
    """Not idempotent through the imports only: it imports a module named after the length of
    the file, which its own import makes longer."""

    def prepare(self, module: cst.Module) -> None:
        self.add_import(f"mod{len(module.body)}")
        self.record(module.body[0], "imported")


class RebuildsNodes(_Injected):
    """Idempotent, but its hook returns a new node equal to the one it was given."""

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        return updated_node.with_changes()


class ImportsJson(_Injected):
    """Idempotent: the import it schedules is there after the first pass."""

    def prepare(self, module: cst.Module) -> None:
        self.add_import("json")
        self.record(module.body[0], "imported json")


def _passes(monkeypatch: pytest.MonkeyPatch, injected: type[Transform]) -> list[bool]:
    """Adds ``injected`` to the pipeline; the passes ``_convert_once`` makes, True where it is
    the check's read-only walk."""
    monkeypatch.setattr(engine, "PIPELINE", (*engine.PIPELINE, injected))
    real = engine._convert_once
    calls: list[bool] = []

    def counted(data: bytes, options: Options, *, probe: bool = False) -> engine.Result:
        calls.append(probe)
        return real(data, options, probe=probe)

    monkeypatch.setattr(engine, "_convert_once", counted)
    return calls


@pytest.mark.parametrize("injected", [BumpsIntegers, InsertsALine, ImportsByLength])
def test_a_transform_that_changes_its_own_output_again_leaves_the_file_alone(monkeypatch, injected):
    calls = _passes(monkeypatch, injected)
    result = engine.convert(SOURCE)
    assert result.output == SOURCE and not result.changed
    (note,) = result.changes
    assert note.manual and note.message.startswith(UNSTABLE)
    assert "(test_fixed_point)" in note.message  # the transform that would change it again
    assert calls == [False, True, False]  # the walk saw the change; the real pass confirmed it


@pytest.mark.parametrize(
    ("injected", "passes"),
    [
        # A new node, even an equal one, is a change to the walk: the real pass decides.
        (RebuildsNodes, [False, True, False]),
        # An import that is there already is no change: the walk's answer stands.
        (ImportsJson, [False, True]),
        # Nothing added: the walk proves the fixed point without the rebuilding pass.
        (_Injected, [False, True]),
    ],
)
def test_a_transform_that_finds_its_own_output_done_converts(monkeypatch, injected, passes):
    calls = _passes(monkeypatch, injected)
    result = engine.convert(SOURCE)
    assert result.changed and not any(c.message.startswith(UNSTABLE) for c in result.changes)
    assert calls == passes


#: Every eighth golden fixture (all of them, and the corpus, take a minute on a shared 2-core
#: machine: ``benchmarks/check_fixed_point.py`` compares those).
SAMPLE = sorted(p.parent for p in FIXTURES.glob("*/*/input.py"))[::8]


@pytest.mark.parametrize("case", SAMPLE, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_check_says_what_the_real_second_pass_says(case: Path):
    data = (case / "input.py").read_bytes()
    first = engine._convert_once(data, Options())
    if not first.changed:
        return
    output = engine.format_changed(data, first.output, Options().line_length)
    options = replace(Options(), recheck=first.info.origin == "vanilla")
    real, check = engine._convert_once(output, options), engine._check_once(output, options)
    assert (check.changed, check.output) == (real.changed, real.output)
    assert sorted({(c.transform, c.message, c.manual) for c in check.changes}) == sorted(
        {(c.transform, c.message, c.manual) for c in real.changes}
    )
