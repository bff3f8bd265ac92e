"""sdp-run, the launcher: flags and defaults (unit), and real launches of 2 ranks, a failing rank,
two "machines" meeting at a rendezvous endpoint, and `python script.py` with no launcher."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sdp_runtime.launch import Plan, build_parser, plan, torchrun_args

from ._spawn import clean_env, free_port

SDP_RUN = str(Path(sys.executable).with_name("sdp-run"))

SCRIPT = """\
import sys
import time

import torch

import sdp_runtime.torch as sdp

sdp.init()
total = sdp.allreduce(torch.tensor([float(sdp.rank() + 1)]), op=sdp.Sum)
print(f"rank {sdp.rank()} of {sdp.size()} local {sdp.local_rank()}/{sdp.local_size()} "
      f"sum {total.item():g} args {sys.argv[1:]}")
print("second line")
if "--fail-rank" in sys.argv:
    if sdp.rank() == int(sys.argv[sys.argv.index("--fail-rank") + 1]):
        raise RuntimeError(f"planned failure on rank {sdp.rank()}")
    time.sleep(120)  # sdp-run must stop this rank when the other fails
"""


def _plan(*argv: str, env: dict[str, str] | None = None) -> Plan:
    return plan(build_parser().parse_args([*argv, "train.py"]), env or {})


# ---- flags and defaults ---------------------------------------------------------------------


def test_one_machine_defaults_to_an_automatic_port():
    p = _plan("-n", "3")
    assert p == Plan(3, 1, 0, None)
    args = torchrun_args(p, build_parser().parse_args(["-n", "3", "t.py", "--lr", "1"]), 3, "/logs")
    assert args[:5] == ["--nproc-per-node", "3", "--nnodes", "1", "--standalone"]
    assert args[-3:] == ["t.py", "--lr", "1"] and "--tee" in args


def test_several_machines_use_static_rendezvous_at_the_endpoint():
    p = _plan("-n", "2", "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "h0:29400")
    args = torchrun_args(p, build_parser().parse_args(["-m", "pkg.train"]), 2, "/logs")
    assert "--standalone" not in args
    i = args.index("--rdzv-endpoint")
    assert args[i + 1] == "h0:29400" and args[args.index("--node-rank") + 1] == "1"
    assert args[-2:] == ["--module", "pkg.train"]


@pytest.mark.parametrize("argv, message", [
    (["--nnodes", "2"], "--rdzv-endpoint"),
    (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1"], "not within"),
    (["--nnodes", "2", "--rdzv-endpoint", "h0"], "HOST:PORT"),
    (["-n", "0"], "at least 1"),
])
def test_bad_flags(argv, message):
    with pytest.raises(ValueError, match=message):
        _plan(*argv)


def test_slurm_defaults_inside_a_job_step():
    env = {"SLURM_STEP_NUM_TASKS": "3", "SLURM_STEP_NUM_NODES": "3", "SLURM_NODEID": "2",
           "SLURM_JOB_NODELIST": "node[04-06]", "SLURM_JOB_ID": "17", "SLURM_NTASKS_PER_NODE": "4"}
    assert _plan(env=env) == Plan(None, 3, 2, "node04:29517", 4)
    assert _plan("-n", "2", "--rdzv-endpoint", "other:1", env=env) == Plan(2, 3, 2, "other:1", 4)
    with pytest.raises(ValueError, match="once per node"):
        _plan(env={**env, "SLURM_STEP_NUM_TASKS": "12"})


def test_sagemaker_defaults():
    env = {"SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_HOST": "algo-2", "SM_NUM_GPUS": "8"}
    assert _plan(env=env) == Plan(8, 2, 1, "algo-1:29500")


def test_help_is_quick_and_imports_no_torch():
    out = subprocess.run([SDP_RUN, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    for flag in ("-n", "--nnodes", "--node-rank", "--rdzv-endpoint", "--module", "SDP_TIMEOUT"):
        assert flag in out.stdout
    probe = "import sys, sdp_runtime.launch, sdp_runtime; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60).stdout.strip() == "False"


def test_usage_errors_exit_2_before_starting_anything(tmp_path):
    out = subprocess.run([SDP_RUN, "--nnodes", "2", str(tmp_path / "x.py")], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "--rdzv-endpoint" in out.stderr
    out = subprocess.run([SDP_RUN, "-n", "2", str(tmp_path / "missing.py")], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "no such script" in out.stderr


# ---- real launches --------------------------------------------------------------------------


def _start(cmd: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=cwd, env=clean_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _finish(procs: list[subprocess.Popen], timeout: float) -> list[tuple[int, str, str]]:
    """Wait for all; on timeout kill every process group (launcher and its ranks) and fail."""
    deadline = time.monotonic() + timeout
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=max(deadline - time.monotonic(), 1))
            outputs.append((proc.returncode, out, err))
    except subprocess.TimeoutExpired:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"launch did not finish within {timeout} s")
    return outputs


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


@pytest.fixture
def script(tmp_path) -> Path:
    path = tmp_path / "train_job.py"
    path.write_text(SCRIPT)
    return path


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_ranks_with_rank_prefixed_output(script, tmp_path):
    launch = _start([SDP_RUN, "-n", "2", str(script), "--lr", "0.1"], tmp_path)
    ((code, out, err),) = _finish([launch], 200)
    assert code == 0, err
    lines = _lines(out)
    assert all(re.match(r"\[rank[01]\]: ", line) for line in lines), lines
    for r in (0, 1):
        assert f"[rank{r}]: rank {r} of 2 local {r}/2 sum 3 args ['--lr', '0.1']" in lines
        assert f"[rank{r}]: second line" in lines


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_failing_rank_fails_the_run_and_stops_the_others(script, tmp_path):
    start = time.monotonic()
    ((code, out, err),) = _finish([_start([SDP_RUN, "-n", "2", str(script), "--fail-rank", "1"],
                                          tmp_path)], 200)
    assert code == 1
    assert time.monotonic() - start < 100  # rank 0 would sleep 120 s had it not been stopped
    assert "[rank1]: Traceback (most recent call last):" in err
    assert "[rank1]: RuntimeError: planned failure on rank 1" in err
    assert "[rank1]: [rank1]:" not in err  # one prefix, not torch's on top of ours
    assert ("sdp-run: rank 1 failed first: RuntimeError: planned failure on rank 1 "
            "(exit status 1)") in err
    assert "[rank0]: rank 0 of 2" in out


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_machines_meet_at_the_rendezvous_endpoint(script, tmp_path):
    endpoint = f"127.0.0.1:{free_port()}"
    common = ["--nnodes", "2", "--rdzv-endpoint", endpoint, "-n", "1"]
    node0 = _start([SDP_RUN, *common, "--node-rank", "0", str(script)], tmp_path)
    node1 = _start([SDP_RUN, *common, "--node-rank", "1", "-m", "train_job"], tmp_path)
    (code0, out0, err0), (code1, out1, err1) = _finish([node0, node1], 200)
    assert code0 == 0 and code1 == 0, err0 + err1
    assert "[rank0]: rank 0 of 2 local 0/1 sum 3" in out0
    assert "[rank1]: rank 1 of 2 local 0/1 sum 3" in out1


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_plain_python_without_launcher_is_one_process(script, tmp_path):
    ((code, out, err),) = _finish([_start([sys.executable, str(script), "x"], tmp_path)], 100)
    assert code == 0, err
    assert _lines(out) == ["rank 0 of 1 local 0/1 sum 1 args ['x']", "second line"]
