"""Every file of this repository a documentation page cites exists: paths that start at a
top-level folder of the repository (``benchmarks/bench_audit.py``, ``tests/e2e/tf_probe.py``,
``docs/tutorial/train.py``), package paths (``sdp_runtime/tensorflow/bridge.py``) and benchmark or
test scripts named alone (``bench_long_files.py``, ``test_tf_sharding.py``). Paths of examples
(``train.py``, ``a/data.py``, ``/tmp/sdp-demo``) are not the repository's and are not checked;
links between pages are checked by ``mkdocs build --strict`` (tests/test_docs.py)."""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: The pages: the documentation, the README, and the benchmark results the site includes.
PAGES = sorted([*REPO.glob("docs/**/*.md"), REPO / "README.md",
                *REPO.glob("benchmarks/results/*.md")])
TOP = ("benchmarks", "tests", "fixtures", "runtime", "rewriter", "docs", ".ci")
PACKAGES = {"sdp_runtime": REPO / "runtime", "sdp_convert": REPO / "rewriter"}
# A path: folders, then a file with an extension (what the page's text, code or link names).
PATH = re.compile(r"(?<![\w./~$-])((?:[\w.-]+/)+[\w.-]+\.[A-Za-z]{1,5})(?![\w/])")
SCRIPT = re.compile(r"(?<![\w./-])((?:bench|test|fuzz|scan|profile)_\w+\.(?:py|sh))\b")
_SKIP = {".git", ".venv", "node_modules", "__pycache__", "site"}


@functools.cache
def _repository_names() -> set[str]:
    names = set()
    for _folder, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in _SKIP]
        names.update(files)
    return names


def cited(text: str) -> list[tuple[str, Path]]:
    """The repository files ``text`` cites, each with where it must be."""
    found = []
    for match in PATH.finditer(text):
        path = match[1]
        if text[max(match.start() - 2, 0):match.start()] == "](" or "<" in path:
            continue  # a link between pages (mkdocs checks it), or a placeholder
        first = path.split("/", 1)[0]
        if first in TOP:
            found.append((path, REPO / path))
        elif first in PACKAGES:
            found.append((path, PACKAGES[first] / path))
    return found


def test_the_rule_finds_citations_and_leaves_examples_alone():
    text = ("run `benchmarks/bench_x.py`, see [a page](../transforms/x.md), `a/data.py`, "
            "`/tmp/sdp-demo/train.py`, `sdp_runtime/torch/basics.py`, "
            "`fixtures/<kind>/<case>/input.py`")
    assert [p for p, _ in cited(text)] == ["benchmarks/bench_x.py", "sdp_runtime/torch/basics.py"]
    assert SCRIPT.findall("`bench_long_files.py` and test_cli.py, not my_bench_x.py") == [
        "bench_long_files.py", "test_cli.py"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_file_a_page_cites_exists(page):
    text = page.read_text(encoding="utf-8")
    missing = [path for path, where in cited(text) if not where.exists()]
    names = _repository_names()
    missing += [name for name in SCRIPT.findall(text) if name not in names]
    assert not missing, f"{page.relative_to(REPO)} cites files that are not in the repository"
