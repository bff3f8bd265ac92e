"""``sdp-run --audit``: each defect, in a small script run for real on 2 CPU ranks, is named in
the report with its fix; the same script done right (and a correct DDP script written by hand)
gives "no problem found".

Every job runs under ``sdp-run`` (torchrun, Gloo) in its own process session with a hard time
limit, and is killed whole if it overstays.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sdp_runtime._audit import report as audit_report

from ..runtime._spawn import clean_env

SDP_RUN = str(Path(sys.executable).with_name("sdp-run"))
SCRIPTS = Path(__file__).parent / "scripts"
HAS_TF = importlib.util.find_spec("tensorflow") is not None
TIMEOUT_S = 180


def audit(tmp_path: Path, script: str, *args: str, mode: str = "--audit",
          env: dict[str, str] | None = None) -> tuple[int, dict[str, Any], str]:
    """Run ``script`` under ``sdp-run <mode> -n 2``; its exit status, JSON report and stderr."""
    shutil.copy(SCRIPTS / script, tmp_path / script)
    report = tmp_path / "audit.json"
    cmd = [SDP_RUN, mode, "--audit-report", str(report), "-n", "2", script, *args]
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=clean_env({"TF_CPP_MIN_LOG_LEVEL": "2", "SDP_TIMEOUT": "60", **(env or {})}),
        start_new_session=True)
    try:
        _, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        pytest.fail(f"{script} still running after {TIMEOUT_S} s:\n{err.decode()[-4000:]}")
    text = err.decode(errors="replace")
    assert report.is_file(), f"no audit report written:\n{text[-4000:]}"
    return proc.returncode, json.loads(report.read_text()), text


def checks(found: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["check"]: p for p in found["problems"]}


def assert_clean(code: int, found: dict[str, Any], text: str) -> None:
    assert code == 0, text[-4000:]
    assert found["ok"], found["text"]
    assert "sdp audit: no problem found in" in text


# (script, the check it must trip, words of its message, the fix it must give)
DEFECTS = [
    ("never_wrapped.py", "not-averaged", (
        "gradients of `model[0]`, `model[2]` differ across ranks at step 1: they were never "
        "averaged: `model` is not wrapped in DistributedDataParallel and optimizer `opt` (made at "
        "never_wrapped.py:15) is not a DistributedOptimizer",), audit_report.FIX_NOT_AVERAGED),
    ("no_sampler.py", "same-data", (
        "computed identical gradients at steps 1-5", "(100% of the samples of the first epoch "
        "seen by more than one rank) through loader `loader` (made at no_sampler.py:14, "
        "SequentialSampler, not split by rank)"), audit_report.FIX_DATA),
    ("reinit_after_wrap.py", "weights-differ", (
        "parameters of `model[2]` differ across ranks before the first step",
        "(re-initialised after `ddp` was wrapped at reinit_after_wrap.py:16?)"),
     audit_report.FIX_INIT),
    ("same_file.py", "same-file", ("ranks 0-1 all wrote model.pt",), audit_report.FIX_SAME_FILE),
    ("read_no_barrier.py", "read-during-write", (
        "rank 1 read vocab.txt (read_no_barrier.py:32) while rank 0 was still writing it "
        "(read_no_barrier.py:21)",), audit_report.FIX_READ_WRITE),
    ("unequal_steps.py", "unequal-steps", ("(rank 0 5, rank 1 4): they differ from step 5 on",),
     audit_report.FIX_STEPS),
    ("random_subsets.py", "sample-overlap", (
        "39% of the samples of the first epoch (18 of 46) were seen by more than one rank "
        "through loader `loader` (made at random_subsets.py:16, SequentialSampler, not split by "
        "rank)",), audit_report.FIX_OVERLAP),
    ("buffer_one_rank.py", "buffers-differ", (
        "buffers `model.scale` differ across ranks after step 2 (max |diff| 0.1): set or changed "
        "on some ranks only",), audit_report.FIX_BUFFERS),
    # issue 38: the script's own names, the cause of a bypassed wrapper, the overlap over an
    # epoch, the file behind diverging weights
    ("trainer_object.py", "not-averaged", (
        "gradients of `trainer.model.body`, `trainer.model.head` differ across ranks at step 1: "
        "they were never averaged: `trainer.model` is not wrapped in DistributedDataParallel and "
        "optimizer `trainer.optimizer` (made at trainer_object.py:27) is not a "
        "DistributedOptimizer",), audit_report.FIX_NOT_AVERAGED),
    ("bypass_wrapper.py", "not-averaged", (
        "gradients of `model.body`, `model.head` differ across ranks at step 1: they were never "
        "averaged: `model` (DistributedDataParallel made at bypass_wrapper.py:32) wraps them, but "
        "backward ran with no call of its forward at steps 1-4; the step called the model at "
        "bypass_wrapper.py:41 (`loss = model.module.compute_loss(x, y)`), past the wrapper, so "
        "DDP averaged nothing",), audit_report.FIX_BYPASS),
    ("own_order.py", "sample-overlap", (
        "100% of the samples of the first epoch (64 of 64) were seen by more than one rank "
        "(every rank read the whole data set, each in its own order) through loader `loader` "
        "(made at own_order.py:18, RandomSampler, not split by rank)",), audit_report.FIX_DATA),
    # a sampler drawing with replacement: identical draws are the defect; the chance overlap
    # of independent draws (--right) is not
    ("draw_with_replacement.py", "same-data", (
        "computed identical gradients at steps 1-5",), audit_report.FIX_DATA),
    ("stale_checkpoint.py", "weights-differ", (
        "parameters of `model` differ across ranks at the end (max |diff|",
        ": rank 1 read latest.pt (stale_checkpoint.py:29) ", " s before rank 0 wrote it "
        "(stale_checkpoint.py:24), with no barrier between"), audit_report.FIX_READ_WRITE),
]


@pytest.mark.parametrize(("script", "check", "words", "fix"), DEFECTS,
                         ids=[d[0].removesuffix(".py") for d in DEFECTS])
def test_defect_is_named_with_its_fix(tmp_path: Path, script: str, check: str,
                                      words: tuple[str, ...], fix: str) -> None:
    strict = script == "no_sampler.py"  # one case in strict mode, the others plain
    code, found, text = audit(tmp_path, script, mode="--audit=strict" if strict else "--audit")
    problems = checks(found)
    assert check in problems, found["text"]
    for part in words:
        assert part in problems[check]["message"], problems[check]["message"]
    assert problems[check]["fix"] == fix
    assert f"fix: {fix}" in text  # printed once, at the end, by the launcher
    if script == "unequal_steps.py":
        assert code != 0  # rank 0 waits in a collective that rank 1 never joins: the job fails
    elif strict:
        assert code == audit_report.EXIT_AUDIT, text[-4000:]
    else:
        assert code == 0, text[-4000:]  # plain --audit reports, it does not fail the job
    if script == "never_wrapped.py":
        weights = problems["weights-differ"]
        assert weights["details"]["step"] == 1 and weights["details"]["max_abs_diff"] > 0
        assert "parameters of `model[0]`, `model[2]` differ across ranks after step 1 (max |diff|" \
            in weights["message"]
    if script == "trainer_object.py":  # the loader too, by its attribute and line
        assert problems["sample-overlap"]["message"].startswith(
            "100% of the samples of the first epoch (64 of 64) were seen by more than one rank "
            "(every rank read the whole data set, each in its own order) through loader "
            "`trainer.loader` (made at trainer_object.py:26, RandomSampler, not split by rank)")
        assert problems["not-averaged"]["details"]["modules"] == [
            "trainer.model.body", "trainer.model.head"]
    if script == "bypass_wrapper.py":  # it is wrapped: never "wrap the model"
        assert audit_report.FIX_NOT_AVERAGED not in text
        assert problems["weights-differ"]["fix"] == audit_report.FIX_BYPASS
    if script == "stale_checkpoint.py":
        assert "not wrapped" not in text
        assert problems["weights-differ"]["details"]["file"]["path"].endswith("latest.pt")


def test_bypass_through_the_wrappers_attributes(tmp_path: Path) -> None:
    """``model.encode(x)`` on the runtime's wrapper reaches the module's method: a bypass."""
    code, found, text = audit(tmp_path, "bypass_wrapper.py", "--encode")
    problems = checks(found)
    assert list(problems) == ["not-averaged", "weights-differ"], found["text"]
    assert ("but backward ran with no call of its forward at steps 1-4; the step called the "
            "model at bypass_wrapper.py:39 (`loss = torch.nn.functional.mse_loss(model.head("
            "model.encode(x)), y)`), past the wrapper") in problems["not-averaged"]["message"]
    assert problems["not-averaged"]["fix"] == audit_report.FIX_BYPASS
    assert code == 0, text[-4000:]


def test_unsplit_data_is_found_with_an_unwrapped_model(tmp_path: Path) -> None:
    """Each rank reads the whole set in its own order and trains its own copy: all three."""
    code, found, text = audit(tmp_path, "own_order.py", "--unwrapped")
    problems = checks(found)
    assert list(problems) == ["sample-overlap", "not-averaged", "weights-differ"], found["text"]
    assert problems["sample-overlap"]["message"].startswith(
        "100% of the samples of the first epoch (64 of 64) were seen by more than one rank")
    assert ("(`model` is not wrapped in DistributedDataParallel, whose wrap broadcasts rank 0's "
            "weights)") in problems["weights-differ"]["message"]
    assert code == 0, text[-4000:]


@pytest.mark.parametrize("script", [d[0] for d in DEFECTS], ids=[d[0][:-3] for d in DEFECTS])
def test_done_right_has_no_problem(tmp_path: Path, script: str) -> None:
    assert_clean(*audit(tmp_path, script, "--right", mode="--audit=strict"))


def test_hand_written_ddp_has_no_problem(tmp_path: Path) -> None:
    assert_clean(*audit(tmp_path, "ddp_by_hand.py", mode="--audit=strict"))


def test_a_job_that_failed_is_not_called_problem_free(tmp_path: Path) -> None:
    """Eco check: a job that stopped with an error was reported "no problem found", as if the
    whole run had been checked. The clean part is said, with the failure and its exit status."""
    code, found, text = audit(tmp_path, "fails_after_training.py")
    assert code != 0 and found["status"] == code, text[-4000:]
    assert found["ok"] and not found["problems"], found["text"]
    assert "the evaluation data is missing" in text
    assert (f"steps that ran (2 ranks), but the job failed (exit status {code}): the rest of the "
            "training was not checked") in found["text"], found["text"]
    assert "no problem found in 6 steps (2 ranks)" not in text


def test_sdp_audit_variable_under_torchrun(tmp_path: Path) -> None:
    """SDP_AUDIT=1 under torchrun itself: rank 0 compares and prints when it exits."""
    shutil.copy(SCRIPTS / "no_sampler.py", tmp_path / "no_sampler.py")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", "2", "no_sampler.py"]
    proc = subprocess.run(torchrun, cwd=tmp_path, capture_output=True, timeout=TIMEOUT_S,
                          env=clean_env({"SDP_AUDIT": "strict", "SDP_AUDIT_REPORT":
                                         str(tmp_path / "a.json")}))
    text = proc.stderr.decode(errors="replace") + proc.stdout.decode(errors="replace")
    assert "computed identical gradients at steps 1-5" in text, text[-4000:]
    assert proc.returncode != 0  # strict: rank 0 exits with status 3, torchrun fails
    assert not json.loads((tmp_path / "a.json").read_text())["ok"]


@pytest.mark.skipif(not HAS_TF, reason="tensorflow is not installed")
def test_tf_data_not_sharded_under_a_tape(tmp_path: Path) -> None:
    code, found, text = audit(tmp_path, "tf_unsharded_tape.py")
    problems = checks(found)
    assert list(problems) == ["same-data"], found["text"]
    assert "ranks 0-1 computed identical gradients at steps 1-5" in problems["same-data"][
        "message"]
    assert code == 0, text[-4000:]


@pytest.mark.skipif(not HAS_TF, reason="tensorflow is not installed")
def test_tf_data_sharded_has_no_problem(tmp_path: Path) -> None:
    assert_clean(*audit(tmp_path, "tf_unsharded_tape.py", "--right", mode="--audit=strict"))


@pytest.mark.skipif(not HAS_TF, reason="tensorflow is not installed")
def test_tf_tape_never_wrapped(tmp_path: Path) -> None:
    """No gradient reaches the runtime: the trained variables are compared at the end."""
    code, found, text = audit(tmp_path, "tf_unsharded_tape.py", "--unwrapped")
    problems = checks(found)
    assert list(problems) == ["not-averaged", "weights-differ"], found["text"]
    assert ("gradients of `sequential/dense`, `sequential/dense_1` differ across ranks at step 1: "
            "they were never averaged") in problems["not-averaged"]["message"]
    assert ("parameters of `sequential/dense`, `sequential/dense_1` differ across ranks after "
            "step 1 (max |diff|") in problems["weights-differ"]["message"]
    assert "no problem found" not in text and found["steps"] == 4
    assert code == 0, text[-4000:]


@pytest.mark.skipif(not HAS_TF, reason="tensorflow is not installed")
def test_keras_fit_unsharded_data_overlap(tmp_path: Path) -> None:
    """Each rank shuffles all the samples its own way: fit's batches, hashed per sample, overlap."""
    code, found, text = audit(tmp_path, "keras_fit.py")
    problems = checks(found)
    assert list(problems) == ["sample-overlap"], found["text"]
    assert problems["sample-overlap"]["message"].startswith(
        "45% of the samples trained on in the first steps of the first epoch (25 of 55) were "
        "seen by more than one rank")
    assert problems["sample-overlap"]["details"]["overlap"] == pytest.approx(25 / 55)
    assert code == 0, text[-4000:]


@pytest.mark.skipif(not HAS_TF, reason="tensorflow is not installed")
def test_keras_fit_sharded_has_no_problem(tmp_path: Path) -> None:
    """Sharded data, batch-norm statistics of each rank's own, a frozen layer loaded everywhere."""
    assert_clean(*audit(tmp_path, "keras_fit.py", "--right", mode="--audit=strict"))


@pytest.mark.skipif(not HAS_TF, reason="tensorflow is not installed")
def test_keras_optimizer_never_wrapped_and_frozen_layer_loaded_on_rank_0_only(
        tmp_path: Path) -> None:
    """Two defects in one run (one TF start-up): gradients applied as each rank computed them,
    found at step 1; a frozen layer's weights that only rank 0 loaded, found before step 1."""
    code, found, text = audit(tmp_path, "keras_fit.py", "--unwrapped", "--late-load")
    problems = checks(found)
    assert list(problems) == ["not-averaged", "weights-differ", "buffers-differ"], found["text"]
    assert "`sequential/head` differ across ranks at step 1: they were never averaged" in (
        problems["not-averaged"]["message"])
    assert "sequential/head/kernel" in problems["not-averaged"]["details"]["parameters"]
    assert problems["buffers-differ"]["message"].startswith(
        "non-trainable weights of `sequential/frozen` differ across ranks before the first step")
    assert problems["buffers-differ"]["fix"] == audit_report.FIX_BUFFERS
    assert code == 0, text[-4000:]
