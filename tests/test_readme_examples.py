"""The documented before/after of each transform is what the converter really does.

The examples moved from the README to the documentation site: ``docs/conversion/examples.md``
("Before and after, transform by transform"; each transform's generated page shows its example
too) has one ``## `name` `` section per transform: a ``diff`` block holding a whole script
(context lines start with a space, or are empty; removed lines ``-``, added lines ``+``; nothing
is left out), and optionally a
``text`` block quoting lines of the report for that script saved as ``train.py``. Each "before"
(context and ``-`` lines) is converted with that transform alone, as ``sdp-convert --only NAME``
does, and must give exactly the "after" (context and ``+`` lines) and report those lines.
"""

from __future__ import annotations

import io
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from sdp_convert.base import Options
from sdp_convert.cli import main
from sdp_convert.engine import convert
from sdp_convert.pipeline import transform_names

DOCS = Path(__file__).resolve().parent.parent / "docs"
EXAMPLES_PAGE = DOCS / "conversion" / "examples.md"
TITLE = "# Before and after, transform by transform"


@dataclass
class Example:
    name: str
    prose: str = ""
    diffs: list[str] = field(default_factory=list)
    reports: list[str] = field(default_factory=list)

    @property
    def diff(self) -> list[str]:
        assert len(self.diffs) == 1, (
            f"{self.name}: expected one ```diff block, found {len(self.diffs)}"
        )
        return self.diffs[0].split("\n")

    @property
    def before(self) -> str:
        return _side(self.diff, "-", self.name)

    @property
    def after(self) -> str:
        return _side(self.diff, "+", self.name)


def _side(lines: list[str], keep: str, name: str) -> str:
    out = []
    for line in lines:
        mark, text = line[:1], line[1:]
        if mark not in ("", " ", "-", "+"):
            raise AssertionError(f"{name}: diff line without ' ', '-' or '+': {line!r}")
        if mark in ("", " ", keep):
            out.append(text)
    return "".join(f"{line}\n" for line in out)


def _subsection(text: str) -> str:
    """The page after its title, up to the next heading of level 1 (outside code blocks)."""
    start = text.find(TITLE + "\n")
    if start < 0:
        return ""
    body = text[start + len(TITLE) + 1 :]
    in_code = False
    lines = []
    for line in body.split("\n"):
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and re.match(r"# ", line):
            break
        lines.append(line)
    return "\n".join(lines)


def parse(text: str) -> list[Example]:
    """The ``##`` sections of the page, with their prose and fenced blocks."""
    examples: list[Example] = []
    lines = _subsection(text).split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            examples.append(Example(line[3:].strip().strip("`")))
        elif line.startswith("```"):
            lang = line[3:].strip()
            end = lines.index("```", i + 1)
            block = "\n".join(lines[i + 1 : end])
            i = end
            if examples and lang == "diff":
                examples[-1].diffs.append(block)
            elif examples and lang == "text":
                examples[-1].reports.extend(block.split("\n"))
        elif examples and line.strip() and not examples[-1].diffs:
            examples[-1].prose += line + "\n"
        i += 1
    return examples


EXAMPLES = {ex.name: ex for ex in parse(EXAMPLES_PAGE.read_text(encoding="utf-8"))}


def test_every_transform_has_an_example_in_pipeline_order():
    assert list(EXAMPLES) == transform_names()


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_example(name):
    ex = EXAMPLES[name]
    assert name in transform_names(), f"example section for an unknown transform {name!r}"
    assert ex.prose.strip(), f"{name}: no line saying what the transform does"
    # "Runs after `guard_rank0_writes`" in the prose: the example shows both transforms.
    only = {name} | {n for n in re.findall(r"after `(\w+)`", ex.prose) if n in transform_names()}
    result = convert(ex.before, Options(only=frozenset(only)))
    assert result.output.decode() == ex.after
    reported = [c.format("train.py") for c in result.changes]
    assert result.changes and all(c.transform in only for c in result.changes)
    assert any(c.transform == name for c in result.changes)
    for line in ex.reports:
        assert line in reported, f"{name}: not reported: {line}\nreported:\n" + "\n".join(reported)
    if not result.changed:  # an example that changes nothing is there for its report
        assert ex.reports, f"{name}: unchanged, and no report line quoted"


def test_the_cli_gives_the_same(monkeypatch, capsys):
    """``sdp-convert --only NAME -`` (in process: a subprocess costs seconds) prints the same."""
    ex = EXAMPLES["guard_rank0_writes"]
    stdout = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    monkeypatch.setattr(
        sys, "stdin", io.TextIOWrapper(io.BytesIO(ex.before.encode()), encoding="utf-8")
    )
    monkeypatch.setattr(sys, "stdout", stdout)
    assert main(["--only", ex.name, "-"]) == 0
    stdout.flush()
    assert stdout.buffer.getvalue().decode() == ex.after
    stderr = capsys.readouterr().err
    assert f"[{ex.name}]" in stderr and "1 converted" in stderr


def test_the_transform_table_lists_every_transform_in_pipeline_order():
    """The "What the conversion does" table (docs/conversion/index.md): one row per transform,
    in the order ``sdp-convert --list-transforms`` prints them, each linking to the transform's
    generated page."""
    from sdp_convert.pipeline import PIPELINE

    page = (DOCS / "conversion" / "index.md").read_text()
    names = {t.NAME for t in PIPELINE}
    rows = [m.group(1) for m in re.finditer(
        r"^\| \[`([a-z_0-9]+)`\]\(\.\./transforms/\1\.md\) \| ", page, re.M)
        if m.group(1) in names]
    assert rows == [t.NAME for t in PIPELINE]
