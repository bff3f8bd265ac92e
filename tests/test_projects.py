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
    """``{relative path: content}`` of the Python files and notebooks under ``tree``."""
    return {
        p.relative_to(tree).as_posix(): p.read_bytes()
        for p in sorted(tree.rglob("*"))
        if p.suffix in (".py", ".ipynb") and "__pycache__" not in p.parts
        and ".ipynb_checkpoints" not in p.parts
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
    # A project the converter cannot do safely is left alone, with what to do (the contract).
    assert expected or "(manual)" in report, f"{case}: the project converts to nothing"
    for name, content in expected.items():
        if name.endswith(".py"):
            compile(content, str(case / "expected" / name), "exec")
        assert content != before[name], f"{case}/expected/{name} equals the input: delete it"
    assert sorted(changed) == sorted(expected), "other files changed than expected/ holds"
    for name, content in expected.items():
        assert after[name].decode() == content.decode(), f"{name} differs from expected/{name}"
    assert report == (case / "report.txt").read_text(), "report differs from report.txt"


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_converting_the_expected_project_again_changes_nothing(case: Path, tmp_path: Path):
    tree = expected_tree(case, tmp_path)
    # Markers of manual notes fail --check by design (they are what is left to do): allowed
    # here, where the question is whether anything would change.
    done = sdp_convert(tree, "--check", "--allow-manual-markers", ".")
    assert done.returncode == 0, done.stdout + done.stderr


TORCH = FIXTURES / "torch_main_data_model"


def test_diff_shows_every_touched_file_and_check_fails_writing_nothing(tmp_path: Path):
    tree = tmp_path / "project"
    shutil.copytree(TORCH / "input", tree)
    done = sdp_convert(tree, "--check", "--diff", ".")
    assert done.returncode == 1
    assert "--- a/data.py\n+++ b/data.py\n" in done.stdout
    assert "--- a/main.py\n+++ b/main.py\n" in done.stdout
    assert "model.py" not in done.stdout
    assert sources(tree) == sources(TORCH / "input")
    assert "data.py:19:20: [shard_dataloader] give train_loader a DistributedSampler" in done.stderr
    assert "(used by main.py:39)" in done.stderr


def test_files_given_together_are_one_project_as_pre_commit_passes_them(tmp_path: Path):
    tree = tmp_path / "project"
    shutil.copytree(TORCH / "input", tree)
    done = sdp_convert(tree, "main.py", "data.py", "model.py")
    assert done.returncode == 0, done.stderr
    for name, content in sources(TORCH / "expected").items():
        assert (tree / name).read_bytes() == content


def test_a_file_given_alone_reads_its_neighbours_and_writes_only_itself(tmp_path: Path):
    tree = tmp_path / "project"
    shutil.copytree(TORCH / "input", tree)
    # The data module alone: its loader feeds main.py's training loop, so it is sharded, and it
    # still works for main.py as it is (no init there: the sampler DataLoader would make).
    done = sdp_convert(tree, "data.py")
    assert done.returncode == 0, done.stderr
    assert (tree / "data.py").read_bytes() == (TORCH / "expected" / "data.py").read_bytes()
    assert (tree / "main.py").read_bytes() == (TORCH / "input" / "main.py").read_bytes()
    # Then the script alone: its loaders are sharded where they are built now.
    done = sdp_convert(tree, "main.py")
    assert done.returncode == 0, done.stderr
    assert (tree / "main.py").read_bytes() == (TORCH / "expected" / "main.py").read_bytes()


def test_the_script_alone_does_not_scale_for_data_left_whole(tmp_path: Path):
    tree = tmp_path / "project"
    shutil.copytree(TORCH / "input", tree)
    done = sdp_convert(tree, "main.py")
    assert done.returncode == 0, done.stderr
    text = (tree / "main.py").read_text()
    # (Its manual notes, written as comments, do say "scale it by sdp.size()": code only here.)
    code = "".join(ln for ln in text.splitlines(keepends=True) if not ln.lstrip().startswith("#"))
    assert "sdp.size()" not in code and "set_epoch" not in code
    assert "# sdp-convert: manual - " in text
    assert "main.py:39:33: [shard_dataloader] (manual) data.get_loaders() returns a loader built " \
        "in data.py:19" in done.stderr
    assert (tree / "data.py").read_bytes() == (TORCH / "input" / "data.py").read_bytes()


# The projects page of the documentation site (moved there from the README).
PROJECTS_PAGE = Path(__file__).resolve().parent.parent / "docs" / "projects.md"


def test_the_documented_project_example_is_what_the_converter_does(tmp_path: Path):
    text = PROJECTS_PAGE.read_text()
    section = text.split("# Projects: several modules, one program", 1)[1].split("\n## ", 1)[0]
    diff = section.split("```diff\n", 1)[1].split("```", 1)[0]
    quoted = section.split("```text\n", 1)[1].split("```", 1)[0].splitlines()
    files: dict[str, tuple[list[str], list[str]]] = {}
    current: tuple[list[str], list[str]] = ([], [])
    for line in diff.splitlines():
        if line.startswith("--- a/"):
            current = files.setdefault(line[len("--- a/"):], ([], []))
        elif line.startswith(("+++ ", "@@")):
            continue
        elif line.startswith("-"):
            current[0].append(line[1:])
        elif line.startswith("+"):
            current[1].append(line[1:])
        else:
            current[0].append(line[1:])
            current[1].append(line[1:])
    assert sorted(files) == ["data.py", "train.py"]
    for name, (before, _) in files.items():
        (tmp_path / name).write_text("\n".join(before) + "\n")
    done = sdp_convert(tmp_path, ".")
    assert done.returncode == 0, done.stderr
    for name, (_, after) in files.items():
        assert (tmp_path / name).read_text() == "\n".join(after) + "\n", name
    for line in quoted:
        assert line in done.stderr.splitlines()


def test_imports_are_found_at_any_depth_in_ast_walk_order():
    """``modules._statements`` (statements only) finds the imports ``ast.walk`` finds, in the
    same order: the order of a module's project imports is the order of what it reports."""
    import ast

    from sdp_convert.modules import _statements

    source = (
        "import a\ntry:\n import b\nexcept E:\n import c\nelse:\n import d\nfinally:\n import e\n"
        "match x:\n case 1:\n  import f\nwith g:\n import h\nclass C:\n def m(self):\n  import i\n"
        "async def k():\n async with x:\n  import l\n async for y in z:\n  pass\n else:\n"
        "  import m\nwhile 1:\n import n\nelse:\n import o\n"
        "try:\n import p\nexcept* E:\n import q\n"
        "if t:\n from . import r\nelif u:\n from .s import t\nf = lambda: __import__('u')\n"
    )
    imports = (ast.Import, ast.ImportFrom)
    tree = ast.parse(source)
    found = [n for n in _statements(tree) if isinstance(n, imports)]
    assert found == [n for n in ast.walk(tree) if isinstance(n, imports)]
    assert len(found) == 16
