"""sdp_runtime.torch (Horovod names), DistributedOptimizer, DistributedDataParallel and the SMDDP
names, on two real processes; and the same API in one process started without a launcher."""

from __future__ import annotations

import pytest

from ._spawn import results, spawn

SUITE_CHECKS = [
    "before_init",
    "smddp_names",
    "horovod_queries",
    "allreduce_api",
    "allreduce_is_differentiable",
    "broadcast_and_allgather_api",
    "broadcast_parameters",
    "broadcast_optimizer_state_adam_while_empty_elsewhere",
    "broadcast_optimizer_state_sgd_momentum",
    "distributed_optimizer_averages_gradients",
    "distributed_optimizer_backward_passes_per_step",
    "distributed_optimizer_synchronize_then_clip",
    "distributed_optimizer_missing_gradients",
    "distributed_optimizer_with_scheduler_made_before",
    "distributed_optimizer_step_hooks_run_once_after_state_broadcast",
    "distributed_optimizer_closure",
    "ddp_averages_gradients",
    "ddp_state_dict_is_unprefixed_and_loads_both_ways",
    "ddp_pickles_as_the_plain_module",
    "ddp_with_torch_compile_in_both_orders_trains_the_same",
    "ddp_fp16_compression_trains",
    "ddp_forwards_a_wrapped_sequential_and_trains_sub_module_groups",
    "ddp_a_model_reinitialised_after_the_wrap_still_trains_the_same_everywhere",
    "ddp_a_frozen_module_is_only_called_and_unfreezing_it_raises",
    "rank0_first_lets_local_rank_0_finish_before_the_others_start",
]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> list[dict[str, str]]:
    return results(spawn("_scenarios_torch:torch_suite", 2, tmp_path_factory.mktemp("torch")))


@pytest.mark.timeout(240)
def test_suite_ran_every_check(suite):
    for outcome in suite:
        assert list(outcome) == SUITE_CHECKS


@pytest.mark.timeout(240)
@pytest.mark.parametrize("check", SUITE_CHECKS)
def test_torch_api(suite, check):
    for rank, outcome in enumerate(suite):
        assert outcome[check] == "ok", f"rank {rank}:\n{outcome[check]}"


@pytest.mark.timeout(180)
def test_one_process_without_launcher_behaves_like_the_original(tmp_path):
    (out,) = results(spawn("_scenarios_torch:single_process", 1, tmp_path, launcher=False))
    assert out["placement"] == [0, 1, 0, 1]
    assert out["real_group"] == [True, 1, "gloo"]
    assert out["fp16_untouched"] is True
    assert out["allgather"] == [5]
    assert out["objects"] == ["x", ["y"]]
    assert out["pickled"] == ["Linear", True]
    assert out["same_as_original"] is True
    assert out["alone_ddp"] == [False, False, True, True]
    assert out["after_shutdown"] == [False, False]
    assert out["adopted"] == [1, 2.0]
    assert out["adopted_left_alone"] is True
