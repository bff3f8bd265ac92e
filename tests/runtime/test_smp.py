"""sdp_runtime.torch.smp (SageMaker model parallelism's names) on two real processes: the rank
layout of data parallelism and of two partitions, communication on SMP's groups, @smp.step's
microbatches, checkpoints, and FSDP sharding by partition; the configuration parsed alone."""

from __future__ import annotations

import pytest
from sdp_runtime import _smp_config

from . import _scenarios_smp
from ._scenarios_smp import checks_in
from ._spawn import results, spawn

CHECKS = [name for name, _ in checks_in(vars(_scenarios_smp))]


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> list[dict[str, str]]:
    return results(spawn("_scenarios_smp:smp_suite", 2, tmp_path_factory.mktemp("smp")))


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_suite_ran_every_check(suite):
    assert len(CHECKS) == 14
    for outcome in suite:
        assert list(outcome) == CHECKS


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("check", CHECKS)
def test_smp_api(suite, check):
    for rank, outcome in enumerate(suite):
        assert outcome[check] == "ok", f"rank {rank}:\n{outcome[check]}"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_one_process_with_partitions_configured_runs_the_whole_model(tmp_path):
    (out,) = results(spawn("_scenarios_smp:single_process_partitioned", 1, tmp_path,
                           launcher=False, env={"SM_HP_MP_PARAMETERS": '{"partitions": 2}'}))
    assert out == {"configured": 2, "mp_size": 1, "dp_size": 1, "sharded": False, "keys": True}


def test_config_from_sagemaker_environment_and_init_argument():
    env = {"SM_HP_MP_PARAMETERS": '{"pipeline_parallel_degree": 2, "microbatches": 4, "ddp": true}'}
    config = _smp_config.read(None, env)
    assert (config.partitions, config.microbatches, config.sharded) == (2, 4, True)
    assert config.raw is not None and config.raw["ddp"] is True
    override = _smp_config.read({"microbatches": 2, "partitions": 1}, env)
    assert (override.partitions, override.microbatches, override.sharded) == (1, 2, False)
    assert _smp_config.read(None, {}).mp_size == 1


@pytest.mark.parametrize(("text", "message"), [
    ("[1, 2]", "must be a JSON object"),
    ("{not json", "is not JSON"),
    ('{"partitions": 0}', "must be a positive integer"),
    ('{"microbatches": "many"}', "is not an integer"),
])
def test_bad_configuration_is_reported(text, message):
    with pytest.raises(ValueError, match=message):
        _smp_config.read(None, {"SM_HP_MP_PARAMETERS": text})


def test_layout_of_two_partitions_on_four_processes():
    config = _smp_config.read({"partitions": 2})
    layouts = [_smp_config.Layout(r, 4, config) for r in range(4)]
    assert [(x.mp_rank, x.dp_rank) for x in layouts] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert layouts[3].mp_group() == [2, 3] and layouts[3].dp_group() == [1, 3]
    assert (layouts[0].shard_size, layouts[0].replicas) == (2, 2)


def test_layout_of_data_parallelism_and_sharded_data_parallelism():
    plain = _smp_config.Layout(3, 4, _smp_config.read({}))
    assert (plain.mp_rank, plain.dp_rank, plain.dp_size, plain.shard_size) == (0, 3, 4, 1)
    sharded = _smp_config.Layout(3, 4, _smp_config.read({"sharded_data_parallel_degree": 2}))
    assert (sharded.dp_rank, sharded.dp_size, sharded.shard_size, sharded.replicas) == (3, 4, 2, 2)


def test_layout_refuses_a_degree_that_does_not_divide_the_processes():
    with pytest.raises(ValueError, match="does not divide the number of processes"):
        _smp_config.Layout(0, 3, _smp_config.read({"partitions": 2}))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_sharded_state_gathered_on_one_rank_raises_naming_the_call_instead_of_hanging(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    # SDP_TIMEOUT 10: each call on rank 0 alone gives up after 5 s; the spawn kills at 90 s.
    ranks = spawn("_scenarios_smp:one_rank_gathers_a_sharded_model", 2, tmp_path, timeout=90,
                  args=[str(folder)], env={"SDP_TIMEOUT": "10", "SM_HP_MP_PARAMETERS":
                                           '{"sharded_data_parallel_degree": 2}'})
    rank0, rank1 = results(ranks)
    assert rank0["sharded"] and rank1["sharded"]
    for error, call in zip(rank0["errors"], ["model.state_dict()", "optimizer.state_dict()",
                                             "smp.save(partial=True)"], strict=True):
        assert error.startswith(f"{call} on rank 0 needs ranks [0, 1] to call it together: "
                                "rank(s) [1] did not call it within 5 s"), error
        assert "outside any rank test" in error
    assert len(rank0["errors"]) == 3 and rank1["errors"] == []
    assert all(4.5 < s < 30 for s in rank0["seconds"]), rank0["seconds"]
    # Called on both ranks afterwards, the same calls work: the whole state, both shards' files.
    assert rank0["equal"] and rank0["files"] == ["partial.pt_0", "partial.pt_1"]
