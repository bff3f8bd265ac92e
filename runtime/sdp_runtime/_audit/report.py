"""Compare the ranks' audit records and say what is wrong, each problem with a one-line fix.

``analyse`` takes the records of every rank (``load``), ``text`` and ``as_json`` present the
result. ``sdp-run`` calls ``finish_in_launcher`` once the job has ended (also when it failed);
under another launcher rank 0 calls ``finish_in_rank`` when it exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from . import _overlap, _script
from ._script import Script

#: Exit status of ``sdp-run --audit=strict`` (and of rank 0 under another launcher) when the job
#: itself succeeded but the audit found a problem.
EXIT_AUDIT = 3

#: Two fingerprints are "identical" within this relative tolerance (the same data on two ranks
#: gives bit-identical sums on the CPU; float noise on a GPU stays far below it).
SAME_RTOL = 1e-6
#: Weights and averaged gradients "agree" within these (averaging gives every rank the same
#: numbers; the tolerance only absorbs float noise).
AGREE_RTOL, AGREE_ATOL = 1e-5, 1e-7
#: The fraction of shared samples that is a problem (padding a sampler repeats a few).
OVERLAP_LIMIT = 0.1

FIX_DATA = ("give each rank its own part of the data: DataLoader(..., sampler=DistributedSampler("
            "dataset)) (and sampler.set_epoch(epoch) each epoch) for PyTorch, "
            "dataset.shard(sdp.size(), sdp.rank()) before shuffle/batch for tf.data")
FIX_OVERLAP = ("split the data without overlap: a DistributedSampler (not a random subset drawn "
               "on each rank), or dataset.shard() before shuffling")
FIX_NOT_AVERAGED = ("average the gradients: wrap the model in sdp.DistributedDataParallel (or "
                    "the optimizer in sdp.DistributedOptimizer, the tape in "
                    "sdp.DistributedGradientTape) and train every parameter through it")
FIX_BYPASS = ("call the wrapped model itself (model(x)), so that its forward runs: compute the "
              "loss in forward() (or call the method from forward()); a method called on "
              "model.module, or reached through the wrapper's attributes, skips DDP's forward "
              "and with it the averaging of the gradients")
FIX_INIT = ("start every rank from the same weights: change the model before wrapping it (the "
            "wrap broadcasts rank 0's weights), or call sdp.broadcast_parameters("
            "model.state_dict(), root_rank=0) after the last change")
FIX_DIVERGED = ("train these parameters through the wrapped model or optimizer (so that their "
                "gradients are averaged) and change weights the same way on every rank")
FIX_BUFFERS = ("change buffers and non-trainable weights the same way on every rank (not in an "
               "`if rank == 0` block), or broadcast them from rank 0 after the last change: "
               "sdp.broadcast_parameters(model.state_dict(), root_rank=0) for PyTorch, "
               "sdp.broadcast_variables(model.variables, root_rank=0) for TF/Keras")
FIX_STEPS = ("give every rank the same number of batches (DistributedSampler pads; sdp.shard() "
             "evens tf.data) and never leave the training loop on one rank only")
FIX_SAME_FILE = ("write it on one rank only (if sdp.rank() == 0: ...), or give each rank its own "
                 "file name")
FIX_READ_WRITE = ("make the readers wait until the writer is done: sdp.barrier() (or "
                  "torch.distributed.barrier()) after the write and before the read")
FIX_DOWNLOAD = ("download once (on rank 0, or local rank 0 of each machine), then sdp.barrier() "
                "before the other ranks read the files")


@dataclass
class Problem:
    check: str
    message: str
    fix: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Report:
    ranks: list[int]
    size: int
    steps: int
    problems: list[Problem] = field(default_factory=list)
    notes: list[Problem] = field(default_factory=list)
    #: The job's exit status, where the launcher knows it (non-zero: it failed).
    status: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


# --------------------------------------------------------------------------------------------
# Reading the records


def load(folder: str) -> dict[int, list[dict[str, Any]]]:
    """Every rank's records in ``folder`` (``rank<N>.jsonl``), by rank."""
    out: dict[int, list[dict[str, Any]]] = {}
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(folder)):
            if not (name.startswith("rank") and name.endswith(".jsonl")):
                continue
            records = []
            with contextlib.suppress(OSError), open(os.path.join(folder, name)) as f:
                for line in f:
                    with contextlib.suppress(ValueError):
                        records.append(json.loads(line))
            if records:
                out[int(records[0].get("rank", name[4:-6]))] = records
    return out


# --------------------------------------------------------------------------------------------
# The checks


def analyse(by_rank: Mapping[int, list[dict[str, Any]]]) -> Report:
    """What the ranks' records show, as a report.

    Example:
        >>> analyse(load("/tmp/sdp-audit-x")).ok
        True
    """
    ranks = sorted(by_rank)
    size = max([int(r.get("size", 0)) for rs in by_rank.values() for r in rs
                if r.get("kind") == "start"] + [len(ranks)])
    ends = {r: next((x for x in recs if x.get("kind") == "end"), None)
            for r, recs in by_rank.items()}
    report = Report(ranks, size, _steps(ends))
    if len(ranks) < 2:
        return report
    script = _script.read(by_rank)
    _same_data(report, by_rank, script)
    _not_averaged(report, by_rank, script)
    _weights(report, by_rank, ends, script)
    _buffers(report, by_rank, ends, script)
    _unequal_steps(report, ends)
    _files(report, by_rank)
    _connections(report, by_rank)
    missing = [r for r, e in ends.items() if e is None]
    if missing:
        report.notes.append(Problem(
            "no-end", f"{_ranks(missing)} left no end record (stopped or killed before the "
            "end): their final weights and steps were not compared", "", {"ranks": missing}))
    absent = [r for r in range(size) if r not in by_rank]
    if absent:
        report.notes.append(Problem(
            "no-records", f"no records from {_ranks(absent)} (another machine, or they never "
            "started): only {_ranks(ranks)} were compared", "", {"ranks": absent}))
    return report


def _steps(ends: Mapping[int, dict[str, Any] | None]) -> int:
    best = 0
    for e in ends.values():
        if e:
            counts = [*e.get("torch_steps", []), *e.get("tf_steps", {}).values(),
                      *e.get("keras_iterations", [])]
            best = max([best, *counts])
    return best


def _by_step(by_rank: Mapping[int, list[dict[str, Any]]], kind: str
             ) -> dict[tuple[str, int], dict[int, dict[str, Any]]]:
    out: dict[tuple[str, int], dict[int, dict[str, Any]]] = {}
    for r, recs in by_rank.items():
        for x in recs:
            if x.get("kind") == kind:
                out.setdefault((str(x.get("opt")), int(x["step"])), {})[r] = x
    return out


def _close(a: float, b: float, rtol: float, atol: float = 0.0) -> bool:
    return abs(a - b) <= atol + rtol * max(abs(a), abs(b))


def _same_vectors(a: Mapping[str, list[float]], b: Mapping[str, list[float]]) -> bool:
    if set(a) != set(b):
        return False
    return all(_close(x, y, SAME_RTOL) for k in a for x, y in zip(a[k], b[k], strict=False))


def _same_data(report: Report, by_rank: Mapping[int, list[dict[str, Any]]],
               script: Script) -> None:
    grads = _by_step(by_rank, "grads")
    # pairs of ranks whose local gradients were identical at every step compared
    same: dict[tuple[int, int], list[int]] = {}
    differ: set[tuple[int, int]] = set()
    for (_opt, step), recs in sorted(grads.items(), key=lambda kv: kv[0][1]):
        local = {r: x.get("local") or {} for r, x in recs.items() if x.get("local")}
        rs = sorted(local)
        for i, a in enumerate(rs):
            for b in rs[i + 1:]:
                nonzero = any(v[1] for v in local[a].values())
                if nonzero and _same_vectors(local[a], local[b]):
                    same.setdefault((a, b), []).append(step)
                else:
                    differ.add((a, b))
    pairs = {p: steps for p, steps in same.items() if p not in differ}
    overlap = _overlap.measure(by_rank, script.loaders)
    if not pairs and not any(x.get("local") for recs in grads.values() for x in recs.values()):
        # no local gradient seen (a Keras optimizer's applied ones only): the inputs alone
        pairs = {p: s for p, s in _same_inputs(by_rank).items()}
    loader = f" through {_script.loader_text(overlap.loader)}" if overlap and overlap.loader else ""
    if pairs:
        involved = sorted({r for p in pairs for r in p})
        steps = sorted({s for ss in pairs.values() for s in ss})
        details: dict[str, Any] = {"ranks": involved, "steps": steps}
        shared = ""
        if overlap is not None:
            details["overlap"] = overlap.fraction
            scope = "" if overlap.scope == "first steps" else f" {_scope(overlap)}"
            shared = f" ({overlap.fraction:.0%} of the samples{scope} seen by more than one rank)"
            if overlap.loader:
                details["loader"] = _loader_details(overlap.loader)
        report.problems.append(Problem(
            "same-data", f"{_ranks(involved)} computed identical gradients at {_steps_text(steps)}"
            f": every rank reads the same batches (the training data is not split){shared}"
            f"{loader}", FIX_DATA, details))
        return
    if overlap is None:
        return
    if _overlap.drawn_with_replacement(overlap):
        return  # chance meetings of independent draws (identical ones are caught above)
    if overlap.fraction >= OVERLAP_LIMIT and overlap.shared >= report.size:
        details = {"overlap": overlap.fraction, "shared": overlap.shared,
                   "samples": overlap.total, "scope": overlap.scope}
        unsplit = bool(overlap.loader and not overlap.loader.get("split"))
        how = ""
        if overlap.whole:
            how = " (every rank read the whole data set"
            how += ")" if not unsplit else (", in the same order)" if overlap.same_order
                                            else ", each in its own order)")
        if overlap.loader:
            details["loader"] = _loader_details(overlap.loader)
            how += f" through {_script.loader_text(overlap.loader)}"
        report.problems.append(Problem(
            "sample-overlap", f"{overlap.fraction:.0%} of the samples {_scope(overlap)} "
            f"({overlap.shared} of {overlap.total}) were seen by more than one rank{how}: the "
            "ranks' data overlaps", FIX_DATA if unsplit and overlap.whole else FIX_OVERLAP,
            details))


def _scope(overlap: _overlap.Overlap) -> str:
    return {"epoch": "of the first epoch",
            "planned": "of the first epoch (as its sampler reads it; the job ended before it did)",
            "first steps": "trained on in the first steps of the first epoch"}[overlap.scope]


def _loader_details(rec: Mapping[str, Any]) -> dict[str, Any]:
    return {k: rec.get(k) for k in ("name", "where", "sampler", "split", "dataset", "len")}


def _same_inputs(by_rank: Mapping[int, list[dict[str, Any]]]) -> dict[tuple[int, int], list[int]]:
    steps = _by_step(by_rank, "inputs")
    same: dict[tuple[int, int], list[int]] = {}
    differ: set[tuple[int, int]] = set()
    for (_o, step), recs in steps.items():
        rs = sorted(recs)
        for i, a in enumerate(rs):
            for b in rs[i + 1:]:
                if recs[a].get("samples") and recs[a]["samples"] == recs[b].get("samples"):
                    same.setdefault((a, b), []).append(step)
                else:
                    differ.add((a, b))
    return {p: s for p, s in same.items() if p not in differ}


def _not_averaged(report: Report, by_rank: Mapping[int, list[dict[str, Any]]],
                  script: Script) -> None:
    for (opt, step), recs in sorted(_by_step(by_rank, "grads").items(), key=lambda kv: kv[0][1]):
        applied = {r: x["applied"] for r, x in recs.items() if x.get("applied") is not None}
        if len(applied) < 2:
            continue
        names = set.intersection(*(set(a) for a in applied.values()))
        bad = sorted(n for n in names if not _agree([a[n] for a in applied.values()]))
        if bad:
            cause, fix = _why_not_averaged(script, opt, bad)
            report.problems.append(Problem(
                "not-averaged", f"gradients of {script.modules(bad)} differ across ranks at step "
                f"{step}: they were never averaged" + (f": {cause}" if cause else ""), fix,
                {"step": step, "parameters": bad, **_objects(script, opt, bad)}))
            return


def _why_not_averaged(script: Script, opt: str, keys: list[str]) -> tuple[str, str]:
    """Why the gradients of ``keys`` (trained by ``opt``) were not averaged, in the script's
    terms, and the fix; ("", the general fix) when the records do not say."""
    ddps = sorted({script.wrapped[k] for k in keys if k in script.wrapped})
    for j in ddps:
        seen = script.bypass.get(j)
        if seen:
            site = seen.get("site") or {}
            call = ""
            if site.get("where") and site["where"] != "?":
                call = f"; the step called the model at {site['where']}"
                call += f" (`{site['code']}`)" if site.get("code") else ""
                call += ", past the wrapper"
            return (f"{script.wrapper(j)} wraps them, but backward ran with no call of its "
                    f"forward at {_steps_text(sorted(seen['steps']))}{call}, so DDP averaged "
                    "nothing", FIX_BYPASS)
    info = script.optimizers.get(opt)
    if not info:
        return "", FIX_NOT_AVERAGED
    if not ddps and not info.get("distributed"):
        return (f"{script.owner(keys)} is not wrapped in DistributedDataParallel and "
                f"{script.optimizer(opt)} is not a DistributedOptimizer", FIX_NOT_AVERAGED)
    return f"trained by {script.optimizer(opt)}", FIX_NOT_AVERAGED


def _objects(script: Script, opt: str, keys: list[str]) -> dict[str, Any]:
    """The script's objects a finding is about, for the JSON report."""
    out: dict[str, Any] = {"modules": list(dict.fromkeys(script.module(k) for k in keys))}
    if opt in script.optimizers:
        out["optimizer"] = script.optimizers[opt]
    ddps = sorted({script.wrapped[k] for k in keys if k in script.wrapped})
    if ddps:
        out["wrappers"] = [dict(script.ddps.get(j) or {}, bypassed=sorted(
            (script.bypass.get(j) or {}).get("steps", []))) for j in ddps]
    return out


def _agree(values: list[list[float]]) -> bool:
    first = values[0]
    return all(_close(x, y, AGREE_RTOL, AGREE_ATOL)
               for other in values[1:] for x, y in zip(first, other, strict=False))


def _weights(report: Report, by_rank: Mapping[int, list[dict[str, Any]]],
             ends: Mapping[int, dict[str, Any] | None], script: Script) -> None:
    points = sorted(_by_step(by_rank, "weights").items(), key=lambda kv: kv[0][1])
    # (step, parameters, max |diff|, optimizer, the records before and at the difference)
    found: list[tuple[int, list[str], float, str, Any, Any]] = []
    healed: list[tuple[str, list[str], int]] = []
    last: dict[str, dict[int, dict[str, Any]]] = {}  # optimizer -> its records last compared
    for (opt, step), recs in points:
        # Buffers are recorded but not compared: batch-norm statistics are updated by each
        # rank's own forward (DDP broadcasts rank 0's before the next one; Horovod keeps them).
        before = last.get(opt)
        last[opt] = recs
        bad, worst = _differ({r: x.get("params") or {} for r, x in recs.items()})
        if not bad:
            continue
        if step == 0:
            agreed = _agree_later(points, opt, bad, lambda x: x.get("params") or {})
            if agreed is not None:
                healed.append((opt, bad, agreed))  # made equal after the first step
                continue
        found.append((step, bad, worst, opt, before, recs))
    for _opt, bad, step in healed[:1]:
        report.notes.append(Problem(
            "weights-equal-after-step-1", f"parameters of {script.modules(bad)} differed across "
            f"ranks before the first step and agreed after step {step}: they were broadcast after "
            "the first update (as Horovod's BroadcastGlobalVariablesCallback does for a model "
            "built in its first step), which mixed gradients taken at different weights", "", {}))
    if found:
        step, bad, worst, opt, before, recs = min(found, key=lambda f: f[0])
        _weights_problem(report, script, by_rank, bad, worst, step, opt, before, recs)
        return
    finals = {r: {**{k: v for w in (e.get("torch_weights") or {}).values() for k, v in w.items()},
                  **(e.get("tf_weights") or {})} for r, e in ends.items() if e}
    if len(finals) >= 2:
        bad, worst = _differ(finals)
        if bad:
            opts = [o for o, recs in last.items()
                    if set(bad) & set(next(iter(recs.values())).get("params") or {})]
            opt = opts[0] if opts else ""
            _weights_problem(report, script, by_rank, bad, worst, None, opt, last.get(opt),
                             {r: e for r, e in ends.items() if e})


def _agree_later(points: list[tuple[tuple[str, int], dict[int, dict[str, Any]]]], opt: str,
                 bad: list[str], tensors: Any) -> int | None:
    """The step after which ``bad`` (different before the first step) agree, if they agree at
    the next record of ``opt``: a broadcast after the first update."""
    later = [(s, rs) for (o, s), rs in points if o == opt and s > 0]
    if later and not set(bad) & set(_differ({r: tensors(x) for r, x in later[0][1].items()})[0]):
        return later[0][0]
    return None


def _differ(tensors: Mapping[int, Mapping[str, list[Any]]]) -> tuple[list[str], float]:
    if len(tensors) < 2:
        return [], 0.0
    names = set.intersection(*(set(t) for t in tensors.values()))
    bad, worst = [], 0.0
    for n in sorted(names):
        prints = [t[n] for t in tensors.values()]
        first = prints[0]
        diff = 0.0
        differs = False
        for other in prints[1:]:
            for x, y in zip(first[2], other[2], strict=False):
                diff = max(diff, abs(x - y))
                differs |= not _close(x, y, AGREE_RTOL, AGREE_ATOL)
            for x, y in zip(first[:2], other[:2], strict=False):
                differs |= not _close(x, y, AGREE_RTOL, AGREE_ATOL)
        if differs:
            bad.append(n)
            worst = max(worst, diff)
    return bad, worst


def _weights_problem(report: Report, script: Script, by_rank: Mapping[int, list[dict[str, Any]]],
                     bad: list[str], worst: float, step: int | None, opt: str,
                     before: Mapping[int, dict[str, Any]] | None,
                     at: Mapping[int, dict[str, Any]]) -> None:
    where = ("before the first step" if step == 0 else "at the end" if step is None
             else f"after step {step}")
    diff = f" (max |diff| {worst:.2g})" if worst else ""
    details: dict[str, Any] = {"step": step, "parameters": bad, "max_abs_diff": worst,
                               **_objects(script, opt, bad)}
    if step == 0:
        why, fix = _why_apart_at_start(script, opt, bad), FIX_INIT
    else:
        why, fix = _why_apart(report, script, by_rank, opt, bad, before, at, details)
    report.problems.append(Problem(
        "weights-differ", f"parameters of {script.modules(bad)} differ across ranks {where}"
        f"{diff}: {why}", fix, details))


def _why_apart_at_start(script: Script, opt: str, keys: list[str]) -> str:
    ddps = sorted({script.wrapped[k] for k in keys if k in script.wrapped})
    info = script.optimizers.get(opt)
    if ddps:
        wrap = script.ddps.get(ddps[0]) or {}
        if wrap.get("where") and wrap["where"] != "?":
            named = f"`{wrap['name']}`" if wrap.get("name") else "the model"
            return ("each rank initialised them itself and they were not made equal "
                    f"(re-initialised after {named} was wrapped at {wrap['where']}?)")
    elif info and not info.get("distributed"):
        return (f"each rank initialised them itself and nothing made them equal "
                f"({script.owner(keys)} is not wrapped in DistributedDataParallel, whose wrap "
                "broadcasts rank 0's weights)")
    return ("each rank initialised them itself and they were not made equal "
            "(re-initialised after the wrap?)")


def _why_apart(report: Report, script: Script, by_rank: Mapping[int, list[dict[str, Any]]],
               opt: str, keys: list[str], before: Mapping[int, dict[str, Any]] | None,
               at: Mapping[int, dict[str, Any]], details: dict[str, Any]) -> tuple[str, str]:
    """Why weights that agreed went apart: gradients never averaged (in the script's terms),
    a file one rank read while another wrote it, or a change on some ranks only."""
    averaged = next((p for p in report.problems if p.check == "not-averaged"
                     and set(p.details.get("parameters", [])) & set(keys)), None)
    if averaged is not None:
        cause, fix = _why_not_averaged(script, opt, keys)
        why = "their gradients were never averaged" + (f": {cause}" if cause else "")
        return why, FIX_BYPASS if fix == FIX_BYPASS else FIX_DIVERGED
    if before:
        race = _file_race(by_rank, {r: float(x.get("time", 0)) for r, x in before.items()},
                          {r: float(x.get("time", 0)) for r, x in at.items()})
        if race is not None:
            details["file"] = race
            return race["message"], FIX_READ_WRITE
    cause, fix = _why_not_averaged(script, opt, keys)
    if fix == FIX_BYPASS:
        return f"their gradients were never averaged: {cause}", FIX_BYPASS
    return "not averaged (not wrapped?) or changed on one rank only", FIX_DIVERGED


def _file_race(by_rank: Mapping[int, list[dict[str, Any]]], low: Mapping[int, float],
               high: Mapping[int, float]) -> dict[str, Any] | None:
    """A file one rank read while another rank wrote it, both between ``low`` and ``high``
    (each rank's times of the last records that agreed and the first that did not)."""
    writes: dict[str, list[dict[str, Any]]] = {}
    reads: list[tuple[float, int, str, str]] = []
    for r, recs in by_rank.items():
        if r not in low or r not in high:
            continue
        for x in recs:
            if x.get("kind") != "file":
                continue
            if x["op"] == "write":
                writes.setdefault(x["path"], []).append(x)
            elif low[r] < x["start"] <= high[r]:
                reads.append((x["start"], r, x["path"], x.get("where", "?")))
    for t, reader, path, line in sorted(reads):
        ws = [w for w in writes.get(path, []) if w["rank"] != reader and w["rank"] in low
              and low[w["rank"]] < w["start"] <= high[w["rank"]]]
        if not ws:
            continue
        hit = _during(ws, reader, t, path)
        if hit is not None:
            how = f"while rank {hit['rank']} was still writing it ({hit.get('where', '?')})"
        else:
            later = sorted((w for w in ws if w["start"] > t), key=lambda w: w["start"])
            if not later:
                continue
            hit = later[0]
            how = (f"{hit['start'] - t:.1f} s before rank {hit['rank']} wrote it "
                   f"({hit.get('where', '?')}), with no barrier between: it loaded another "
                   f"version of the file than the one rank {hit['rank']} wrote from its weights")
        return {"path": path, "reader": reader, "writer": hit["rank"], "line": line,
                "message": f"rank {reader} read {_show(path)} ({line}) {how}"}
    return None


def _buffers(report: Report, by_rank: Mapping[int, list[dict[str, Any]]],
             ends: Mapping[int, dict[str, Any] | None], script: Script) -> None:
    """Buffers and non-trainable weights that must agree: not broadcast by DDP before each
    forward, not batch-norm statistics (each rank's own batches update those)."""
    def compared(buffers: Mapping[str, list[Any]]) -> dict[str, list[Any]]:
        return {n: b[:3] for n, b in buffers.items() if len(b) > 3 and b[3] == ""}

    points = sorted(_by_step(by_rank, "weights").items(), key=lambda kv: kv[0][1])
    for (opt, step), recs in points:
        bad, worst = _differ({r: compared(x.get("buffers") or {}) for r, x in recs.items()})
        if bad and step == 0 and _agree_later(
                points, opt, bad, lambda x: compared(x.get("buffers") or {})) is not None:
            continue  # broadcast after the first step (the parameters' note says so)
        if bad:
            _buffers_problem(report, script, bad, worst, step)
            return
    finals = {r: compared({**(e.get("torch_buffers") or {}), **(e.get("tf_buffers") or {})})
              for r, e in ends.items() if e}
    bad, worst = _differ(finals)
    if bad:
        _buffers_problem(report, script, bad, worst, None)


def _buffers_problem(report: Report, script: Script, bad: list[str], worst: float,
                     step: int | None) -> None:
    where = ("before the first step" if step == 0 else "at the end" if step is None
             else f"after step {step}")
    if any("/" in n for n in bad):  # Keras: the layers' non-trainable weights
        what = f"non-trainable weights of {script.modules(bad)}"
    else:  # torch: each buffer, by its name in the script
        what = "buffers " + script.names(bad)
    diff = f" (max |diff| {worst:.2g})" if worst else ""
    report.problems.append(Problem(
        "buffers-differ", f"{what} differ across ranks {where}"
        f"{diff}: set or changed on some ranks only, or computed from each rank's own data "
        "(no gradient averaging makes them agree)", FIX_BUFFERS,
        {"step": step, "buffers": bad, "max_abs_diff": worst}))


def _unequal_steps(report: Report, ends: Mapping[int, dict[str, Any] | None]) -> None:
    done = {r: e for r, e in ends.items() if e}
    if len(done) < 2:
        return
    for what, counts in (
        ("optimizer steps", {r: e.get("torch_steps") or [] for r, e in done.items()}),
        ("gradient reductions", {r: sorted((e.get("tf_steps") or {}).items())
                                 for r, e in done.items()}),
        ("Keras optimizer steps", {r: e.get("keras_iterations") or [] for r, e in done.items()}),
        ("training forward passes", {r: [e.get("forwards", 0)] for r, e in done.items()}),
    ):
        if len({json.dumps(c) for c in counts.values()}) > 1:
            totals = {r: _total(c) for r, c in counts.items()}
            listed = ", ".join(f"rank {r} {n}" for r, n in sorted(totals.items()))
            first = min(totals.values()) + 1
            report.problems.append(Problem(
                "unequal-steps", f"the ranks made different numbers of {what} ({listed}): they "
                f"differ from step {first} on", FIX_STEPS, {"counts": totals, "first": first}))
            return


def _total(counts: Iterable[Any]) -> int:
    total = 0
    for c in counts:
        total += int(c[1]) if isinstance(c, (list, tuple)) else int(c)
    return total


def _files(report: Report, by_rank: Mapping[int, list[dict[str, Any]]]) -> None:
    writes: dict[str, list[dict[str, Any]]] = {}
    reads: dict[str, list[tuple[int, float, str]]] = {}
    for r, recs in by_rank.items():
        end = next((x for x in recs if x.get("kind") == "end"), {}) or {}
        last_reads = end.get("reads") or {}
        for x in recs:
            if x.get("kind") != "file":
                continue
            if x["op"] == "write":
                writes.setdefault(x["path"], []).append(x)
            else:
                reads.setdefault(x["path"], []).append((r, x["start"], x.get("where", "?")))
                last = last_reads.get(x["path"])
                if last and last[1] != x["start"]:
                    reads[x["path"]].append((r, last[1], x.get("where", "?")))
    for path, ws in sorted(writes.items()):
        writers = sorted({w["rank"] for w in ws})
        if len(writers) > 1:
            lines = sorted({w.get("where", "?") for w in ws})
            report.problems.append(Problem(
                "same-file", f"{_ranks(writers)} all wrote {_show(path)} ({', '.join(lines)})",
                FIX_SAME_FILE, {"path": path, "ranks": writers, "lines": lines}))
    for path, rs in sorted(reads.items()):
        ws = writes.get(path)
        if not ws:
            continue
        for reader, t, line in rs:
            hit = _during(ws, reader, t, path)
            if hit is not None:
                report.problems.append(Problem(
                    "read-during-write", f"rank {reader} read {_show(path)} ({line}) while "
                    f"rank {hit['rank']} was still writing it ({hit.get('where', '?')})",
                    FIX_READ_WRITE, {"path": path, "reader": reader, "writer": hit["rank"],
                                     "line": line}))
                break


def _during(ws: list[dict[str, Any]], reader: int, t: float, path: str) -> dict[str, Any] | None:
    """The write by another rank that ``t`` (a read by ``reader``) falls into, if any."""
    try:
        mtime = os.stat(path).st_mtime
    except OSError:
        mtime = None
    by_writer: dict[int, list[dict[str, Any]]] = {}
    for w in ws:
        if w["rank"] != reader:
            by_writer.setdefault(w["rank"], []).append(w)
    for writes in by_writer.values():
        writes.sort(key=lambda w: w["start"])
        for i, w in enumerate(writes):
            end = w.get("end")
            if end is None:  # an open(): it ends when the file was last changed, if it was last
                end = max(w["start"], mtime or 0.0) if i == len(writes) - 1 else w["start"]
            if w["start"] <= t <= end:
                return w
    return None


def _connections(report: Report, by_rank: Mapping[int, list[dict[str, Any]]]) -> None:
    hosts: dict[str, dict[int, str]] = {}
    for r, recs in by_rank.items():
        for x in recs:
            if x.get("kind") == "connect":
                hosts.setdefault(x["host"], {}).setdefault(r, x.get("where", "?"))
    for host, who in sorted(hosts.items()):
        if len(who) > 1:
            line = sorted(set(who.values()))[0]
            report.notes.append(Problem(
                "download", f"{_ranks(sorted(who))} each connected to {host} ({line}): every "
                "rank downloads the same thing", FIX_DOWNLOAD,
                {"host": host, "ranks": sorted(who)}))


# --------------------------------------------------------------------------------------------
# Presenting


def _ranks(ranks: Iterable[int]) -> str:
    rs = sorted(set(ranks))
    if len(rs) == 1:
        return f"rank {rs[0]}"
    if rs == list(range(rs[0], rs[-1] + 1)):
        return f"ranks {rs[0]}-{rs[-1]}"
    return "ranks " + ", ".join(map(str, rs))


def _steps_text(steps: list[int]) -> str:
    if len(steps) == 1:
        return f"step {steps[0]}"
    if steps == list(range(steps[0], steps[-1] + 1)):
        return f"steps {steps[0]}-{steps[-1]}"
    return "steps " + ", ".join(map(str, steps))


def _show(path: str) -> str:
    rel = os.path.relpath(path)
    return rel if not rel.startswith("..") else path


def text(report: Report) -> str:
    """The block printed at the end of the job."""
    n_ranks = len(report.ranks)
    ranks = f"{n_ranks} rank{'s' if n_ranks != 1 else ''}" if n_ranks == report.size else (
        f"{n_ranks} of {report.size} ranks")
    steps = f"{report.steps} step" + ("s" if report.steps != 1 else "")
    if len(report.ranks) < 2:
        head = f"sdp audit: nothing to compare ({ranks})"
    elif report.ok and report.status:
        # The job stopped: what did not run was not checked; never "no problem" alone.
        head = (f"sdp audit: no problem found in the {steps} that ran ({ranks}), but the job "
                f"failed (exit status {report.status}): the rest of the training was not checked")
    elif report.ok:
        head = f"sdp audit: no problem found in {steps} ({ranks})"
    else:
        n = len(report.problems)
        head = f"sdp audit: {n} problem{'s' if n > 1 else ''} found in {steps} ({ranks}):"
    lines = [head]
    for p in report.problems:
        lines += [f"  - {p.message}", f"    fix: {p.fix}"]
    for p in report.notes:
        lines.append(f"  note: {p.message}" + (f"; {p.fix}" if p.fix else ""))
    return "\n".join(lines)


def as_json(report: Report) -> dict[str, Any]:
    return {"ok": report.ok, "status": report.status, "ranks": report.ranks,
            "size": report.size, "steps": report.steps,
            "problems": [asdict(p) for p in report.problems],
            "notes": [asdict(p) for p in report.notes], "text": text(report)}


def _publish(report: Report, json_path: str | None) -> None:
    print(text(report), file=sys.stderr, flush=True)
    if json_path:
        try:
            with open(json_path, "w", encoding="utf-8") as f:
                json.dump(as_json(report), f, indent=2)
        except OSError as error:
            print(f"sdp audit: cannot write {json_path}: {error.strerror}", file=sys.stderr)


def finish_in_launcher(folder: str, mode: str, json_path: str | None, status: int) -> int:
    """``sdp-run``'s end: report on the job's records; the exit status to return."""
    report = analyse(load(folder))
    report.status = status
    _publish(report, json_path)
    if status == 0 and mode == "strict" and not report.ok:
        return EXIT_AUDIT
    return status


def finish_in_rank(rec: Any) -> int:
    """Rank 0's end under another launcher: wait (bounded) for the others' end records, report,
    and return the exit status strict mode asks for (0: leave it as it is)."""
    wait = 10.0
    with contextlib.suppress(ValueError):
        wait = float(os.environ.get("SDP_EXIT_WAIT", "") or wait)
    deadline = time.monotonic() + wait
    def records() -> dict[int, list[dict[str, Any]]]:
        # The folder is named after the rendezvous: a file left by an earlier, bigger job
        # that met at the same address is not this job's.
        return {r: rs for r, rs in load(rec.folder).items() if r < rec.size}

    while time.monotonic() < deadline:
        found = records()
        if len(found) >= rec.size and all(
                any(x.get("kind") == "end" for x in rs) for rs in found.values()):
            break
        time.sleep(0.05)
    report = analyse(records())
    _publish(report, rec.conf.report)
    return EXIT_AUDIT if rec.conf.mode == "strict" and not report.ok else 0
