"""sdp_runtime._env: who am I, from each launcher's variables (pure unit tests, no processes)."""

from __future__ import annotations

import pytest
from sdp_runtime._env import Placement, detect, expand_nodelist, tasks_per_node


def test_no_launcher_is_one_process():
    assert detect({}) == Placement(0, 1, 0, 1, "127.0.0.1", 29500, "none")


def test_torchrun_variables():
    p = detect({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "1234"})
    assert p == Placement(3, 8, 1, 2, "10.0.0.5", 1234, "torchrun", store_from_env=True)
    assert (p.node_rank, p.num_nodes) == (1, 4)


def test_torchrun_wins_over_slurm_and_mpi():
    p = detect({"RANK": "1", "WORLD_SIZE": "2", "SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "9",
                "OMPI_COMM_WORLD_RANK": "7", "OMPI_COMM_WORLD_SIZE": "9"})
    assert (p.rank, p.size, p.launcher) == (1, 2, "torchrun")
    assert not p.store_from_env  # no MASTER_ADDR/PORT: sdp.init() uses tcp:// itself


def test_slurm_job_step():
    env = {"SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "8", "SLURM_LOCALID": "1",
           "SLURM_NODEID": "2", "SLURM_STEP_TASKS_PER_NODE": "2(x4)",
           "SLURM_JOB_NODELIST": "gpu[07-10]", "SLURM_JOB_ID": "4242"}
    p = detect(env)
    assert p == Placement(5, 8, 1, 2, "gpu07", 29500 + 242, "slurm")
    assert detect({**env, "SLURM_NTASKS_PER_NODE": "4", "SLURM_LOCALID": "3"}).local_size == 4
    assert detect({**env, "MASTER_ADDR": "head", "MASTER_PORT": "5000"}).master_addr == "head"


def test_slurm_uneven_tasks_per_node():
    p = detect({"SLURM_PROCID": "6", "SLURM_STEP_NUM_TASKS": "7", "SLURM_LOCALID": "0",
                "SLURM_NODEID": "3", "SLURM_STEP_TASKS_PER_NODE": "2(x3),1",
                "SLURM_STEP_NODELIST": "a1,b[2-4]"})
    assert (p.local_rank, p.local_size, p.master_addr) == (0, 1, "a1")


def test_slurm_batch_script_outside_a_step_is_not_a_launcher():
    # sbatch's own shell has SLURM_PROCID and SLURM_NTASKS but runs only one process
    assert detect({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "n1"}).size == 1
    assert detect({"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_STEP_ID": "0",
                   "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "4",
                   "SLURM_JOB_NODELIST": "n1"}).size == 4


def test_open_mpi_and_pmi():
    p = detect({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4",
                "OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"})
    assert (p.rank, p.size, p.local_rank, p.local_size, p.master_addr, p.launcher) == \
        (2, 4, 2, 4, "127.0.0.1", "mpi")
    p = detect({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"})
    assert (p.rank, p.size, p.local_rank, p.launcher) == (1, 2, 1, "mpi")


def test_mpi_on_several_machines_needs_master_addr():
    env = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4",
           "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    with pytest.raises(ValueError, match="MASTER_ADDR"):
        detect(env)
    assert detect({**env, "MASTER_ADDR": "h0"}).master_addr == "h0"


def test_sagemaker_one_process_per_host():
    p = detect({"SM_HOSTS": '["algo-1", "algo-2", "algo-3"]', "SM_CURRENT_HOST": "algo-2",
                "SM_NUM_GPUS": "8"})
    assert p == Placement(1, 3, 0, 1, "algo-1", 29500, "sagemaker")


@pytest.mark.parametrize("env, message", [
    ({"RANK": "2", "WORLD_SIZE": "2"}, "not within a world of size 2"),
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not an integer"),
    ({"SM_HOSTS": "algo-1", "SM_CURRENT_HOST": "algo-1"}, "not a JSON list"),
    ({"SM_HOSTS": '["algo-1"]', "SM_CURRENT_HOST": "algo-9"}, "not in SM_HOSTS"),
])
def test_inconsistent_variables_are_clear_errors(env, message):
    with pytest.raises(ValueError, match=message):
        detect(env)


@pytest.mark.parametrize("nodelist, hosts", [
    ("node01", ["node01"]),
    ("node[01-03]", ["node01", "node02", "node03"]),
    ("node[8-10,12]", ["node8", "node9", "node10", "node12"]),
    ("gpu[001-002],cpu5,x[1,3]-ib", ["gpu001", "gpu002", "cpu5", "x1-ib", "x3-ib"]),
])
def test_expand_nodelist(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


def test_tasks_per_node():
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert tasks_per_node("4") == [4]
    with pytest.raises(ValueError):
        tasks_per_node("two")
