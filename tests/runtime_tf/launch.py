"""Launch TF worker scripts on real processes (``sdp-run``, Gloo, CPU) with hard timeouts."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

WORKERS = Path(__file__).parent / "workers"


HAS_TF = importlib.util.find_spec("tensorflow") is not None


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        TF_NUM_INTRAOP_THREADS="1",
        TF_NUM_INTEROP_THREADS="2",
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    return env


def _communicate(proc: subprocess.Popen, what: str, timeout: float) -> str:
    """Wait for ``proc``; kill its whole process group on timeout or interruption."""
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(
            f"{what} timed out after {timeout}s:\n{output.decode(errors='replace')[-6000:]}"
        )
    finally:
        if proc.poll() is None:  # interrupted (e.g. by pytest-timeout): leave no ranks behind
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return output.decode(errors="replace")


def run_alone(worker: str, out_dir: Path, timeout: float) -> dict:
    """Run ``workers/<worker>`` as a plain ``python script.py`` (no launcher, one process)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    env = _env()
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR"):
        env.pop(name, None)
    proc = subprocess.Popen(
        [sys.executable, str(WORKERS / worker), str(out_dir)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    text = _communicate(proc, worker, timeout)
    if proc.returncode != 0:
        pytest.fail(f"{worker} failed ({proc.returncode}):\n{text[-8000:]}")
    return json.loads((out_dir / "rank0.json").read_text())


def run_ranks(worker: str, nproc: int, out_dir: Path, timeout: float, *args: str) -> list[dict]:
    """Run ``workers/<worker>`` on ``nproc`` processes with ``sdp-run``; return each rank's JSON.

    The whole process group is killed if it outlives ``timeout``.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "sdp_runtime.launch", "-n", str(nproc),
        str(WORKERS / worker), str(out_dir), *args,
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    text = _communicate(proc, f"{worker} on {nproc} ranks", timeout)
    if proc.returncode != 0:
        pytest.fail(f"{worker} on {nproc} ranks failed ({proc.returncode}):\n{text[-8000:]}")
    results = [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(nproc)]
    assert [res["rank"] for res in results] == list(range(nproc))
    return results
