"""Golden cases: every ``fixtures/<kind>/<case>/`` converted and compared with what it should give.

A case directory holds:

* ``input.py``: a whole, real-looking script;
* ``expected.py``: the converted script; absent when the conversion must leave ``input.py`` byte
  for byte alone;
* ``report.txt``: the report, one line ``# kind: <what the file was detected as>`` followed by one
  line per change as the CLI prints it (``input.py:LINE:COL: [transform] message``).

``pytest --update-goldens`` rewrites the ``expected.py`` / ``report.txt`` files that differ (and
deletes an ``expected.py`` that equals its input), then fails listing them: an update is always
reviewed with ``git diff`` before it is committed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sdp_convert.engine import Options, Result
from sdp_convert.runner import convert_bytes


def convert(source: bytes, options: Options) -> Result:
    """What the command line and the Python API give (manual notes written as comments)."""
    return convert_bytes(source, "input.py", options)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
# fixtures/projects/ holds multi-module trees: tests/test_projects.py runs them.
CASES = sorted(
    p for p in FIXTURES.glob("*/*")
    if p.is_dir() and not p.name.startswith((".", "_")) and p.parent.name != "projects"
)


def report_text(result: Result) -> str:
    lines = [f"# kind: {result.info.label}"]
    lines += [change.format("input.py") for change in result.changes]
    return "\n".join(lines) + "\n"


def _update(path: Path, content: bytes | None, updated: list[str]) -> None:
    """Make ``path`` hold ``content`` (``None``: absent); note it in ``updated`` if it changed."""
    current = path.read_bytes() if path.exists() else None
    if current == content:
        return
    if content is None:
        path.unlink()
    else:
        path.write_bytes(content)
    updated.append(str(path.relative_to(FIXTURES.parent)))


def test_fixtures_exist():
    kinds = {case.parent.name for case in CASES}
    assert "torch" in kinds
    assert len([c for c in CASES if c.parent.name == "torch"]) >= 14


@pytest.mark.parametrize("case", CASES, ids=[f"{c.parent.name}/{c.name}" for c in CASES])
def test_case_has_an_input(case: Path):
    assert (case / "input.py").is_file(), f"{case} has no input.py"
    stray = {p.name for p in case.iterdir()} - {"input.py", "expected.py", "report.txt", "e2e.json"}
    assert not stray, f"unexpected files in {case}: {sorted(stray)}"


@pytest.mark.parametrize(
    "case",
    [c for c in CASES if (c / "input.py").is_file()],
    ids=[f"{c.parent.name}/{c.name}" for c in CASES if (c / "input.py").is_file()],
)
def test_golden(case: Path, request: pytest.FixtureRequest):
    source = (case / "input.py").read_bytes()
    result = convert(source, Options())
    output, report = result.output, report_text(result).encode()
    expected_path, report_path = case / "expected.py", case / "report.txt"

    if request.config.getoption("--update-goldens"):
        updated: list[str] = []
        _update(expected_path, None if output == source else output, updated)
        _update(report_path, report, updated)
        if updated:
            pytest.fail("updated (review with git diff): " + ", ".join(updated), pytrace=False)

    expected = expected_path.read_bytes() if expected_path.exists() else source
    if expected_path.exists():
        assert expected != source, f"{expected_path} equals input.py: delete it"
        compile(expected, str(expected_path), "exec")
    assert output.decode() == expected.decode(), (
        f"conversion of {case / 'input.py'} differs from "
        f"{expected_path.name if expected_path.exists() else 'input.py (no expected.py)'}; "
        "run pytest --update-goldens and review the diff"
    )
    assert report_path.exists(), f"{report_path} is missing; run pytest --update-goldens"
    assert report.decode() == report_path.read_text(), (
        f"report differs from {report_path}; run pytest --update-goldens and review the diff"
    )

    # Black's stability check: the converted file is a fixed point.
    again = convert(expected, Options())
    assert again.output.decode() == expected.decode(), "converting expected.py again changes it"
    if expected_path.exists():
        # Spots a person must still look at are reported again (like a linter's warnings);
        # nothing else is.
        # (A migrated DeepSpeed script is then a DeepSpeed script: "left unchanged" says so.)
        edits = [
            c for c in again.changes
            if not c.manual and c.transform != "note_already_distributed"
        ]
        assert not edits, f"converting expected.py again reports changes: {edits}"


#: A learning rate this converter scaled (not a note asking a person to).
_SCALED = re.compile(r"\[scale_(keras_)?learning_rate\] (?!\(manual\)).*\* sdp\.size\(\)")
#: The report line of a shard this converter made.
_SHARDED_HERE = re.compile(
    r"\[shard_dataloader\] give .* a DistributedSampler"
    r"|\[shard_tf_dataset\] training data from .*\.apply\(sdp\.shard\)"
    r"|\[wrap_keras_fit\] .*each worker trains on every sdp\.size\(\)-th sample"
    r"|\[port_fit_generator\] .*each worker augments and trains on every sdp\.size\(\)-th"
    r"|\[shard_tf_dataset\] \S+ -> sdp\.shard\(.*each worker gets every sdp\.size\(\)-th sample"
    r"|\[wrap_keras_fit\] .*each worker reads every sdp\.size\(\)-th batch"
    r"|\[shard_tf_dataset\] .* -> sdp\.shard\(.*each worker takes its own part of the indices"
    r"|\[shard_torchtext_iterator\] .*\(sdp\.shard\(.*each rank batches its own part"
    r"|\[shard_token_stream\] .*narrow\(1, sdp\.rank\(\).*each rank trains on its own"
    r"|\[seed_samplers_by_rank\] the sampler draws with replacement: each rank draws from its own"
)
#: Data the script splits between the ranks itself.
_SHARDED_BEFORE = re.compile(r"DistributedSampler\(|\.shard\(|\.apply\(sdp\.shard\)|sdp\.shard\(")


@pytest.mark.parametrize(
    "case",
    [c for c in CASES if (c / "report.txt").is_file()],
    ids=[f"{c.parent.name}/{c.name}" for c in CASES if (c / "report.txt").is_file()],
)
def test_a_scaled_learning_rate_means_sharded_data(case: Path):
    # N ranks averaging the gradient of the same batch step N times too far with a scaled rate:
    # the converter scales a learning rate only where each rank trains on its own part.
    report = (case / "report.txt").read_text()
    if not _SCALED.search(report):
        return
    source = (case / "input.py").read_text()
    assert _SHARDED_HERE.search(report) or _SHARDED_BEFORE.search(source), (
        f"{case}: learning rate scaled, but the training data is not sharded"
    )
