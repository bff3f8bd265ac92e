"""Start N real processes that each run one function, with a hard time limit.

Each rank gets torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT) and, like under torchrun, meets the others in a TCP store that this (the test)
process hosts on a port the OS picks: no port is guessed, so parallel test runs cannot collide.
The function's return value comes back as JSON; a rank that outlives the deadline is killed.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("_worker.py")
# Variables of launchers that would otherwise leak from the test's own environment.
_LAUNCHER_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "SM_", "TORCHELASTIC_")
_LAUNCHER_NAMES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                   "MASTER_PORT", "SDP_BACKEND", "SDP_RUN_PREFIXED", "MPI_LOCALRANKID"}


@dataclass
class Rank:
    """What one process left behind."""

    rank: int
    returncode: int | None
    stdout: str
    stderr: str
    result: Any  # the function's return value, or None if it raised

    def describe(self) -> str:
        return (f"--- rank {self.rank} exit {self.returncode}\nstdout:\n{self.stdout[-3000:]}\n"
                f"stderr:\n{self.stderr[-3000:]}")


def free_port() -> int:
    """A TCP port of this machine that was free a moment ago (for a rendezvous endpoint)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The test's environment minus launcher variables, on Gloo, one thread each, + ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if k not in _LAUNCHER_NAMES and not k.startswith(_LAUNCHER_PREFIXES)}
    # Gloo on the CPU even where a GPU exists (several ranks cannot share one GPU under NCCL);
    # the GPU test asks for the automatic choice with SDP_BACKEND="".
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "SDP_TIMEOUT": "30",
                "SDP_BACKEND": "gloo"})
    env.update(extra or {})
    return env


def spawn(
    target: str,
    nprocs: int,
    tmp_path: Path,
    *,
    timeout: float = 150,
    env: Mapping[str, str] | None = None,
    args: Sequence[str] = (),
    launcher: bool = True,
    rank_env: Callable[[int], Mapping[str, str]] | None = None,
) -> list[Rank]:
    """Run ``module:function`` (in tests/runtime) on ``nprocs`` processes; return every rank.

    Arguments:
        target: e.g. ``"_scenarios:comm_suite"``; the function gets ``args`` as strings.
        nprocs: number of processes.
        tmp_path: where outputs go.
        timeout: seconds for all of them together; then every survivor is killed.
        env: extra environment variables.
        args: passed to the function.
        launcher: False starts the processes without torchrun's variables (``python x.py``).
        rank_env: each rank's own variables (e.g. SLURM's), instead of torchrun's.
    """
    import torch.distributed as dist

    out = tmp_path / f"spawn-{time.monotonic_ns()}"
    out.mkdir()
    store = None
    if launcher and rank_env is None:
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    procs = []
    try:
        for r in range(nprocs):
            variables = clean_env(env)
            if rank_env is not None:
                variables.update(rank_env(r))
            if store is not None:
                variables.update({
                    "RANK": str(r), "WORLD_SIZE": str(nprocs), "LOCAL_RANK": str(r),
                    "LOCAL_WORLD_SIZE": str(nprocs), "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(store.port), "TORCHELASTIC_USE_AGENT_STORE": "True",
                    "TORCHELASTIC_RESTART_COUNT": "0",
                })
            stdout = open(out / f"{r}.out", "w")  # noqa: SIM115 (closed below)
            stderr = open(out / f"{r}.err", "w")  # noqa: SIM115
            cmd = [sys.executable, str(WORKER), target, str(out / f"{r}.json"), *args]
            procs.append((subprocess.Popen(cmd, cwd=REPO, env=variables, stdout=stdout,
                                           stderr=stderr), stdout, stderr))
        deadline = time.monotonic() + timeout
        timed_out = False
        for proc, _, _ in procs:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                timed_out = True
                break
    finally:
        for proc, stdout, stderr in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            stdout.close()
            stderr.close()
        del store
    ranks = [_collect(r, proc.returncode, out) for r, (proc, _, _) in enumerate(procs)]
    if timed_out:
        raise AssertionError(f"ranks did not finish within {timeout} s:\n"
                             + "\n".join(r.describe() for r in ranks))
    return ranks


def _collect(r: int, returncode: int | None, out: Path) -> Rank:
    result_file = out / f"{r}.json"
    result = json.loads(result_file.read_text()) if result_file.exists() else None
    stdout, stderr = (out / f"{r}.out").read_text(), (out / f"{r}.err").read_text()
    return Rank(r, returncode, stdout, stderr, result)


def results(ranks: list[Rank]) -> list[Any]:
    """Every rank's return value; fails (showing all output) unless every rank succeeded."""
    if any(r.returncode != 0 or r.result is None for r in ranks):
        raise AssertionError("a rank failed:\n" + "\n".join(r.describe() for r in ranks))
    return [r.result for r in ranks]
