"""sdp_runtime._comm on real processes (Gloo on CPU): every op and dtype, fusion, failures."""

from __future__ import annotations

import socket

import pytest

from ._spawn import results, spawn

SUITE_CHECKS = [
    "before_init", "placement", "init_twice", "every_dtype_and_op", "mixed_dtypes_fused",
    "bool_average_refused", "complex_sum", "many_small_tensors_fused_with_reused_buffers",
    "fp16_compression", "broadcast_every_dtype_fused", "allgather_uneven", "objects_and_barrier",
    "mismatched_tensors_raise_on_every_rank",
]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=[2, 3], ids=["2procs", "3procs"])
def suite(request, tmp_path_factory) -> tuple[int, list[dict[str, str]]]:
    n = request.param
    return n, results(spawn("_scenarios_comm:comm_suite", n, tmp_path_factory.mktemp("comm")))


@pytest.mark.timeout(240)
def test_suite_ran_every_check(suite):
    for outcome in suite[1]:
        assert list(outcome) == SUITE_CHECKS


@pytest.mark.timeout(240)
@pytest.mark.parametrize("check", SUITE_CHECKS)
def test_collective(suite, check):
    n, per_rank = suite
    assert len(per_rank) == n
    for rank, outcome in enumerate(per_rank):
        assert outcome[check] == "ok", f"rank {rank} of {n}:\n{outcome[check]}"


@pytest.mark.timeout(180)
def test_processes_started_by_srun_meet_without_a_launcher(tmp_path):
    with socket.socket() as s:  # rank 0 hosts the store on this port (tcp:// rendezvous)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def slurm(rank: int) -> dict[str, str]:
        return {"SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank), "SLURM_NODEID": "0",
                "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "2",
                "SLURM_JOB_NODELIST": "localhost", "MASTER_PORT": str(port)}

    ranks = results(spawn("_scenarios_comm:placement_and_sum", 2, tmp_path, rank_env=slurm))
    assert [r["placement"] for r in ranks] == [[0, 2, 0, 2, "slurm"], [1, 2, 1, 2, "slurm"]]
    assert [r["sum"] for r in ranks] == [3.0, 3.0]


@pytest.mark.timeout(180)
def test_a_dead_peer_is_an_error_not_a_hang(tmp_path):
    ranks = spawn("_scenarios_comm:dead_peer", 2, tmp_path, env={"SDP_TIMEOUT": "30"})
    assert ranks[1].returncode == 3
    survivor = results(ranks[:1])[0]
    assert survivor["error"] and "allreduce failed on rank 0 of 2" in survivor["error"]
    assert survivor["elapsed"] < 30


@pytest.mark.timeout(180)
def test_a_hung_peer_times_out_after_sdp_timeout(tmp_path):
    ranks = spawn("_scenarios_comm:hung_peer", 2, tmp_path, env={"SDP_TIMEOUT": "3"})
    survivor = results(ranks[:1])[0]
    assert survivor["error"] and "SDP_TIMEOUT" in survivor["error"]
    assert 2 < survivor["elapsed"] < 30


@pytest.mark.timeout(180)
def test_a_peer_that_never_arrives_fails_init_within_sdp_timeout(tmp_path):
    ranks = results(spawn("_scenarios_comm:peer_never_arrives", 2, tmp_path,
                          env={"SDP_TIMEOUT": "3"}))
    assert ranks[1] == {"skipped": True}
    assert ranks[0]["error"] and "could not meet the other processes" in ranks[0]["error"]
    assert 2 < ranks[0]["elapsed"] < 30
