"""sdp-run, the launcher: flags and defaults (unit), and real launches of 2 ranks, a failing rank,
two "machines" meeting at a rendezvous endpoint, and `python script.py` with no launcher."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sdp_runtime.launch import (
    Plan,
    build_parser,
    parse_hosts,
    plan,
    read_hostfile,
    torchrun_args,
)

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


def _plan(*argv: str, env: dict[str, str] | None = None, here: set[str] | None = None) -> Plan:
    return plan(build_parser().parse_args([*argv, "train.py"]), env or {}, here)


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


def test_np_is_the_total_as_horovodrun_counts_it():
    assert _plan("-np", "2") == Plan(2, 1, 0, None)  # not "-n p"
    assert _plan("-np", "8", "--nnodes", "2", "--rdzv-endpoint", "h0:1").nproc == 4
    with pytest.raises(ValueError, match="not a multiple"):
        _plan("-np", "7", "--nnodes", "2", "--rdzv-endpoint", "h0:1")
    with pytest.raises(ValueError, match="not both"):
        _plan("-n", "2", "-np", "2")


def test_hosts_like_horovodrun():
    assert parse_hosts("h0:4, h1:4,h2") == [("h0", 4), ("h1", 4), ("h2", 1)]
    # Run on every host: each finds itself in the list and takes its share.
    assert _plan("-H", "h0:4,h1:4", here={"h1"}) == Plan(4, 2, 1, "h0:29500")
    assert _plan("-H", "h0:4,h1:4", here={"h0"}) == Plan(4, 2, 0, "h0:29500")
    # -np fills the hosts in order; a host left without processes is not part of the job.
    assert _plan("-np", "6", "-H", "h0:4,h1:4", here={"h1"}) == Plan(2, 2, 1, "h0:29500")
    assert _plan("-np", "3", "-H", "h0:4,h1:4", here={"h0"}) == Plan(3, 1, 0, None)
    assert _plan("-H", "h0:2,h1:2", "--master-port", "1234", here={"h1"}).endpoint == "h0:1234"
    assert _plan("-H", "h0:2,h1:2", "--node-rank", "1", here=set()).node_rank == 1
    for argv, message in ((["-np", "9", "-H", "h0:4,h1:4"], "more than the 8 slots"),
                          (["-np", "3", "-H", "h0:4,h1:4"], "none of the hosts used"),
                          (["-H", "h0:x"], "slots must be a number"),
                          (["-n", "2", "-H", "h0:4"], "use -np"),
                          (["-H", "h0:1,h1:1"], "none of the hosts")):
        with pytest.raises(ValueError, match=message):
            _plan(*argv, here={"h1"} if "-np" in argv and "3" in argv else set())
    with pytest.raises(ValueError, match="more than one"):
        _plan("-H", "localhost:1,127.0.0.1:1", here={"localhost", "127.0.0.1"})


def test_hostfile(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# the job\nnode1 slots=4\nnode2:2  # spare\n\nnode3\n")
    assert read_hostfile(str(hostfile)) == [("node1", 4), ("node2", 2), ("node3", 1)]
    assert _plan("--hostfile", str(hostfile), here={"node2"}) == Plan(2, 3, 1, "node1:29500")
    hostfile.write_text("node1 slots four\n")
    with pytest.raises(ValueError, match="hosts:1: expected 'host slots=N'"):
        read_hostfile(str(hostfile))
    with pytest.raises(ValueError, match="No such file"):
        read_hostfile(str(tmp_path / "missing"))


def test_elastic_nnodes_range_uses_the_c10d_rendezvous():
    p = _plan("-n", "2", "--nnodes", "1:4", "--rdzv-endpoint", "h0:29400")
    assert p == Plan(2, 1, 0, "h0:29400", max_nodes=4)
    args = torchrun_args(p, build_parser().parse_args(["t.py"]), 2, "/logs")
    assert args[args.index("--nnodes") + 1] == "1:4"
    assert args[args.index("--rdzv-backend") + 1] == "c10d"
    assert args[args.index("--rdzv-id") + 1] == "sdp-run-h0:29400"
    assert "--node-rank" not in args and "--standalone" not in args
    assert _plan("--nnodes", "2:2", "--rdzv-endpoint", "h:1", "--node-rank", "1").max_nodes is None
    for argv, message in ((["--nnodes", "1:4"], "needs --rdzv-endpoint"),
                          (["--nnodes", "1:4", "--master-addr", "h", "--node-rank", "1"],
                           "leave out --node-rank"),
                          (["--nnodes", "4:1"], "MIN <= MAX"),
                          (["--nnodes", "two"], "not N or MIN:MAX"),
                          (["-np", "4", "--nnodes", "1:2", "--master-addr", "h"], "fixed number")):
        with pytest.raises(ValueError, match=message):
            _plan(*argv)


def test_master_addr_and_port_and_other_torchrun_flags():
    p = _plan("--nnodes", "2", "--node-rank", "1", "--master-addr", "h0", "--master-port", "1234")
    assert p.endpoint == "h0:1234"
    assert _plan("--nnodes", "2", "--master-addr", "h0").endpoint == "h0:29500"
    assert _plan("--master-port", "1234").endpoint == "127.0.0.1:1234"  # static, this machine
    with pytest.raises(ValueError, match="not both"):
        _plan("--rdzv-endpoint", "h:1", "--master-addr", "h")
    parsed = build_parser().parse_args(["--no-python", "--local-ranks-filter", "0",
                                        "--output-dir", "/o", "prog", "-x"])
    args = torchrun_args(_plan(), parsed, 2, "/logs")
    assert "--no-python" in args and args[args.index("--local-ranks-filter") + 1] == "0"
    assert args[args.index("--logs-specs") + 1] == "sdp-rank-files"
    assert args[-2:] == ["prog", "-x"]
    for argv, message in ((["-m", "--no-python"], "cannot be combined"),
                          (["--local-ranks-filter", "zero"], "not a list"),
                          (["--no-prefix", "--output-dir", "o"], "leave out --no-prefix")):
        with pytest.raises(ValueError, match=message):
            _plan(*argv)


def test_version_and_usage_errors_through_the_command():
    out = subprocess.run([SDP_RUN, "--version"], capture_output=True, text=True, timeout=60)
    import sdp_runtime

    assert out.returncode == 0 and out.stdout.strip() == f"sdp-run {sdp_runtime.__version__}"
    out = subprocess.run([SDP_RUN, "-n", "2", "-np", "2", "x.py"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.strip().endswith(
        "sdp-run: error: give -n (per machine) or -np (in all), not both")


def test_without_torch_one_line_names_the_extra(tmp_path):
    """sdp-run on a machine without torch: a meta path finder refuses torch in the real
    command's process (installed through sitecustomize)."""
    blocker = tmp_path / "no_torch"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\n"
        "class _NoTorch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n"
        "sys.meta_path.insert(0, _NoTorch())\n"
    )
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    env = {**clean_env(), "PYTHONPATH": str(blocker)}
    out = subprocess.run([SDP_RUN, "-n", "2", str(script)], capture_output=True, text=True,
                         timeout=60, env=env)
    assert out.returncode == 2
    assert out.stderr == ("sdp-run: error: torch is not installed; sdp-run and the runtime need "
                          "it: pip install torch (from a checkout: pip install -e '.[torch]')\n")
    assert out.stdout == ""


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
    # sdp-run's line, not torch's own log lines (E1128 ... elastic/multiprocessing/api.py:
    # failed (exitcode: 1) ..., W1128 ... Sending process ... closing signal SIGTERM).
    assert not re.search(r"^[IWEF]\d{4} \d\d:\d\d:\d\d", err, re.M), err


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


ENV_SCRIPT = """\
import os
import sys

import torch

import sdp_runtime.torch as sdp

sdp.init()
total = sdp.allreduce(torch.tensor([float(sdp.rank() + 1)]), op=sdp.Sum)
print(f"rank {sdp.rank()} of {sdp.size()} local {sdp.local_rank()}/{sdp.local_size()} "
      f"sum {total.item():g} omp {os.environ.get('OMP_NUM_THREADS')}")
print(f"stderr of rank {sdp.rank()}", file=sys.stderr)
"""


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_np_output_dir_rank0_only_and_omp_default(tmp_path):
    (tmp_path / "job.py").write_text(ENV_SCRIPT)
    env = clean_env()
    del env["OMP_NUM_THREADS"]  # sdp-run sets it: cores here / processes here
    proc = subprocess.Popen([SDP_RUN, "-np", "2", "--output-dir", "logs",
                             "--local-ranks-filter", "0", "job.py"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    ((code, out, err),) = _finish([proc], 200)
    assert code == 0, err
    omp = max(1, len(os.sched_getaffinity(0)) // 2)
    assert _lines(out) == [f"[rank0]: rank 0 of 2 local 0/2 sum 3 omp {omp}"]
    assert "stderr of rank 0" in err and "rank 1" not in err
    assert "OMP_NUM_THREADS" not in err  # torchrun's warning is not printed
    logs = tmp_path / "logs"
    assert sorted(p.name for p in logs.iterdir()) == [
        "rank0.stderr", "rank0.stdout", "rank1.stderr", "rank1.stdout"]
    assert (logs / "rank1.stdout").read_text() == f"rank 1 of 2 local 1/2 sum 3 omp {omp}\n"
    assert (logs / "rank1.stderr").read_text() == "stderr of rank 1\n"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_hosts_list_on_two_launchers_with_their_own_slots(tmp_path):
    """-H as horovodrun users write it, 2 slots on the first host and 1 on the second; both
    "hosts" are this machine, so each launcher is told which one it is."""
    (tmp_path / "job.py").write_text(ENV_SCRIPT)
    hosts = ["-H", "127.0.0.1:2,localhost:1", "--master-port", str(free_port())]
    node0 = _start([SDP_RUN, *hosts, "--node-rank", "0", "job.py"], tmp_path)
    node1 = _start([SDP_RUN, *hosts, "--node-rank", "1", "job.py"], tmp_path)
    (code0, out0, err0), (code1, out1, err1) = _finish([node0, node1], 200)
    assert code0 == 0 and code1 == 0, err0 + err1
    assert "[rank0]: rank 0 of 3 local 0/2 sum 6" in out0
    assert "[rank1]: rank 1 of 3 local 1/2 sum 6" in out0
    assert "[rank2]: rank 2 of 3 local 0/1 sum 6" in out1


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_elastic_nnodes_range_on_two_launchers(tmp_path):
    (tmp_path / "job.py").write_text(ENV_SCRIPT)
    port = free_port()
    common = ["-n", "1", "--nnodes", "1:2", "--rdzv-endpoint", f"127.0.0.1:{port}"]
    node0 = _start([SDP_RUN, *common, "job.py"], tmp_path)
    # Both "machines" are this one, so both would host the rendezvous store; on real machines
    # only the endpoint's host does. The second starts once the first listens, and joins it.
    deadline = time.monotonic() + 60
    while node0.poll() is None and time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    node1 = _start([SDP_RUN, *common, "job.py"], tmp_path)
    (code0, out0, err0), (code1, out1, err1) = _finish([node0, node1], 200)
    assert code0 == 0 and code1 == 0, err0 + err1
    lines = sorted(_lines(out0) + _lines(out1))
    assert [line.split(" omp")[0] for line in lines] == [
        "[rank0]: rank 0 of 2 local 0/1 sum 3", "[rank1]: rank 1 of 2 local 0/1 sum 3"]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_no_python_runs_a_program(tmp_path):
    program = tmp_path / "job.sh"
    program.write_text('#!/bin/sh\necho "rank $RANK of $WORLD_SIZE args $*"\n')
    program.chmod(0o755)
    ((code, out, err),) = _finish([_start([SDP_RUN, "-n", "2", "--no-python", "./job.sh", "x"],
                                          tmp_path)], 200)
    assert code == 0, err
    assert sorted(_lines(out)) == ["[rank0]: rank 0 of 2 args x", "[rank1]: rank 1 of 2 args x"]
