"""One source of truth for notes (issue 38): over every golden fixture and every project
fixture, the JSON report (``sdp-convert --report-format json``, as ``report.render`` writes it)
never says two things against each other and never says the same thing twice at one place.

The detectors are the ecosystem check's own (``benchmarks/ecosystem.py``: a contract part that
holds next to a manual note saying what it relies on was not found, a "not split" note next to
the edit that splits the data, "no DataLoader found" while another line names the loader that
feeds the loop, an entry counted converted while its contract fails, the same note twice at one
place), so the fixtures here and the public programs of the ecosystem check are held to the
same rules. A test on constructed reports shows the detectors fail where they must.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

from sdp_convert.options import Options
from sdp_convert.report import render
from sdp_convert.runner import Config, Job, run_jobs

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"


def _ecosystem():
    spec = importlib.util.spec_from_file_location("ecosystem",
                                                  ROOT / "benchmarks" / "ecosystem.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("ecosystem", module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


eco = _ecosystem()


def problems(doc: dict) -> list[dict]:
    """What the report says against itself, and the notes it repeats at one place."""
    files = [f["path"] for f in doc["files"]]
    reach = {f["path"]: files for f in doc["files"] if f.get("contract")}
    return eco.find_contradictions(doc, reach) + eco.find_duplicates(doc["changes"])


def test_the_detectors_find_a_contradiction_and_a_repeated_note():
    note = {"path": "train.py", "line": 12, "column": 5, "transform": "shard_dataloader",
            "manual": True, "message": "no DataLoader feeding this training loop was found: "
            "give each rank its own part of the training data"}
    doc = {"changes": [note, dict(note)], "files": [{
        "path": "train.py", "status": "converted", "attention": False,
        "contract": {"parts": {"data": {"state": "holds", "detail": "training data split"}}}}]}
    found = problems(doc)
    assert any(p["kind"] == "holds-vs-note" and p["part"] == "data" for p in found), found
    assert any(p.get("times") == 2 for p in found), found
    doc["changes"] = [note]
    doc["files"][0]["contract"]["parts"]["data"]["state"] = "missing"
    doc["files"][0]["attention"] = True
    assert problems(doc) == []


def test_no_report_of_a_golden_or_project_contradicts_itself(tmp_path: Path):
    jobs = []
    for case in sorted(p for p in FIXTURES.glob("*/*") if p.is_dir()
                       and p.parent.name != "projects"):
        work = tmp_path / f"{case.parent.name}-{case.name}"
        work.mkdir()
        shutil.copy(case / "input.py", work / "input.py")
        jobs.append((f"{case.parent.name}/{case.name}", [Job(work / "input.py", "input.py",
                                                              None)]))
    for case in sorted(p for p in (FIXTURES / "projects").iterdir() if p.is_dir()):
        work = tmp_path / f"projects-{case.name}"
        shutil.copytree(case / "input", work)
        files = sorted(p.relative_to(work).as_posix() for p in work.rglob("*.py"))
        jobs.append((f"projects/{case.name}", [Job(work / f, f, None) for f in files]))
    assert len(jobs) >= 150
    found = {}
    for name, case_jobs in jobs:
        outcomes = run_jobs(case_jobs, Config(Options(), mode="check"), workers=1)
        doc = json.loads(render(outcomes, "json", check=True))
        if problems(doc):
            found[name] = problems(doc)
    assert not found, json.dumps(found, indent=1)[:6000]
