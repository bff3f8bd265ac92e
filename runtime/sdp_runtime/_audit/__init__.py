"""The runtime audit: check, while the job trains, what no converter can prove.

Off by default. ``sdp-run --audit`` (or ``SDP_AUDIT=1`` under any launcher) turns it on in every
rank; each rank then records a few fingerprints of what it trains on and writes them, one JSON
line each, to ``SDP_AUDIT_DIR/rank<N>.jsonl``. At the end of the job (also when it fails) the
records of all ranks are compared (``report``) and one short block is printed: by ``sdp-run``
itself, or, under another launcher, by rank 0 when it exits.

What a rank records (``_torch``, ``_tf``, ``_files``):

- for the first ``SDP_AUDIT_STEPS`` (K, default 5) optimizer steps: per parameter, the sum and
  the sum of absolute values of the local gradient before any averaging, and of the gradient the
  optimizer applies (torch optimizers, Keras optimizers' ``apply``); the steps in which a
  DDP-wrapped parameter got a gradient without a forward of its wrapper, and the line that
  called the model past it; per sample of ``fit``'s first training batches, an 8-byte hash;
- at an optimizer's first step, the script's own names (``_names``): the expression that
  reaches each trained module (``trainer.model.body``), the optimizer, its DDP wrappers and the
  DataLoaders, and the line that made each;
- per DataLoader, at the end of its first pass: its sampler and data set, the indices the pass
  read, a hash of each sample of its first K batches, and whether an optimizer stepped on its
  batches;
- a fingerprint (sum, sum of |x|, up to 32 strided values) of every trained parameter and buffer
  (Keras: non-trainable weight; each buffer marked with why ranks may differ: ``broadcast`` by
  DDP, ``statistics`` of a batch norm, or ``""``: they must agree) before step 1, after steps 1,
  2 and K, every ``SDP_AUDIT_EVERY`` steps after (default off) and at the end;
- the number of optimizer steps (and of DDP training forwards) at the end;
- the files it opens for writing and reading, with the time and the script line
  (``sys.addaudithook``), and the hosts it connects to.

Nothing talks to the other ranks: the records are compared after the fact, so the audit adds no
collective and cannot hang or reorder the job's own.

Environment: ``SDP_AUDIT`` (``1``/``on``, or ``strict``), ``SDP_AUDIT_DIR`` (where the records go;
``sdp-run`` sets it), ``SDP_AUDIT_REPORT`` (a JSON report file), ``SDP_AUDIT_STEPS``,
``SDP_AUDIT_EVERY``.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

DEFAULT_STEPS = 5

_lock = threading.RLock()
_installed: Recorder | None = None


@dataclass(frozen=True)
class Settings:
    """The audit's switches, read from the environment."""

    mode: str  # "off", "on" or "strict"
    steps: int  # K
    every: int  # N (0: off)
    folder: str | None  # where the ranks' records go
    report: str | None  # JSON report file

    @property
    def on(self) -> bool:
        return self.mode != "off"


def settings(environ: Any = None) -> Settings:
    """The audit settings from ``environ`` (default ``os.environ``).

    Example:
        >>> settings({"SDP_AUDIT": "strict"}).mode
        'strict'
    """
    env = os.environ if environ is None else environ
    raw = str(env.get("SDP_AUDIT", "")).strip().lower()
    if raw in ("", "0", "off", "false", "no"):
        mode = "off"
    elif raw == "strict":
        mode = "strict"
    elif raw in ("1", "on", "true", "yes"):
        mode = "on"
    else:
        raise ValueError(f"SDP_AUDIT={raw!r}: expected 1, on, strict or 0")
    return Settings(mode, _int(env, "SDP_AUDIT_STEPS", DEFAULT_STEPS, 1),
                    _int(env, "SDP_AUDIT_EVERY", 0, 0),
                    env.get("SDP_AUDIT_DIR") or None, env.get("SDP_AUDIT_REPORT") or None)


def _int(env: Any, name: str, default: int, least: int) -> int:
    raw = str(env.get(name, "")).strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a whole number") from None
    return max(value, least)


def default_folder(environ: Any = None) -> str:
    """Where the ranks of one job meet without a launcher that says so: a folder named after the
    job's rendezvous (the same on every rank of this machine)."""
    env = os.environ if environ is None else environ
    key = "|".join(str(env.get(k, "")) for k in (
        "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "WORLD_SIZE", "SLURM_JOB_ID",
        "SLURM_STEP_ID", "OMPI_MCA_ess_base_jobid", "PMI_SIZE"))
    digest = hashlib.blake2b(key.encode(), digest_size=6).hexdigest()
    return os.path.join(tempfile.gettempdir(), f"sdp-audit-{digest}")


class Recorder:
    """This rank's records: appended to ``<folder>/rank<N>.jsonl`` as they happen."""

    def __init__(self, conf: Settings, rank: int, size: int, folder: str, own_report: bool):
        self.conf = conf
        self.rank = rank
        self.size = size
        self.folder = folder
        self.own_report = own_report  # no sdp-run: rank 0 compares and prints at exit
        os.makedirs(folder, exist_ok=True)
        self.path = os.path.join(folder, f"rank{rank}.jsonl")
        self._out = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - open for the job
        self.busy = threading.local()
        self.end_parts: list[Any] = []  # callables adding to the end record
        self.ended = False
        self.emit({"kind": "start", "size": size, "pid": os.getpid(), "steps_k": conf.steps,
                   "argv": sys.argv[:1]})

    def emit(self, record: dict[str, Any]) -> None:
        record = {"rank": self.rank, "time": time.time(), **record}
        line = json.dumps(record, separators=(",", ":"), default=str)
        with _lock:
            self.busy.on = True
            try:
                self._out.write(line + "\n")
                self._out.flush()
            except (OSError, ValueError):
                pass
            finally:
                self.busy.on = False

    def end(self) -> None:
        """The end record (at exit, also after an uncaught exception)."""
        if self.ended:
            return
        self.ended = True
        record: dict[str, Any] = {"kind": "end"}
        for part in self.end_parts:
            with contextlib.suppress(Exception):
                part(record)
        self.emit(record)


def recorder() -> Recorder | None:
    """This process's recorder, or None when the audit is off."""
    return _installed


def active() -> bool:
    """True when the audit records in this process (cheap: one global read)."""
    return _installed is not None


def install() -> Recorder | None:
    """Turn the audit on in this process, when ``SDP_AUDIT`` asks for it (idempotent).

    Called at start-up by ``sdp-run``'s bootstrap, and by ``sdp.init()`` under other launchers.
    Returns the recorder, or None when the audit is off or this is not a rank of a job.

    Example:
        >>> install()  # with SDP_AUDIT=1 in the environment
    """
    global _installed
    with _lock:
        if _installed is not None:
            return _installed
        conf = settings()
        if not conf.on:
            return None
        owner = os.environ.get("SDP_AUDIT_RANK_PID")
        if owner and owner != str(os.getpid()):
            return None  # a process the rank started (spawned DataLoader worker, subprocess)
        from .. import _env

        placement = _env.detect()
        if placement.launcher == "none" and not os.environ.get("SDP_AUDIT_DIR"):
            return None  # not a rank of a job (a helper process, a tool run by the script)
        folder = conf.folder or default_folder()
        rec = Recorder(conf, placement.rank, placement.size, folder, conf.folder is None)
        _installed = rec
        os.environ["SDP_AUDIT_RANK_PID"] = str(os.getpid())  # its children are not the rank
    from . import _files, _frameworks

    _files.install(rec)
    _frameworks.install(rec)
    atexit.register(_at_exit, rec)
    return rec


def _at_exit(rec: Recorder) -> None:
    rec.end()
    if rec.own_report and rec.rank == 0:
        from . import report

        status = report.finish_in_rank(rec)
        if status:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)


def tf_observer(variables: Any) -> Any:
    """For the runtime's TF gradient reductions: a callable given the local gradients (torch
    views, before they are averaged), or None when the audit is off."""
    rec = _installed
    if rec is None:
        return None
    from . import _tf

    return _tf.observer(rec, variables)
