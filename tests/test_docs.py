"""The documentation site builds without a warning, and what must not drift is generated.

``mkdocs build --strict`` (mkdocs.yml: links and anchors between pages checked, the runtime API
read from its docstrings by mkdocstrings, benchmark results included from benchmarks/results/) is
run once, as CI runs it; the tests then read the built site.
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sdp_convert.pipeline import PIPELINE

REPO = Path(__file__).resolve().parents[1]
BUILD_LIMIT_S = 240  # about 10 s on an idle 2-core machine

pytestmark = pytest.mark.slow


def _squash(text: str) -> str:
    """Text without whitespace and Markdown's inline marks, to compare source with HTML."""
    return re.sub(r"[\s`*|\[\]]", "", text)


def _text(page: Path) -> str:
    """The visible text of a built page's article, squashed."""
    raw = page.read_text(encoding="utf-8")
    article = raw[raw.find("<article"): raw.find("</article>")]
    return _squash(html.unescape(re.sub(r"<[^>]+>", " ", article)))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
            cwd=REPO, capture_output=True, text=True, timeout=BUILD_LIMIT_S, env=env,
        )
    except subprocess.TimeoutExpired:  # subprocess.run has killed it
        pytest.fail(f"mkdocs build --strict took more than {BUILD_LIMIT_S} s")
    assert done.returncode == 0, done.stderr[-5000:]
    assert "WARNING" not in done.stderr, done.stderr[-5000:]
    return out


def test_every_transform_has_its_generated_page(site: Path):
    for cls in PIPELINE:
        page = site / "transforms" / cls.NAME / "index.html"
        assert page.is_file(), cls.NAME
        text = _text(page)
        assert _squash(cls.DESCRIPTION) in text, cls.NAME
        # The module docstring's summary line, and the example tests/test_readme_examples.py runs.
        doc = sys.modules[cls.__module__].__doc__ or ""
        assert _squash(doc.strip().splitlines()[0]) in text, cls.NAME
        assert "Example" in text and _squash(f"sdp-convert --only {cls.NAME}") in text, cls.NAME


def test_a_transform_page_shows_its_fixtures_reports_and_diffs(site: Path):
    text = _text(site / "transforms" / "shard_dataloader" / "index.html")
    # fixtures/torch/mnist_basic/report.txt and its expected.py, as they are in the repository.
    report = (REPO / "fixtures/torch/mnist_basic/report.txt").read_text().splitlines()
    line = next(ln for ln in report if "[shard_dataloader]" in ln)
    assert "torch/mnist_basic" in text and _squash(line) in text
    assert _squash("+train_sampler = torch.utils.data.distributed.DistributedSampler(") in text
    assert "(project)" in text  # a project fixture's per-file diff


def test_the_runtime_api_comes_from_the_docstrings(site: Path):
    import sdp_runtime.torch as sdp

    text = _text(site / "api" / "torch" / "index.html")
    assert _squash(sdp.init.__doc__.splitlines()[0]) in text
    assert "sdp_runtime.torch.distributed" in text and "NotInitializedError" in text
    assert "shard" in _text(site / "api" / "tensorflow" / "index.html")


def test_benchmark_results_are_included_not_copied(site: Path):
    results = sorted((REPO / "benchmarks" / "results").glob("*.md"))
    assert results
    for path in results:
        page = site / "performance" / path.stem / "index.html"
        assert page.is_file(), path.name
        lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
        text = _text(page)
        # Its title, and its last line (a table row, a code line or prose).
        assert _squash(lines[0].lstrip("#")) in text, path.name
        if "](" not in lines[-1]:  # (a link's target is not text)
            assert _squash(lines[-1]) in text, path.name
    assert not list((REPO / "docs").rglob("*.md.orig"))
    assert not (REPO / "docs" / "performance").exists()  # generated, never stored in docs/


def test_the_readme_is_short_and_its_doc_links_exist():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    links = re.findall(r"\]\((docs/[^)#\s]+)", readme)
    assert len(links) >= 10
    for link in links:
        assert (REPO / link).is_file(), link
