"""How a rank leaves the job: fail fast, and never wait on a peer that may be gone.

A distributed job either finishes on every rank or stops on every rank within seconds. This module
gives ``_comm`` the three pieces that make that true, all of them outside the collectives (in the
rendezvous store, which every rank reaches without the backend):

- **Exit records.** Every rank posts how it left to the store (``done``: its script ended without
  an uncaught exception; ``failed``: the exception's one-line summary), with the number of
  collectives it ran. An uncaught exception is seen through ``sys.excepthook``; a rank that
  failed does not wait for anyone and does not tear the group down, so the launcher sees it
  exit at once and stops the others. Under ``sdp-run`` a failing rank also writes a small JSON
  record (``SDP_RUN_REPORT_DIR``) from which the launcher tells which rank failed first and why.
- **Leaving together, bounded.** A rank whose script ended cleanly waits for the others to end
  too (so that nobody destroys the group under a peer's last collective, which makes the peer
  abort with "terminate called without an active exception"), but only for
  ``SDP_EXIT_WAIT`` seconds (default 10), and not at all once a peer has failed or is stuck
  waiting for it in a collective.
- **A watchdog thread** (one poll of the store every 0.25 s) that notices when this rank has been
  blocked in a collective for a second after a peer left the job: that collective can never
  complete. It tells the leaving peer to go at once (Gloo then fails the collective immediately:
  the peer's connection closes) and, should the backend not notice (NCCL does not watch peers),
  ends this process itself a few seconds later with the reason.

The messages name the rank that left and how: "rank 1 finished its script (after 16
collectives) while rank 0 was waiting in allreduce #17 for it: the ranks ran different numbers of
steps" instead of a time-out after ``SDP_TIMEOUT`` seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

DEFAULT_EXIT_WAIT_S = 10.0
#: How long a collective must stay blocked after a peer left before it is declared stuck.
STUCK_AFTER_S = 1.0
#: After declaring itself stuck, how long a rank lets the backend fail the collective before it
#: ends the process itself.
ABORT_AFTER_S = 5.0
POLL_S = 0.25

_COMMUNICATION_HINTS = (
    "connection closed by peer", "connection reset by peer", "broken pipe", "connection refused",
    "nccl", "gloo", "timed out", "timeout", "process group", "processgroup", "communicationerror",
)
#: A peer's end of the connection went away: the error follows from that peer's exit even when
#: the peer left no record (killed by SIGKILL, out of memory).
_PEER_GONE_HINTS = ("connection closed by peer", "connection reset by peer", "broken pipe")


@dataclass
class _Tracker:
    """Which collective this rank is in (read by the watchdog; written around every collective)."""

    started: int = 0  # collectives started so far
    depth: int = 0
    current: str | None = None


@dataclass
class _Job:
    rank: int
    size: int
    store: Any
    prefix: str
    wait_s: float
    report_dir: str | None
    stop: threading.Event = field(default_factory=threading.Event)
    watchdog: threading.Thread | None = None
    failure: tuple[str, str] | None = None  # (summary, traceback) of this rank's uncaught error
    posted: bool = False
    stuck_message: str | None = None


tracker = _Tracker()
_job: _Job | None = None
_generation = 0
_hook_installed = False
_previous_hook: Callable[..., Any] | None = None


def start(rank: int, size: int, store: Any) -> None:
    """Begin watching this job (called by ``init()`` once the group exists, for size > 1)."""
    global _job, _generation
    _generation += 1  # every rank inits the same number of times: the same keys everywhere
    wait_s = _env_seconds("SDP_EXIT_WAIT", DEFAULT_EXIT_WAIT_S)
    job = _Job(rank, size, store, f"sdp_runtime/job{_generation}", wait_s,
               os.environ.get("SDP_RUN_REPORT_DIR") or None)
    _job = job
    tracker.started, tracker.depth, tracker.current = 0, 0, None
    _install_hook()
    job.watchdog = threading.Thread(target=_watch, args=(job,), name="sdp-watchdog", daemon=True)
    job.watchdog.start()


def enter(what: str) -> None:
    """Mark the start of a collective (cheap: two attribute writes)."""
    if tracker.depth == 0:
        tracker.started += 1
        tracker.current = what
    tracker.depth += 1


def leave() -> None:
    """Mark the end of a collective."""
    tracker.depth -= 1
    if tracker.depth == 0:
        tracker.current = None


def finish() -> bool:
    """Post how this rank leaves and wait (bounded) for the others.

    True when every rank ended its script cleanly: all of them may then take part in one last
    collective before the group is destroyed. False when this rank failed, or a peer failed, waits
    for this rank in a collective, or did not end within ``SDP_EXIT_WAIT`` s: leave at once.
    """
    global _job
    job, _job = _job, None
    if job is None:
        return False
    job.stop.set()
    if job.watchdog is not None:
        job.watchdog.join(timeout=2 * POLL_S)
    _post(job)
    if job.failure is not None:
        return False  # this rank failed: wait for nobody
    deadline = time.monotonic() + job.wait_s
    with contextlib.suppress(Exception):
        while True:
            records = _records(job)
            if any(r.get("status") != "done" for r in records.values()):
                return False  # a peer failed: nothing to wait for
            if len(records) == job.size:
                return True
            if _count(job, "stuck") > 0 or time.monotonic() > deadline:
                return False  # a peer waits in a collective for this rank, which has left it
            time.sleep(0.005)
    return False


def explain(what: str | None) -> str | None:
    """Why the collective ``what`` failed, from the peers' exit records; None if nobody left."""
    job = _job
    if job is None:
        return None
    if job.stuck_message is not None:
        return job.stuck_message
    with contextlib.suppress(Exception):
        records = _records(job)
        if records:
            return _describe(job, records, what, tracker.started)
    return None


# --------------------------------------------------------------------------------------------
# Records in the store (and for the launcher)


def _post(job: _Job) -> None:
    if job.posted:
        return
    job.posted = True
    summary, trace = job.failure or ("", "")
    peers_left = False
    with contextlib.suppress(Exception):
        peers_left = bool(_records(job))
    record = {
        "rank": job.rank,
        "status": "failed" if job.failure else "done",
        "error": summary,
        "collectives": tracker.started,
        "time": time.time(),
        "caused_by_peer": bool(job.failure) and follows_from_peer(summary, peers_left),
    }
    with contextlib.suppress(Exception):
        job.store.set(f"{job.prefix}/exit/{job.rank}", json.dumps(record))
        job.store.add(f"{job.prefix}/exits", 1)
    if job.failure and job.report_dir:
        _write_report(job.report_dir, {**record, "traceback": trace})


def _records(job: _Job) -> dict[int, dict[str, Any]]:
    """The exit records posted so far, by rank (this rank's own included once posted)."""
    if _count(job, "exits") == 0:
        return {}
    out = {}
    for r in range(job.size):
        key = f"{job.prefix}/exit/{r}"
        if job.store.check([key]):
            out[r] = json.loads(job.store.get(key))
    return out


def _count(job: _Job, name: str) -> int:
    return int(job.store.add(f"{job.prefix}/{name}", 0))


def _write_report(folder: str, record: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".rank", suffix=".tmp")
        with os.fdopen(fd, "w") as out:
            json.dump(record, out)
        os.replace(tmp, os.path.join(folder, f"rank{record['rank']}.json"))


def _describe(
    job: _Job, records: dict[int, dict[str, Any]], what: str | None, number: int
) -> str:
    others = {r: rec for r, rec in records.items() if r != job.rank}
    failed = [r for r, rec in others.items() if rec.get("status") != "done"]
    if what is None:  # a collective of torch's own (DDP's reducer): no number to give
        here = f"rank {job.rank} was still running"
    else:
        here = f"rank {job.rank} was waiting in {what} (collective #{number})"
    if failed:
        first = min(failed, key=lambda r: others[r].get("time", 0.0))
        return (f"rank {first} failed first ({others[first].get('error') or 'no message'}; its "
                f"output shows the traceback) while {here}; this rank stops because of it")
    if others:
        done = ", ".join(
            f"rank {r} ended its script (no uncaught error) after "
            f"{rec.get('collectives', '?')} collectives"
            for r, rec in sorted(others.items())
        )
        return (f"{done}, while {here} for it: the ranks ran different numbers of steps (give "
                "every rank the same number of batches: sdp.shard() evens tf.data input, "
                "DistributedSampler pads torch input; see docs/running.md, 'When a rank fails')")
    return f"{here} when the job ended"


# --------------------------------------------------------------------------------------------
# Uncaught exceptions


def _install_hook() -> None:
    global _hook_installed, _previous_hook
    if _hook_installed:
        return
    _hook_installed = True
    _previous_hook = sys.excepthook
    sys.excepthook = _excepthook


def _excepthook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
    job = _job
    if job is not None and job.failure is None:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        text = f"{kind.__name__}: {lines[0]}" if lines else kind.__name__
        job.failure = (text[:500], "".join(traceback.format_exception(kind, error, tb))[-8000:])
        # Post now, not at exit: the script's own atexit handlers run before sdp's shutdown,
        # and torchrun may stop this rank in them when another rank exits first.
        with contextlib.suppress(Exception):
            _post(job)
    if job is not None and job.failure is not None and _after_a_peer_failed(job):
        # A follow-on error (this rank's collective failed because a peer failed or vanished
        # first): one line, not a second traceback under the first one. The launcher shows the
        # first failing rank's traceback; this rank's is in its report (SDP_RUN_REPORT_DIR).
        with contextlib.suppress(Exception):
            reason = explain(tracker.current) or f"rank {job.rank} stops: a peer left the job"
            print(f"sdp_runtime: {reason} [{job.failure[0][:300]}] (its traceback is left out: "
                  "it follows from that failure)", file=sys.stderr, flush=True)
            return
    hook = _previous_hook or sys.__excepthook__
    hook(kind, error, tb)
    if job is not None and _is_communication(job.failure[0] if job.failure else ""):
        # torch's own collectives (DDP's reducer) do not pass through _comm: say here who left.
        with contextlib.suppress(Exception):
            reason = explain(tracker.current)
            if reason and reason not in str(error):
                print(f"sdp_runtime: {reason}", file=sys.stderr, flush=True)


def _after_a_peer_failed(job: _Job) -> bool:
    """Whether this rank's uncaught error only follows from another rank's failure: a
    communication error after a peer posted that it failed, or one whose Gloo/NCCL connection
    the peer hung up (a rank killed by SIGKILL posts nothing). A peer that ended its script
    cleanly is no failure: the error waiting for it is this rank's own (uneven steps)."""
    summary = job.failure[0] if job.failure else ""
    if not _is_communication(summary):
        return False
    try:
        records = _records(job)
    except Exception:
        return False
    if any(rec.get("status") != "done" for r, rec in records.items() if r != job.rank):
        return True
    low = summary.lower()
    hung_up = any(hint in low for hint in _PEER_GONE_HINTS)
    others = [r for r in records if r != job.rank]
    return not others and hung_up and ("gloo" in low or "nccl" in low)


def follows_from_peer(summary: str, peers_left: bool) -> bool:
    """Whether a failure (its first line) only followed from another rank's exit: a communication
    error after a peer had posted its exit, or one whose peer hung up (a peer killed by SIGKILL
    posts nothing). The launcher names such failures only when no rank failed on its own."""
    low = summary.lower()
    return _is_communication(summary) and (
        peers_left or any(hint in low for hint in _PEER_GONE_HINTS)
    )


def _is_communication(summary: str) -> bool:
    low = summary.lower()
    return any(hint in low for hint in _COMMUNICATION_HINTS)


# --------------------------------------------------------------------------------------------
# The watchdog


def _watch(job: _Job) -> None:
    seen: tuple[int, float] | None = None  # (collective number, when first seen blocked)
    declared = False
    while not job.stop.wait(POLL_S):
        try:
            if _count(job, "exits") == 0:
                continue
            number, what = tracker.started, tracker.current
            if what is None:
                seen = None
                continue
            now = time.monotonic()
            if seen is None or seen[0] != number:
                seen = (number, now)
                continue
            if not declared and now - seen[1] >= STUCK_AFTER_S:
                declared = True
                job.stuck_message = _describe(job, _records(job), what, number)
                job.store.add(f"{job.prefix}/stuck", 1)
            elif declared and now - seen[1] >= STUCK_AFTER_S + ABORT_AFTER_S:
                _abort(job)
                return
        except Exception:  # the store is gone: the launcher is tearing the job down
            return


def _abort(job: _Job) -> None:
    message = job.stuck_message or "a peer left the job during a collective"
    print(f"sdp_runtime: {message}", file=sys.stderr, flush=True)
    job.failure = (f"CommunicationError: {message}", "")
    with contextlib.suppress(Exception):
        _post(job)
    os._exit(1)


def _env_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return max(float(raw), 0.0)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not a number") from None
