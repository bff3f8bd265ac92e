"""Golden projects: every ``fixtures/projects/<case>/`` converted as a user does, ``sdp-convert .``.

A case directory holds:

* ``input/``: a whole, real-looking project (several modules that import each other);
* ``expected/``: the files the conversion changes, as they should be (a file absent there must be
  left byte for byte alone);
* ``report.txt``: the report lines as the CLI prints them (``data.py:LINE:COL: [transform] ...``),
  paths relative to the project.

As in ``test_golden``: ``pytest --update-goldens`` rewrites ``expected/`` and ``report.txt`` where
they differ and still fails, listing them; every expected file compiles; and converting the
expected project again changes nothing.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "projects"
CASES = sorted(p for p in FIXTURES.iterdir() if p.is_dir()) if FIXTURES.is_dir() else []
IDS = [f"projects/{c.name}" for c in CASES]
_REPORT_LINE = re.compile(r"^\S+:\d+:\d+: \[")


def sources(tree: Path) -> dict[str, bytes]:
    """``{relative path: content}`` of the Python files under ``tree``."""
    return {
        p.relative_to(tree).as_posix(): p.read_bytes()
        for p in sorted(tree.rglob("*.py"))
        if "__pycache__" not in p.parts
    }


def sdp_convert(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sdp_convert", *args], cwd=cwd, capture_output=True, text=True,
        timeout=300,
    )


def report_of(done: subprocess.CompletedProcess[str]) -> str:
    lines = (done.stdout + done.stderr).splitlines()
    return "".join(line + "\n" for line in lines if _REPORT_LINE.match(line))


def expected_tree(case: Path, work: Path) -> Path:
    """The input project with the expected files in place."""
    tree = work / "expected_tree"
    shutil.copytree(case / "input", tree)
    for name, content in sources(case / "expected").items():
        (tree / name).write_bytes(content)
    return tree


def test_there_are_four_projects():
    assert len(CASES) >= 4


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_project(case: Path, tmp_path: Path, request: pytest.FixtureRequest):
    tree = tmp_path / "project"
    shutil.copytree(case / "input", tree)
    done = sdp_convert(tree, ".")
    assert done.returncode in (0, 1), done.stderr
    before, after = sources(case / "input"), sources(tree)
    changed = {name: content for name, content in after.items() if content != before[name]}
    report = report_of(done)

    if request.config.getoption("--update-goldens"):
        updated = []
        expected_dir = case / "expected"
        if sources(expected_dir) != changed:
            shutil.rmtree(expected_dir, ignore_errors=True)
            for name, content in changed.items():
                (expected_dir / name).parent.mkdir(parents=True, exist_ok=True)
                (expected_dir / name).write_bytes(content)
            updated.append(str(expected_dir))
        if not (case / "report.txt").exists() or (case / "report.txt").read_text() != report:
            (case / "report.txt").write_text(report)
            updated.append(str(case / "report.txt"))
        if updated:
            pytest.fail("updated (review with git diff): " + ", ".join(updated), pytrace=False)

    expected = sources(case / "expected")
    assert expected, f"{case}: the project converts to nothing"
    for name, content in expected.items():
        compile(content, str(case / "expected" / name), "exec")
        assert content != before[name], f"{case}/expected/{name} equals the input: delete it"
    assert sorted(changed) == sorted(expected), "other files changed than expected/ holds"
    for name, content in expected.items():
        assert after[name].decode() == content.decode(), f"{name} differs from expected/{name}"
    assert report == (case / "report.txt").read_text(), "report differs from report.txt"


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_converting_the_expected_project_again_changes_nothing(case: Path, tmp_path: Path):
    tree = expected_tree(case, tmp_path)
    done = sdp_convert(tree, "--check", ".")
    assert done.returncode == 0, done.stdout + done.stderr
