"""benchmarks/ecosystem.py, the ecosystem check, on tiny projects made here (no network, no
fetched code), so that the script cannot rot unnoticed.

The contradiction detectors must flag each constructed contradiction (a contract part that holds
against a note that says its ground was not found; two notes against each other; an entry
counted converted while its contract fails) and must not flag a consistent report. End to end,
``run`` exports a pinned commit from a local mirror, converts it with the real ``sdp-convert``
and records statuses, contracts and counts; ``report`` merges a verdict only while its digest
matches the output; ``compare`` names what changed, program by program.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "ecosystem.py"


def _module():
    spec = importlib.util.spec_from_file_location("ecosystem", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["ecosystem"] = module
    spec.loader.exec_module(module)
    return module


eco = _module()

HOLDS = {p: {"state": "holds", "detail": ""} for p in ("init", "averaging", "data", "state",
                                                       "writes")}


def _change(path, line, transform, message, manual=False):
    return {"path": path, "line": line, "column": 1, "transform": transform, "message": message,
            "manual": manual}


def _doc(changes, contract_parts, status="converted", attention=None):
    if attention is None:
        attention = any(c["manual"] for c in changes)
    return {"version": 1, "changes": changes, "files": [
        {"path": "train.py", "status": status, "attention": attention, "kind": "torch",
         "reason": "", "message": "",
         "contract": {"entry": "train.py", "parts": contract_parts,
                      "holds": all(v["state"] != "missing" for v in contract_parts.values())}},
        {"path": "loop.py", "status": "converted", "attention": attention, "kind": "torch",
         "reason": "", "message": ""},
    ], "summary": {}}


REACH = {"train.py": ["train.py", "loop.py"]}


def test_a_part_that_holds_against_a_note_that_says_it_was_not_found_is_flagged():
    doc = _doc([_change("loop.py", 12, "shard_dataloader",
                        "no DataLoader feeding this training loop was found: give each rank "
                        "its own part of the training data", manual=True)], HOLDS)
    found = eco.find_contradictions(doc, REACH)
    assert [(f["kind"], f["part"], f["where"]) for f in found] == [
        ("holds-vs-note", "data", "loop.py:12")]


def test_a_contract_note_tagged_with_its_part_counts_for_that_part():
    doc = _doc([_change("loop.py", 3, "contract", "torch.save(...) writes on every rank: run it "
                        "on rank 0 only [writes]", manual=True)], HOLDS)
    assert [(f["kind"], f["part"]) for f in eco.find_contradictions(doc, REACH)] == [
        ("holds-vs-note", "writes")]


def test_notes_against_each_other_are_flagged():
    parts = dict(HOLDS, data={"state": "missing", "detail": "..."})
    doc = _doc([
        _change("loop.py", 20, "shard_dataloader", "no DataLoader feeding this training loop "
                "was found: give each rank its own part", manual=True),
        _change("train.py", 8, "contract", "the DataLoader built here feeds the training in "
                "loop.py:21 and has no DistributedSampler: every rank reads all of the data "
                "[data]", manual=True),
        # "not split" next to the edit that splits the same fit
        _change("train.py", 30, "scale_keras_learning_rate", "Adam: 0.1 left as it is: the "
                "training data is not split between the workers", manual=True),
        _change("train.py", 32, "wrap_keras_fit", "x, y: each worker trains on every "
                "sdp.size()-th sample (sharded)"),
    ], parts)
    kinds = sorted((f["kind"], f["where"]) for f in eco.find_contradictions(doc, REACH))
    assert kinds == [("note-vs-note", "loop.py:20"), ("note-vs-note", "train.py:30")]


def test_an_entry_counted_converted_while_its_contract_fails_is_flagged():
    parts = dict(HOLDS, writes={"state": "missing", "detail": "open(...) writes on every rank"})
    doc = _doc([_change("train.py", 1, "add_runtime_init", "call sdp.init()"),
                _change("loop.py", 5, "contract", "open(...) writes on every rank [writes]",
                        manual=True)], parts, attention=False)
    doc["files"][0]["attention"] = False
    found = eco.find_contradictions(doc, REACH)
    assert [(f["kind"], f["part"]) for f in found] == [("status-vs-contract", "writes")]


def test_a_consistent_report_is_not_flagged():
    parts = dict(HOLDS, data={"state": "noted", "detail": "no DataLoader ... was found"})
    doc = _doc([
        _change("train.py", 1, "add_runtime_init", "call sdp.init()"),
        _change("train.py", 9, "wrap_model_ddp", "wrap model in sdp.DistributedDataParallel"),
        _change("loop.py", 12, "shard_dataloader", "no DataLoader feeding this training loop "
                "was found: give each rank its own part", manual=True),
        _change("train.py", 40, "guard_rank0_writes", "torch.save(...) runs on rank 0 only"),
        # a note in a module the entry does not run says nothing about its contract
        _change("other.py", 3, "contract", "open(...) writes on every rank [writes]",
                manual=True),
    ], parts)
    assert eco.find_contradictions(doc, REACH) == []
    assert eco.find_duplicates(doc["changes"]) == []
    assert eco.find_policy(doc, REACH) == []


def test_duplicates_and_scaling_without_averaging_are_counted():
    note = _change("loop.py", 7, "shard_dataloader", "no DataLoader feeding this training "
                   "loop was found", manual=True)
    parts = dict(HOLDS, averaging={"state": "noted", "detail": "could not tell"})
    doc = _doc([note, dict(note), _change("train.py", 5, "scale_learning_rate",
                                          "SGD: learning rate 0.1 * sdp.size()")], parts)
    assert eco.find_duplicates(doc["changes"]) == [
        {"where": "loop.py:7", "message": note["message"], "times": 2}]
    assert [p["where"] for p in eco.find_policy(doc, REACH)] == ["train.py:5"]


def test_program_reach_follows_absolute_relative_and_package_imports(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("from .engine import train\n")
    (tmp_path / "pkg" / "engine.py").write_text("from . import util\n")
    (tmp_path / "pkg" / "util.py").write_text("import os\n")
    (tmp_path / "data.py").write_text("")
    (tmp_path / "unused.py").write_text("")
    (tmp_path / "main.py").write_text("import data\nfrom pkg import train\n")
    reach = eco.program_reach(tmp_path, "main.py", ["."])
    assert sorted(reach) == ["data.py", "main.py", "pkg/__init__.py", "pkg/engine.py",
                             "pkg/util.py"]


# -- end to end, with the real sdp-convert and a fake one ---------------------------------------

TRAIN = '''\
import torch
from torch.utils.data import DataLoader, TensorDataset

from model import make_model


def main():
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    loader = DataLoader(data, batch_size=8, shuffle=True)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for x, y in loader:
            optimizer.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            optimizer.step()
    torch.save(model.state_dict(), "model.pt")


if __name__ == "__main__":
    main()
'''
MODEL = "import torch\n\n\ndef make_model():\n    return torch.nn.Linear(4, 1)\n"


def _git(*args, cwd):
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True,
                          text=True, timeout=60).stdout.strip()


def _project(tmp_path):
    """A mirror holding one commit of a two-module project, and a list pinning it."""
    repo = tmp_path / "mirror" / "someone+tiny" / "repo"
    repo.mkdir(parents=True)
    (repo / "train.py").write_text(TRAIN)
    (repo / "model.py").write_text(MODEL)
    _git("init", "-q", cwd=repo)
    _git("add", ".", cwd=repo)
    _git("commit", "-q", "-m", "tiny", cwd=repo)
    commit = _git("rev-parse", "HEAD", cwd=repo)
    listing = tmp_path / "list.toml"
    listing.write_text(textwrap.dedent(f"""\
        [[project]]
        name = "tiny"
        repository = "someone/tiny"
        commit = "{commit}"
        paths = ["."]
        entries = ["train.py"]
        kind = "torch"
        description = "a loader and a loop in train.py, the model made in model.py"

        [[project]]
        name = "other"
        repository = "someone/absent"
        commit = "{'0' * 40}"
        paths = ["."]
        entries = ["train.py"]
        description = "not mirrored: an error line, not a crash"
        """))
    return listing


def _run(tmp_path, listing, out, *extra):
    cmd = [sys.executable, str(SCRIPT), "run", "--list", str(listing), "--mirror",
           str(tmp_path / "mirror"), "--workdir", str(tmp_path / "work"), "--out", str(out),
           "--verdicts", str(tmp_path / "verdicts.toml"), *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(out.read_text())


FAKE = '''\
#!{python}
"""A stand-in sdp-convert whose report contradicts itself."""
import json, sys
if "--version" in sys.argv:
    print("sdp-convert fake")
    sys.exit(0)
report = sys.argv[sys.argv.index("--report") + 1]
parts = {{p: {{"state": "holds", "detail": ""}} for p in
          ("init", "averaging", "data", "state", "writes")}}
parts["writes"] = {{"state": "missing", "detail": "torch.save(...) writes on every rank"}}
json.dump({{"version": 1, "changes": [
    {{"path": "train.py", "line": 13, "column": 1, "transform": "shard_dataloader",
     "message": "no DataLoader feeding this training loop was found", "manual": True}},
    {{"path": "train.py", "line": 13, "column": 1, "transform": "shard_dataloader",
     "message": "no DataLoader feeding this training loop was found", "manual": True}}],
  "files": [{{"path": "train.py", "status": "converted", "attention": False, "kind": "torch",
             "reason": "", "message": "",
             "contract": {{"entry": "train.py", "parts": parts, "holds": False}}}}],
  "summary": {{"converted": 1, "attention": 0, "unchanged": 0, "skipped": 0, "failed": 0,
              "manual": 2}}}}, open(report, "w"))
'''


@pytest.mark.slow
def test_run_report_and_compare_on_a_tiny_project(tmp_path):
    listing = _project(tmp_path)
    first = _run(tmp_path, listing, tmp_path / "a.json")
    tiny, other = first["programs"]
    assert "no mirror of someone/absent" in other["error"]
    entry = tiny["entries"]["train.py"]
    assert entry["status"] == "converted" and entry["modules"] == 2
    # the real converter wraps, shards, guards: every part of the contract holds
    assert {p: v["state"] for p, v in entry["contract"]["parts"].items()} == {
        "init": "holds", "averaging": "holds", "data": "holds", "state": "holds",
        "writes": "holds"}
    assert tiny["counts"]["contradictions"] == 0 and tiny["counts"]["changes"] > 0
    diff = (tmp_path / "work" / "tiny" / "diff.patch").read_text()
    assert "DistributedSampler" in diff and "sdp.DistributedDataParallel" in diff

    # a verdict counts only for the output it was given for
    (tmp_path / "verdicts.toml").write_text(
        f'[tiny]\nverdict = "right"\ndigest = "{tiny["digest"]}"\nreason = "all of it"\n')
    md = subprocess.run([sys.executable, str(SCRIPT), "report", str(tmp_path / "a.json"),
                         "--verdicts", str(tmp_path / "verdicts.toml"), "--md", "-"],
                        capture_output=True, text=True, timeout=60, check=True).stdout
    assert "| right | 1 |" in md and "| tiny | torch |" in md
    assert "train.py: I+ A+ D+ S+ W+" in md

    fake = tmp_path / "fake-sdp-convert"
    fake.write_text(FAKE.format(python=sys.executable))
    fake.chmod(0o755)
    second = _run(tmp_path, listing, tmp_path / "b.json", "--only", "tiny",
                  "--sdp-convert", str(fake))
    (tiny2,) = second["programs"]
    kinds = sorted(f["kind"] for f in tiny2["contradictions"])
    assert kinds == ["holds-vs-note", "status-vs-contract"]
    assert tiny2["counts"]["duplicates"] == 1
    md2 = (tmp_path / "b.md").read_text()
    assert "stale (right)" in md2 and "| stale (output changed since the review) | 1 |" in md2

    compared = subprocess.run([sys.executable, str(SCRIPT), "--compare", str(tmp_path / "a.json"),
                               str(tmp_path / "b.json")], capture_output=True, text=True,
                              timeout=60, check=True).stdout
    assert "tiny:" in compared and "contract train.py writes: holds -> missing" in compared
    assert "contradiction new: train.py:13 (holds-vs-note)" in compared
    assert "other: removed" in compared
