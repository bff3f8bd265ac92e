"""The pure pieces of fail-fast and even sharding, without processes: which failure the launcher
names first, and which rows ``sdp.shard`` gives each rank."""

from __future__ import annotations

import importlib.util
import signal
from dataclasses import dataclass

import pytest
from sdp_runtime.launch import first_failure


@dataclass
class Failure:  # the fields of torchrun's ProcessFailure that sdp-run reads
    exitcode: int
    timestamp: int = 100

    def signal_name(self) -> str:
        return signal.Signals(-self.exitcode).name


def test_the_rank_that_raised_is_named_not_the_one_whose_connection_closed():
    failures = {0: Failure(1), 1: Failure(1)}
    reports = {
        0: {"error": "CommunicationError: allreduce failed", "time": 5.0, "caused_by_peer": True},
        1: {"error": "ValueError: bad batch", "time": 5.5,
            "traceback": "Traceback ...\nValueError"},
    }
    rank, why, status, trace = first_failure(failures, reports)
    assert (rank, why, status) == (1, "ValueError: bad batch (exit status 1)", 1)
    assert trace.endswith("ValueError")


def test_a_killed_rank_without_a_record_wins_over_follow_on_errors():
    failures = {0: Failure(1), 3: Failure(-signal.SIGKILL)}
    reports = {0: {"error": "RuntimeError: Connection closed by peer", "time": 1.0,
                   "caused_by_peer": True}}
    assert first_failure(failures, reports)[:3] == (3, "killed by signal SIGKILL", 137)


@pytest.mark.parametrize(
    ("summary", "peers_left", "follows"),
    [
        # The peer was SIGKILLed mid-allreduce: no exit record, but Gloo says it hung up.
        ("CommunicationError: allreduce failed on rank 0 of 2: another process probably died "
         "... Cause: [gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer",
         False, True),
        ("RuntimeError: Connection closed by peer", False, True),
        ("CommunicationError: allreduce failed: timed out", True, True),
        ("CommunicationError: allreduce failed: timed out", False, False),  # maybe its own
        ("ValueError: bad batch", True, False),  # its own error, whatever the peers did
    ],
)
def test_which_failures_only_follow_from_a_peer(summary, peers_left, follows):
    from sdp_runtime._exit import follows_from_peer

    assert follows_from_peer(summary, peers_left) is follows


def test_a_rank_torchrun_stopped_with_sigterm_is_never_named_first():
    # torchrun's own timestamp is whole seconds: it may read earlier than the real failure's
    failures = {0: Failure(-signal.SIGTERM, timestamp=100), 1: Failure(1)}
    reports = {1: {"error": "RuntimeError: planned", "time": 100.7}}
    assert first_failure(failures, reports)[:3] == (1, "RuntimeError: planned (exit status 1)", 1)
    assert first_failure({0: Failure(-signal.SIGTERM)}, {})[:3] == (0, "killed by signal SIGTERM",
                                                                    143)


def test_a_rank_that_raised_first_and_was_stopped_while_exiting_keeps_status_1():
    """Every rank raised; torchrun stopped rank 0 with SIGTERM as it exited (issue 30): its
    status is an uncaught exception's, not the 143 that means sdp-run itself got SIGTERM."""
    failures = {0: Failure(-signal.SIGTERM), 1: Failure(1)}
    reports = {0: {"error": "ValueError: a", "time": 10.0}, 1: {"error": "ValueError: b",
                                                               "time": 11.0}}
    assert first_failure(failures, reports)[:3] == (
        0, "ValueError: a (exit status 1; stopped by SIGTERM as it exited)", 1)
    # a follow-on error stopped by SIGTERM is still never first
    reports[0]["caused_by_peer"] = True
    assert first_failure(failures, reports)[:3] == (1, "ValueError: b (exit status 1)", 1)


def test_the_earliest_of_two_real_failures_is_first_and_sys_exit_keeps_its_status():
    failures = {0: Failure(1), 1: Failure(3, timestamp=90)}
    reports = {0: {"error": "KeyError: 'x'", "time": 95.0}}
    assert first_failure(failures, reports)[:3] == (1, "exit status 3", 3)
    reports = {0: {"error": "KeyError: 'x'", "time": 80.0}}
    assert first_failure(failures, reports)[:3] == (0, "KeyError: 'x' (exit status 1)", 1)


needs_tf = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                              reason="tensorflow is not installed")


@needs_tf
@pytest.mark.tensorflow
@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 513])
@pytest.mark.parametrize("size", [2, 3, 8])
def test_shard_rows_are_padded_like_distributed_sampler(n, size):
    from sdp_runtime.tensorflow.data import _rows_of

    rows = [_rows_of(list(range(n)), size, r).tolist() for r in range(size)]
    per_rank = -(-n // size)
    assert all(len(mine) == per_rank for mine in rows)  # the same number of steps everywhere
    flat = [i for mine in rows for i in mine]
    assert set(flat) == set(range(n))  # every sample is seen
    # the same as DistributedSampler(shuffle=False): indices padded with the first ones
    padded = (list(range(n)) * (per_rank * size // n + 1))[: per_rank * size]
    assert rows == [padded[r::size] for r in range(size)]


@needs_tf
@pytest.mark.tensorflow
def test_shard_takes_the_same_rows_of_every_array_kind():
    import numpy as np
    import tensorflow as tf
    from sdp_runtime.tensorflow.data import _rows_of, _take_rows

    x = np.arange(10).reshape(5, 2)
    rows = _rows_of(x, 2, 1)
    assert rows.tolist() == [1, 3, 0]
    assert _take_rows(x, rows).tolist() == [[2, 3], [6, 7], [0, 1]]
    assert _take_rows(tf.constant(x), rows).numpy().tolist() == [[2, 3], [6, 7], [0, 1]]
    both = _take_rows({"a": x, "b": np.arange(5)}, rows)
    assert both["b"].tolist() == [1, 3, 0]
    pair = _take_rows((x, np.arange(5)), _rows_of((x, np.arange(5)), 2, 0))
    assert pair[1].tolist() == [0, 2, 4]
    with pytest.raises(ValueError, match="different lengths"):
        _rows_of((x, np.arange(4)), 2, 0)
