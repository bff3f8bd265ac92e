"""sdp-run when something is missing or goes away (issues 30 and 32), through the real command:
a machine that never joins, a rendezvous host that does not resolve, sdp-run itself killed with
SIGKILL, every rank raising, and option values that make no sense.

Every launcher runs in its own session with a hard time limit; whatever is left is killed.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest

from ..runtime._spawn import clean_env, free_port
from . import scripts
from .test_fail_fast import SDP_RUN, Job, _alive


def _no_traceback_and_only_sdp_run_lines(err: str) -> list[str]:
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and "DistStoreError" not in err, err
    assert all(line.startswith("sdp-run: ") for line in lines), err
    return lines


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_machine_that_never_joins_is_named_while_waiting_and_at_the_end(tmp_path):
    """--nnodes 3 with nodes 0 and 1 started on two launchers here and node 2 never: both say,
    every few seconds, that node 2 has not joined, then one line naming it (exit 1); a third
    launcher pointed at a host that does not resolve says so, once every few seconds."""
    (tmp_path / "train.py").write_text("print('never runs')\n")
    endpoint = f"127.0.0.1:{free_port()}"
    env = {"SDP_TIMEOUT": "8"}
    common = ["--nnodes", "3", "--rdzv-endpoint", endpoint]
    nodes = [Job(tmp_path, [*common, "-n", str(n), "--node-rank", str(i), "train.py"], env)
             for i, n in ((0, 2), (1, 1))]
    lost = Job(tmp_path, ["--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint",
                          "no-such-host.invalid:29500", "train.py"], env)
    try:
        started = time.monotonic()
        results = [job.wait(100) for job in (*nodes, lost)]
        took = time.monotonic() - started
    finally:
        for job in (*nodes, lost):
            job.kill()
    for code, out, err in results[:2]:
        assert code == 1, err
        assert out == ""
        lines = _no_traceback_and_only_sdp_run_lines(err)
        waiting = [line for line in lines[:-1] if "waiting for" in line]
        assert waiting and len(waiting) == len(lines) - 1, err
        # node 0 runs 2 processes, node 1 one; node 2 is counted like the launcher's own machine
        assert all(re.fullmatch(
            rf"sdp-run: waiting for [12] of [45] processes: node 2 has not joined "
            rf"\(at {endpoint}, \d+ s of 8 s\)", line) for line in waiting), waiting
        assert lines[-1] == (f"sdp-run: error: node 2 never joined the rendezvous at {endpoint} "
                             "within 8 s (SDP_TIMEOUT) (2 of 3 machines came); no process was "
                             "started")
    code, out, err = results[2]
    assert code == 1, err
    lines = _no_traceback_and_only_sdp_run_lines(err)
    assert 2 <= len(lines) <= 3, err  # one line every 5 s while the 8 s last, then the final one
    assert "socket.cpp" not in err  # torch's own warning, once a second, is not shown
    assert lines[0].startswith("sdp-run: waiting for node 0 at no-such-host.invalid:29500: "
                               "the host no-such-host.invalid does not resolve")
    assert lines[-1].startswith("sdp-run: error: node 0 never answered at "
                                "no-such-host.invalid:29500 within 8 s (SDP_TIMEOUT): the host "
                                "no-such-host.invalid does not resolve")
    assert took < 60


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_machine_1_without_machine_0_says_nothing_listens(tmp_path):
    (tmp_path / "train.py").write_text("print('never runs')\n")
    endpoint = f"127.0.0.1:{free_port()}"
    node = Job(tmp_path, ["--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", endpoint,
                          "train.py"], {"SDP_TIMEOUT": "5"})
    try:
        code, out, err = node.wait(100)
    finally:
        node.kill()
    assert code == 1, err
    lines = _no_traceback_and_only_sdp_run_lines(err)
    assert lines[0].startswith(f"sdp-run: waiting for node 0 at {endpoint}: nothing listens "
                               "there yet (connection refused)")
    assert lines[-1].startswith(f"sdp-run: error: node 0 never answered at {endpoint} within "
                                "5 s (SDP_TIMEOUT): nothing listens there yet")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_rendezvous_port_taken_by_another_program_is_one_line_in_torchs_words(tmp_path):
    import socket

    (tmp_path / "train.py").write_text("print('never runs')\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        endpoint = f"127.0.0.1:{taken.getsockname()[1]}"
        node = Job(tmp_path, ["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", endpoint,
                              "train.py"], {"SDP_TIMEOUT": "5"})
        try:
            code, _, err = node.wait(100)
        finally:
            node.kill()
    assert code == 1, err
    lines = _no_traceback_and_only_sdp_run_lines(err)
    assert lines[-1].startswith(f"sdp-run: error: the rendezvous at {endpoint} failed: "), err
    assert "EADDRINUSE" in lines[-1] and "never joined" not in err


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_sdp_run_killed_with_sigkill_takes_its_ranks_and_their_children_along(tmp_path):
    (tmp_path / "train.py").write_text(scripts.RANKS_WITH_CHILDREN)
    job = Job(tmp_path, ["-n", "2", "train.py"])
    children: list[int] = []
    try:
        job.wait_for("looping0", 60)
        job.wait_for("looping1", 60)
        ranks = job.rank_pids()
        children = [int((tmp_path / f"child{r}").read_text()) for r in (0, 1)]
        assert all(_alive(pid) for pid in ranks + children)
        os.kill(job.proc.pid, signal.SIGKILL)  # sdp-run alone, not its process group
        killed_at = time.monotonic()
        job.proc.wait(10)
        while any(_alive(pid) for pid in ranks + children) and time.monotonic() - killed_at < 10:
            time.sleep(0.05)
        left = [pid for pid in ranks + children if _alive(pid)]
        assert not left, f"still running {time.monotonic() - killed_at:.1f} s after: {left}"
        assert time.monotonic() - killed_at < 3
    finally:
        job.kill()
        for pid in children:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_when_every_rank_raises_the_status_is_the_first_ones_not_143(tmp_path):
    """Rank 0 raises first, then takes long to exit; rank 1 raises a second later and exits at
    once: torchrun stops rank 0 with SIGTERM. The status is rank 0's uncaught exception's, 1;
    143 is for sdp-run itself stopped by SIGTERM."""
    (tmp_path / "train.py").write_text(scripts.EVERY_RANK_RAISES)
    job = Job(tmp_path, ["-n", "2", "train.py"])
    try:
        code, _, err = job.wait(100)
    finally:
        job.kill()
    assert code == 1, err
    assert ("sdp-run: rank 0 failed first: ValueError: bad input on rank 0 (exit status 1; "
            "stopped by SIGTERM as it exited)") in err


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_follow_on_errors_of_the_other_ranks_are_one_line_each(tmp_path):
    (tmp_path / "train.py").write_text(scripts.RAISE_IN_DDP_LOOP)
    job = Job(tmp_path, ["-n", "2", "train.py"])
    try:
        code, _, err = job.wait(100)
    finally:
        job.kill()
    assert code == 1, err
    # rank 1's traceback as it ran (and its end again in sdp-run's summary), none of rank 0
    assert err.count("]: Traceback (most recent call last)") == 1, err
    assert "[rank1]: Traceback (most recent call last):" in err
    rank0 = [line for line in err.splitlines() if line.startswith("[rank0]: ")]
    assert len(rank0) == 1, err
    assert rank0[0].startswith("[rank0]: sdp_runtime: rank 1 failed first (ValueError: bad batch "
                               "at step 3; its output shows the traceback) while rank 0 was ")
    assert rank0[0].endswith("(its traceback is left out: it follows from that failure)")
    assert "sdp-run: rank 1 failed first: ValueError: bad batch at step 3 (exit status 1)" in err


@pytest.mark.parametrize(("argv", "env", "message"), [
    (["--max-restarts", "-1"], {}, "--max-restarts -1: give 0 or more restarts"),
    ([], {"SDP_TIMEOUT": "abc"}, "SDP_TIMEOUT='abc' is not a number of seconds"),
    ([], {"SDP_TIMEOUT": "0"}, "SDP_TIMEOUT='0' must be a positive number of seconds"),
    (["--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "h:1"], {"SDP_TIMEOUT": "-5"},
     "SDP_TIMEOUT='-5' must be a positive number of seconds"),
])
def test_bad_option_values_are_one_line_and_exit_2(tmp_path, argv, env, message):
    (tmp_path / "train.py").write_text("print('never runs')\n")
    out = subprocess.run([SDP_RUN, "-n", "2", *argv, "train.py"], cwd=tmp_path,
                         env=clean_env(env), capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert out.stdout == ""
    lines = out.stderr.splitlines()
    assert lines[0].startswith("usage: sdp-run") and lines[-1] == f"sdp-run: error: {message}"
    assert "Traceback" not in out.stderr


def test_each_rank_runs_its_usual_command_behind_the_bootstrap():
    """torchrun is given the bootstrap as a --no-python program; what it execs is the command
    torchrun would have run (python -u [-m] SCRIPT ARGS, or the --no-python program)."""
    import sys

    from sdp_runtime import _lifeline
    from sdp_runtime.launch import Plan, build_parser, torchrun_args

    def wrapped(*argv: str) -> tuple[list[str], list[str]]:
        args = build_parser().parse_args(list(argv))
        out = _lifeline.wrap(torchrun_args(Plan(2, 1, 0, None), args, 2, "/logs"),
                             len(args.script_args), module=args.module, no_python=args.no_python)
        boot = out.index("-I")
        assert out[boot - 2:boot + 3] == ["--no-python", sys.executable, "-I", "-S", "-c"]
        assert out[boot + 3] == _lifeline.BOOT and out[boot + 4] == str(os.getpid())
        return out[:boot - 2], out[boot + 5:]

    flags, command = wrapped("train.py", "--lr", "1", "--module")  # the script's own flag
    assert command == [sys.executable, "-u", "train.py", "--lr", "1", "--module"]
    assert "--module" not in flags and flags[:2] == ["--nproc-per-node", "2"]
    flags, command = wrapped("-m", "pkg.train", "x")
    assert command == [sys.executable, "-u", "-m", "pkg.train", "x"] and "--module" not in flags
    flags, command = wrapped("--no-python", "./job.sh", "--no-python")
    assert command == ["./job.sh", "--no-python"] and "--no-python" not in flags


def test_roll_call_lines_for_several_missing_machines():
    from sdp_runtime._rollcall import RollCall

    call = RollCall("h0:29500", 4, 0, 2, 600.0, timeout_set=False)
    call.problem, call.missing, call.joined = None, [2, 3], {0: 2, 1: 8}
    assert call.waiting_line(65.4) == ("sdp-run: waiting for 4 of 14 processes: nodes 2, 3 have "
                                       "not joined (at h0:29500, 65 s of 600 s)")
    assert call.failure_line(RuntimeError("Timed out after 601 seconds waiting for clients.")) == (
        "sdp-run: error: nodes 2, 3 never joined the rendezvous at h0:29500 within 600 s "
        "(torchrun's default; SDP_TIMEOUT sets it) (2 of 4 machines came); no process was "
        "started")
    assert call.failure_line(RuntimeError("store closed\ndetails")) == (
        "sdp-run: error: the rendezvous at h0:29500 failed: store closed")


def test_machine_0_ending_the_rendezvous_at_its_deadline_leaves_the_roll_call_standing():
    """Machine 0 hosts the rendezvous and gives up at its own deadline, a moment before machine
    1's: machine 1 then loses the store (a DistNetworkError) and must still say which machine
    never joined, as machine 0 does; a store lost early is machine 0 not answering."""
    from sdp_runtime._rollcall import RollCall

    timeout = RuntimeError("Timed out after 9 seconds waiting for clients. 2/3 clients joined.")
    for lost_at, starts in ((7.6, "sdp-run: error: node 2 never joined the rendezvous at h0:1 "
                                  "within 8 s (SDP_TIMEOUT) (2 of 3 machines came)"),
                            (2.0, "sdp-run: error: node 0 never answered at h0:1 within 8 s "
                                  "(SDP_TIMEOUT): DistNetworkError: Failed to recv")):
        call = RollCall("h0:1", 3, 1, 1, 8.0)
        call.missing, call.joined = [2], {0: 2, 1: 1}
        call.problem, call.lost_at = "DistNetworkError: Failed to recv, got 0 bytes.", lost_at
        assert call.failure_line(timeout).startswith(starts), call.failure_line(timeout)
