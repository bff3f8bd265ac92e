"""The audit's comparison of the ranks' records (``sdp_runtime._audit.report.analyse``), on
records written by hand: what is a problem, what is not (no processes)."""

from __future__ import annotations

import base64
import os
import time
from pathlib import Path
from typing import Any

from sdp_runtime._audit import report


def start(rank: int, size: int = 2) -> dict[str, Any]:
    return {"kind": "start", "rank": rank, "size": size}


def grads(rank: int, opt: str, step: int, local: dict[str, list[float]],
          applied: dict[str, list[float]] | None = None) -> dict[str, Any]:
    return {"kind": "grads", "rank": rank, "opt": opt, "step": step, "local": local,
            "applied": applied}


def end(rank: int, steps: list[int], forwards: int = 0, **extra: Any) -> dict[str, Any]:
    return {"kind": "end", "rank": rank, "torch_steps": steps, "forwards": forwards, **extra}


def checks(found: report.Report) -> list[str]:
    return [p.check for p in found.problems]


def test_identical_local_gradients_are_the_same_data() -> None:
    recs = {r: [start(r), *(grads(r, "0", s, {"fc.weight": [0.5 * s, 1.0 * s]})
                            for s in range(1, 6)), end(r, [5])] for r in (0, 1)}
    found = report.analyse(recs)
    assert checks(found) == ["same-data"]
    assert found.problems[0].message.startswith("ranks 0-1 computed identical gradients at "
                                                "steps 1-5: every rank reads the same batches")


def test_one_site_identical_and_another_different_is_split_data() -> None:
    """A GAN's generator sees only noise drawn alike on every rank; its discriminator sees the
    rank's own images: the data is split."""
    recs = {r: [start(r), grads(r, "gen", 1, {"g.w": [1.0, 2.0]}),
                grads(r, "disc", 1, {"d.w": [1.0 + r, 2.0]}), end(r, [1, 1])] for r in (0, 1)}
    assert checks(report.analyse(recs)) == []


def test_zero_gradients_prove_nothing() -> None:
    recs = {r: [start(r), grads(r, "0", 1, {"w": [0.0, 0.0]}), end(r, [1])] for r in (0, 1)}
    assert checks(report.analyse(recs)) == []


def test_gradients_applied_unaveraged_are_named_by_module() -> None:
    recs = {r: [start(r), grads(r, "0", 1, {"head.fc.weight": [r, 1.0]},
                                {"head.fc.weight": [r, 1.0], "body.weight": [3.0, 3.0]}),
                end(r, [1])] for r in (0, 1)}
    found = report.analyse(recs)
    assert checks(found) == ["not-averaged"]
    assert "gradients of `head.fc` differ across ranks at step 1" in found.problems[0].message


def test_weights_before_and_after_the_first_step() -> None:
    def weights(rank: int, step: int, value: float) -> dict[str, Any]:
        return {"kind": "weights", "rank": rank, "opt": "0", "step": step,
                "params": {"fc.weight": [value, abs(value), [value]]}}

    drift = {r: [start(r), weights(r, 0, 1.0), weights(r, 1, 1.0 + 0.25 * r), end(r, [1])]
             for r in (0, 1)}
    found = report.analyse(drift)
    assert checks(found) == ["weights-differ"]
    assert ("parameters of `fc` differ across ranks after step 1 (max |diff| 0.25)"
            in found.problems[0].message)
    start_apart = {r: [start(r), weights(r, 0, 1.0 + r), end(r, [1])] for r in (0, 1)}
    assert "before the first step" in report.analyse(start_apart).problems[0].message
    noise = {r: [start(r), weights(r, 1, 1.0 + 1e-9 * r), end(r, [1])] for r in (0, 1)}
    assert checks(report.analyse(noise)) == []


def test_unequal_steps_name_the_counts_and_first_step() -> None:
    recs = {0: [start(0), end(0, [5])], 1: [start(1), end(1, [4])]}
    found = report.analyse(recs)
    assert checks(found) == ["unequal-steps"]
    assert "(rank 0 5, rank 1 4): they differ from step 5 on" in found.problems[0].message


def test_sample_overlap_from_a_tenth_on() -> None:
    def inputs(rank: int, hashes: list[str]) -> dict[str, Any]:
        return {"kind": "inputs", "rank": rank, "step": 1, "samples": hashes}

    shared = {r: [start(r), inputs(r, ["a", "b", f"x{r}", f"y{r}"]), end(r, [1])] for r in (0, 1)}
    found = report.analyse(shared)
    assert checks(found) == ["sample-overlap"]
    assert found.problems[0].message.startswith("33% of the samples")
    padding = {r: [start(r), inputs(r, ["a", *[f"{r}-{i}" for i in range(20)]]), end(r, [1])]
               for r in (0, 1)}
    assert checks(report.analyse(padding)) == []  # one repeated sample: a sampler's padding


def test_files_written_twice_and_read_while_written(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.pt"
    path.write_text("x")
    t = time.time()
    os.utime(path, (t + 2, t + 2))  # the writer's last change: 2 s after it opened the file

    def file(rank: int, op: str, when: float, end_: float | None = None) -> dict[str, Any]:
        return {"kind": "file", "rank": rank, "op": op, "path": str(path), "start": when,
                "end": end_, "where": f"train.py:{10 + rank}"}

    racing = {0: [start(0), file(0, "write", t), end(0, [1])],
              1: [start(1), file(1, "read", t + 1), end(1, [1])]}
    found = report.analyse(racing)
    assert checks(found) == ["read-during-write"]
    assert "rank 1 read" in found.problems[0].message
    after = {0: [start(0), file(0, "write", t), end(0, [1])],
             1: [start(1), file(1, "read", t + 3), end(1, [1])]}
    assert checks(report.analyse(after)) == []
    before = {0: [start(0), file(0, "write", t), end(0, [1])],
              1: [start(1), file(1, "read", t - 5), end(1, [1])]}  # a resume, read at start
    assert checks(report.analyse(before)) == []
    both = {r: [start(r), file(r, "write", t, t), end(r, [1])] for r in (0, 1)}
    found = report.analyse(both)
    assert checks(found) == ["same-file"]
    assert "(train.py:10, train.py:11)" in found.problems[0].message


def test_downloads_are_notes_and_one_rank_has_nothing_to_compare() -> None:
    recs = {r: [start(r), {"kind": "connect", "rank": r, "host": "example.org", "ip": "1.2.3.4",
                           "port": 443, "where": "data.py:3"}, end(r, [1])] for r in (0, 1)}
    found = report.analyse(recs)
    assert found.ok and [n.check for n in found.notes] == ["download"]
    assert report.text(found).startswith("sdp audit: no problem found in 1 step (2 ranks)")
    alone = report.analyse({0: [start(0, 1), end(0, [3])]})
    assert report.text(alone) == "sdp audit: nothing to compare (1 rank)"


def test_weights_broadcast_after_the_first_step_are_a_note() -> None:
    """Horovod's callback broadcasts a model Keras builds in its first step after that step."""
    def weights(rank: int, step: int, value: float) -> dict[str, Any]:
        return {"kind": "weights", "rank": rank, "opt": "tf:a", "step": step,
                "params": {"dense/kernel": [value, abs(value), [value]]}}

    recs = {r: [start(r), weights(r, 0, 1.0 + r), weights(r, 1, 2.0), end(r, [1])]
            for r in (0, 1)}
    found = report.analyse(recs)
    assert found.ok
    assert [n.check for n in found.notes] == ["weights-equal-after-step-1"]


def test_overlap_counts_the_first_epoch_only() -> None:
    """A shuffling DistributedSampler gives rank 1 in epoch 2 samples rank 0 had in epoch 1."""
    def inputs(rank: int, step: int, hashes: list[str]) -> dict[str, Any]:
        return {"kind": "inputs", "rank": rank, "step": step, "samples": hashes}

    epoch1 = {0: [["a", "b"], ["c", "d"]], 1: [["e", "f"], ["g", "h"]]}
    epoch2 = {0: [["e", "c"], ["g", "a"]], 1: [["b", "h"], ["d", "f"]]}
    recs = {r: [start(r), *(inputs(r, i + 1, h) for i, h in enumerate(epoch1[r] + epoch2[r])),
                end(r, [4])] for r in (0, 1)}
    assert checks(report.analyse(recs)) == []
    halves = {0: [["a", "b"], ["c", "d"]], 1: [["a", "x"], ["c", "y"]]}  # subsets that overlap
    recs = {r: [start(r), *(inputs(r, i + 1, h) for i, h in enumerate(halves[r])), end(r, [2])]
            for r in (0, 1)}
    found = report.analyse(recs)
    assert checks(found) == ["sample-overlap"]
    assert found.problems[0].message.startswith("33% of the samples")


def test_buffers_that_must_agree_are_compared_statistics_and_broadcast_ones_not() -> None:
    def weights(rank: int, step: int, scale: float, stats: float) -> dict[str, Any]:
        return {"kind": "weights", "rank": rank, "opt": "0", "step": step,
                "params": {"fc.weight": [1.0, 1.0, [1.0]]},
                "buffers": {"scale": [scale, abs(scale), [scale], ""],
                            "bn.running_mean": [stats, abs(stats), [stats], "statistics"],
                            "emb.table": [stats, abs(stats), [stats], "broadcast"]}}

    agree = {r: [start(r), weights(r, 1, 1.0, 0.5 + r), end(r, [1])] for r in (0, 1)}
    assert checks(report.analyse(agree)) == []  # statistics and broadcast buffers may differ
    one_rank = {r: [start(r), weights(r, 1, 1.0, 0.5), weights(r, 2, 0.9 + 0.1 * r, 0.5),
                    end(r, [2])] for r in (0, 1)}
    found = report.analyse(one_rank)
    assert checks(found) == ["buffers-differ"]
    assert found.problems[0].message.startswith(
        "buffers `scale` differ across ranks after step 2 (max |diff| 0.1): set or changed "
        "on some ranks only")
    assert found.problems[0].fix == report.FIX_BUFFERS
    at_end = {r: [start(r), end(r, [1], torch_buffers={"m.mask": [r, r, [r], ""]})]
              for r in (0, 1)}
    assert "buffers `m.mask` differ across ranks at the end" in report.analyse(
        at_end).problems[0].message


def test_non_trainable_weights_broadcast_after_the_first_step_are_no_problem() -> None:
    """Horovod's callback broadcasts a model Keras builds in its first step after that step."""
    def weights(rank: int, step: int, value: float) -> dict[str, Any]:
        return {"kind": "weights", "rank": rank, "opt": "keras:0", "step": step, "params": {},
                "buffers": {"seq/frozen/kernel": [value, abs(value), [value], ""]}}

    healed = {r: [start(r), weights(r, 0, 1.0 + r), weights(r, 1, 2.0), end(r, [1])]
              for r in (0, 1)}
    assert checks(report.analyse(healed)) == []
    kept = {r: [start(r), weights(r, 0, 1.0 + r), weights(r, 1, 2.0 + r), end(r, [1])]
            for r in (0, 1)}
    found = report.analyse(kept)
    assert checks(found) == ["buffers-differ"]
    assert found.problems[0].message.startswith(
        "non-trainable weights of `seq/frozen` differ across ranks before the first step")


def test_keras_applied_gradients_alone_leave_the_inputs_to_judge() -> None:
    """A Keras optimizer records only the gradients it applies: the batches' samples still
    say that every rank reads the same data."""
    recs = {r: [start(r), grads(r, "keras:0", 1, {}, {"d/kernel": [1.0, 1.0]}),
                {"kind": "inputs", "rank": r, "step": 1, "samples": ["a", "b"]}, end(r, [1])]
            for r in (0, 1)}
    found = report.analyse(recs)
    assert checks(found) == ["same-data"]
    assert "(100% of the samples seen by more than one rank)" in found.problems[0].message


# --------------------------------------------------------------------------------------------
# Issue 38: findings in the script's own terms


def names(rank: int, opt: str = "0", *, wrapped: bool = False) -> dict[str, Any]:
    """What a rank records at the optimizer's first step (``trainer.model`` holds the model)."""
    params = {"body.weight": "trainer.model.body.weight",
              "head.weight": "trainer.model.head.weight"}
    return {"kind": "names", "rank": rank, "opt": opt,
            "optimizer": {"name": "trainer.optimizer", "where": "train.py:25", "class": "SGD",
                          "distributed": False},
            "params": params, "owners": dict.fromkeys(params, "trainer.model"),
            "wrapped": dict.fromkeys(params, 0) if wrapped else {},
            "ddps": {"0": {"name": "trainer.model", "where": "train.py:31"}} if wrapped else {}}


def test_findings_name_the_scripts_objects_and_lines() -> None:
    recs = {r: [start(r), names(r), grads(r, "0", 1, {}, {"body.weight": [r, 1.0],
                                                           "head.weight": [r, 1.0]}),
                end(r, [1])] for r in (0, 1)}
    found = report.analyse(recs)
    assert checks(found) == ["not-averaged"]
    assert found.problems[0].message == (
        "gradients of `trainer.model.body`, `trainer.model.head` differ across ranks at step 1: "
        "they were never averaged: `trainer.model` is not wrapped in DistributedDataParallel and "
        "optimizer `trainer.optimizer` (made at train.py:25) is not a DistributedOptimizer")
    assert found.problems[0].fix == report.FIX_NOT_AVERAGED
    assert found.problems[0].details["optimizer"]["where"] == "train.py:25"


def test_a_bypassed_wrapper_is_the_cause_not_a_missing_wrap() -> None:
    site = {"where": "train.py:40", "code": "loss = model.module.compute_loss(x)"}
    recs = {r: [start(r), names(r, wrapped=True),
                {**grads(r, "0", 1, {}, {"body.weight": [r, 1.0]}), "bypassed": {"0": site}},
                {**grads(r, "0", 2, {}, {"body.weight": [r, 1.0]}), "bypassed": {"0": None}},
                end(r, [2])] for r in (0, 1)}
    found = report.analyse(recs)
    assert checks(found) == ["not-averaged"]
    assert found.problems[0].message.endswith(
        "they were never averaged: `trainer.model` (DistributedDataParallel made at train.py:31) "
        "wraps them, but backward ran with no call of its forward at steps 1-2; the step called "
        "the model at train.py:40 (`loss = model.module.compute_loss(x)`), past the wrapper, so "
        "DDP averaged nothing")
    assert found.problems[0].fix == report.FIX_BYPASS
    assert found.problems[0].details["wrappers"][0]["bypassed"] == [1, 2]


def test_weights_apart_after_a_read_of_a_file_another_rank_wrote_name_it(tmp_path: Path) -> None:
    path = str(tmp_path / "latest.pt")

    def weights(rank: int, step: int, value: float, when: float) -> dict[str, Any]:
        return {"kind": "weights", "rank": rank, "opt": "0", "step": step, "time": when,
                "params": {"weight": [value, abs(value), [value]]}}

    def file(rank: int, op: str, when: float, line: int) -> dict[str, Any]:
        return {"kind": "file", "rank": rank, "op": op, "path": path, "start": when,
                "end": when + 0.1 if op == "write" else None, "where": f"train.py:{line}",
                "how": "torch.save"}

    t = 1000.0
    agree_then_apart = {r: [start(r), weights(r, 2, 1.0, t), weights(r, 5, 1.0 + r, t + 5)]
                        for r in (0, 1)}
    stale = {0: [*agree_then_apart[0], file(0, "write", t + 3, 24), end(0, [5])],
             1: [*agree_then_apart[1], file(1, "read", t + 1, 29), end(1, [5])]}
    found = report.analyse(stale)
    assert checks(found) == ["weights-differ"]
    assert found.problems[0].message.startswith(
        "parameters of `weight` differ across ranks after step 5 (max |diff| 1): rank 1 read "
        f"{path} (train.py:29) 2.0 s before rank 0 wrote it (train.py:24), with no barrier "
        "between")
    assert found.problems[0].fix == report.FIX_READ_WRITE
    during = {0: [*agree_then_apart[0], file(0, "write", t + 1, 24), end(0, [5])],
              1: [*agree_then_apart[1], file(1, "read", t + 1.05, 29), end(1, [5])]}
    assert "while rank 0 was still writing it (train.py:24)" in report.analyse(
        during).problems[-1].message
    elsewhen = {0: [*agree_then_apart[0], file(0, "write", t - 3, 24), end(0, [5])],
                1: [*agree_then_apart[1], file(1, "read", t + 1, 29), end(1, [5])]}
    found = report.analyse(elsewhen)  # the write came before the weights last agreed
    assert found.problems[0].message.endswith("not averaged (not wrapped?) or changed on one "
                                              "rank only")


def loader(rank: int, epoch: set[int] | None, *, length: int = 8, content: str | None = "c",
           first: list[list[list[Any]]] | None = None, split: bool = False) -> dict[str, Any]:
    bits = None
    if epoch is not None:
        raw = bytearray((length + 7) // 8)
        for i in epoch:
            raw[i >> 3] |= 1 << (i & 7)
        bits = {"bits": base64.b64encode(bytes(raw)).decode(), "len": length,
                "how": "read"}
    return {"kind": "loader", "rank": rank, "loader": 0, "where": "train.py:12",
            "name": "train_loader", "trained": True, "complete": True, "sampler":
            "DistributedSampler" if split else "RandomSampler", "split": split,
            "dataset": "TensorDataset", "len": length, "content": content, "epoch": bits,
            "first": first if first is not None else [[[rank, f"h{rank}"]]]}


def test_overlap_is_measured_over_the_first_epoch() -> None:
    whole = {r: [start(r), loader(r, set(range(8)), first=[[[r, f"h{r}"], [7 - r, f"h{7 - r}"]]]),
                 end(r, [4])] for r in (0, 1)}
    found = report.analyse(whole)
    assert checks(found) == ["sample-overlap"]
    assert found.problems[0].message == (
        "100% of the samples of the first epoch (8 of 8) were seen by more than one rank (every "
        "rank read the whole data set, each in its own order) through loader `train_loader` "
        "(made at train.py:12, RandomSampler, not split by rank): the ranks' data overlaps")
    assert found.problems[0].fix == report.FIX_DATA
    halves = {r: [start(r), loader(r, set(range(r, 8, 2)), split=True), end(r, [4])]
              for r in (0, 1)}
    assert checks(report.analyse(halves)) == []
    # the same indices of data sets that differ (each rank loaded its own shard): no overlap
    shards = {r: [start(r), loader(r, set(range(8)), content=f"shard{r}"), end(r, [4])]
              for r in (0, 1)}
    assert checks(report.analyse(shards)) == []
    # no content fingerprint: samples hashed alike at the same index show the same data set
    alike = {r: [start(r), loader(r, set(range(8)), content=None,
                                  first=[[[3, "same"], [r, f"own{r}"]]]), end(r, [4])]
             for r in (0, 1)}
    assert checks(report.analyse(alike)) == ["sample-overlap"]
    unlike = {r: [start(r), loader(r, set(range(8)), content=None,
                                   first=[[[3, f"x{r}"], [r, f"own{r}"]]]), end(r, [4])]
              for r in (0, 1)}
    assert checks(report.analyse(unlike)) == []


def test_a_validation_loader_that_never_trained_is_not_compared() -> None:
    recs = {r: [start(r), {**loader(r, set(range(8))), "trained": False}, end(r, [4])]
            for r in (0, 1)}
    assert checks(report.analyse(recs)) == []
