"""One source of truth for notes (issue 38): over every golden fixture and every project
fixture, the JSON report (``sdp-convert --report-format json``, as ``report.render`` writes it)
never says two things against each other and never says the same thing twice at one place.

The detectors are the ecosystem check's own (``benchmarks/ecosystem.py``: a contract part that
holds next to a manual note saying what it relies on was not found, a "not split" note next to
the edit that splits the data, "no DataLoader found" while another line names the loader that
feeds the loop, a model wrapped (or a tape made to average) while another line says the same
model is not wrapped or its gradients not averaged, a write kept to rank 0 while a note at its
line says "run it on rank 0 only", an entry counted converted while its contract fails, the same
note twice at one place), so the fixtures here and the public programs of the ecosystem check
are held to the same rules. Tests on constructed reports show the detectors fail where they
must.

The conversions run in this process, one ``run_jobs`` per fixture (a project's files in one
call, as ``sdp-convert DIR`` runs them): about 50 s for the 150 fixtures on a 2-core machine.
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
    # Every file as an entry that runs them all: a fixture is one program, and the checks of
    # lines against each other run for files without a contract too (a script left unchanged).
    reach = {f: files for f in files}
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


def _change(line: int, transform: str, message: str, manual: bool = False,
            path: str = "train.py") -> dict:
    return {"path": path, "line": line, "column": 1, "transform": transform, "manual": manual,
            "message": message}


def _report(*changes: dict) -> dict:
    return {"changes": list(changes), "files": [{"path": "train.py", "status": "converted",
                                                 "attention": True}]}


def test_the_detectors_find_a_model_said_averaged_and_not_averaged():
    wrap = _change(20, "wrap_model_ddp", "wrap netD in sdp.DistributedDataParallel")
    # the same model, named, anywhere in the file
    frozen = _change(48, "wrap_model_ddp", "every parameter of netD is frozen (requires_grad "
                     "False): not wrapped in sdp.DistributedDataParallel (no gradient to average)")
    unknown = _change(5, "wrap_model_ddp", "could not tell where netD is created: wrap it in "
                      "sdp.DistributedDataParallel by hand", manual=True)
    found = problems(_report(wrap, frozen, unknown))
    assert sorted((p["kind"], p["part"], p["where"]) for p in found) == [
        ("edit-vs-note", "averaging", "train.py:48"), ("edit-vs-note", "averaging", "train.py:5")]
    # a tape made to average, and "applies unaveraged" at the same statement
    tape = _change(30, "wrap_gradient_tape", "tape = sdp.DistributedGradientTape(tape) in "
                   "main(): gradients averaged across workers before optimizer.apply_gradients")
    unaveraged = _change(29, "contract", "tf.GradientTape() records gradients that input.py:33 "
                         "applies unaveraged: wrap the tape [averaging]", manual=True)
    assert [p["where"] for p in problems(_report(tape, unaveraged))] == ["train.py:29"]
    # Another model, a call around the wrapper, a tape elsewhere: true together.
    assert problems(_report(
        wrap, _change(48, "wrap_model_ddp", "every parameter of encoder is frozen "
                      "(requires_grad False): not wrapped in sdp.DistributedDataParallel"),
        _change(60, "wrap_model_ddp", "netD.encode(...) runs the wrapped module around DDP's "
                "forward: gradients computed through it are not averaged", manual=True),
        tape, dict(unaveraged, line=80))) == []


def test_the_detectors_find_a_guarded_write_told_to_run_on_rank_0():
    guard = _change(40, "guard_rank0_writes", "torch.save(...) runs on rank 0 only")
    note = _change(40, "contract", "torch.save(...) writes on every rank: run it on rank 0 only "
                   "(`if sdp.rank() == 0:`) [writes]", manual=True)
    assert [(p["kind"], p["part"], p["where"]) for p in problems(_report(guard, note))] == [
        ("edit-vs-note", "writes", "train.py:40")]
    # another write, a few lines below the guarded one
    assert problems(_report(guard, dict(note, line=42))) == []


def test_the_detectors_find_split_data_said_to_be_read_whole_by_every_rank():
    shard = _change(22, "shard_dataloader", "give train_loader a DistributedSampler "
                    "(train_sampler, shuffle=True) so that each rank reads its own shard")
    whole = _change(22, "contract", "the DataLoader built here feeds the training loop at "
                    "train.py:40 and has no DistributedSampler: every rank reads all of the data "
                    "[data]", manual=True)
    assert [(p["kind"], p["part"]) for p in problems(_report(shard, whole))] == [
        ("note-vs-note", "data")]
    assert problems(_report(shard, dict(whole, path="eval.py"))) == []


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
