"""Smoke tests of benchmarks/bench_runtime_torch.py: ``--quick`` end to end, and its time limit.

The numbers of a --quick run judge nothing; this checks that the command works end to end (its
worker processes, the converter, both training scripts, the report), that the result file holds
every measurement, every target and the machine, and that no process outlives the run. The second
test checks that a launch past its time limit is killed together with the ranks torchrun started.

bench_convert.py and bench_tf_allreduce.py are not smoked here: neither has a quick mode (both
always run their full corpus or sizes) and bench_convert.py always overwrites
benchmarks/results/convert.md. Nor are bench_tf_xla.py and bench_tf_torch_cost.py, whose code
paths the TF runtime tests run (the split step, XLA off, imports).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks" / "bench_runtime_torch.py"
TIMEOUT_S = 150  # the hard limit; a --quick run took 44-63 s on 2 busy cores (load 4-5)


def _bench_module():
    spec = importlib.util.spec_from_file_location("bench_runtime_torch", BENCH)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


MARKER = "SDP_BENCH_SMOKE"  # an environment variable every process a test starts inherits


def _marked_processes(value: str) -> list[str]:
    """Command lines of live processes whose environment has ``MARKER=value`` (Linux /proc).

    The environment, not the command line: torchrun runs a rank as ``python -u script.py``.
    """
    wanted = f"{MARKER}={value}".encode()
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if wanted in (proc / "environ").read_bytes().split(b"\0"):
                found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode())
    return found


def _no_leftovers(tmp_path: Path) -> None:
    deadline = time.monotonic() + 5  # killed processes may take a moment to disappear
    while (left := _marked_processes(str(tmp_path))) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"processes outlived the benchmark: {left}"


@pytest.mark.timeout(TIMEOUT_S + 30)
def test_quick_run_writes_every_row(tmp_path):
    out = tmp_path / "runtime_torch.md"
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["TMPDIR"] = str(tmp_path)  # the benchmark's scratch folder (and sdp-run's log folder)
    env[MARKER] = str(tmp_path)  # inherited by every process of the run
    proc = subprocess.Popen(
        [sys.executable, str(BENCH), "--quick", "--out", str(out)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.terminate()  # the benchmark kills its launches on SIGTERM
        try:
            output, _ = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
        pytest.fail(f"bench_runtime_torch.py --quick did not finish in {TIMEOUT_S} s:\n"
                    f"{output[-3000:]}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, output[-3000:]
    _no_leftovers(tmp_path)

    report = out.read_text()
    rows = [line for line in report.splitlines() if line.startswith("| ")]
    first_cells = [line.split("|")[1].strip() for line in rows]
    expected = _bench_module().row_names(quick=True)
    assert expected == [
        "allreduce 64 KiB Sum", "allreduce 64 KiB Average",
        "allreduce 256 KiB Sum", "allreduce 256 KiB Average",
        "allreduce 1 MiB Sum", "allreduce 1 MiB Average",
        "fusion 20 x 20 KiB Average",
        "training, converted (sdp-run)", "training, native DDP (torchrun)",
        "1 process, original script", "1 process, converted script (python)",
    ]
    for name in expected:
        assert first_cells.count(name) == 1, f"row {name!r} missing or repeated in\n{report}"
    # every result row has a number in each cell (a time, a rate or a ratio)
    for line in rows:
        if line.split("|")[1].strip() in expected:
            cells = [c.strip() for c in line.split("|")[2:-1]]
            filled = [c for c in cells if c]
            assert filled and all(re.search(r"\d", c) for c in filled), line
    # every target, judged (2 processes), with a margin
    targets = [line for line in rows if re.search(r"\| (PASS|MISS) \|", line)]
    assert len(targets) == 4, report
    for key in ("within 5% of raw", "fused small tensors", "hand-written DDP",
                "world-size-1 overhead"):
        assert sum(key in line for line in targets) == 1, key
    # the machine and the command
    for key in ("| CPU |", "| cores |", "| RAM |", "| Python |", "| torch |", "| backend | gloo |",
                "| processes | 2 ", "Command: `", "--quick", "Run 20"):
        assert key in report, key
    assert not re.search(r"\b(nan|inf)\b", report, re.IGNORECASE), report
    # the printed table is the written one
    assert "fusion 20 x 20 KiB Average" in output and "### Targets" in output


@pytest.mark.timeout(90)
def test_a_launch_past_its_time_limit_is_killed_with_its_ranks(tmp_path):
    """sdp-run (torchrun) starts each rank in a session of its own; all of them must die."""
    bench = _bench_module()
    script = tmp_path / "sleeper.py"
    script.write_text(
        "import os, pathlib, time\n"
        f"pathlib.Path({str(tmp_path)!r}, 'started-' + os.environ['RANK']).touch()\n"
        "time.sleep(600)\n"
    )
    env = bench._clean_env("gloo", {MARKER: str(tmp_path)})
    start = time.monotonic()
    with pytest.raises(SystemExit, match="did not finish within 12 s; killed"):
        bench._run([*bench._sdp_run(2), str(script)], env, 12, "the sleeper")
    assert time.monotonic() - start < 30
    assert sorted(p.name for p in tmp_path.glob("started-*")) == ["started-0", "started-1"]
    _no_leftovers(tmp_path)
