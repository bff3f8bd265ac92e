"""Horovod's PyTorch API where Horovod's own test suite (benchmarks/horovod_suites.py) found
sdp_runtime.torch lacking: re-init, alltoall, reducescatter, grouped and async collectives, the
gradients of allgather / alltoall / reducescatter, process sets refused, and the names not
provided raising an error that says what to do. Two real processes on Gloo."""

from __future__ import annotations

import pytest

from ._spawn import results, spawn

CHECKS = [
    "init_after_shutdown_meets_the_same_peers",
    "build_queries",
    "alltoall_with_and_without_splits",
    "alltoall_gradient_goes_back_where_the_rows_came_from",
    "reducescatter_sum_average_and_uneven_rows",
    "reducescatter_gradient_is_horovods",
    "allgather_gradient_is_the_average_of_its_rows",
    "scaling_integers_and_halves_as_horovod",
    "broadcast_and_grouped_allreduce_are_differentiable",
    "alltoall_every_dtype",
    "grouped_allgather_and_async_grouped_allreduce",
    "sparse_allreduce_async_sums_or_averages",
    "sparse_gradients_reach_sparse_adam_averaged",
    "named_parameters_must_name_every_parameter",
    "the_global_process_set_is_accepted_and_others_refused",
    "names_not_provided_say_what_to_do_instead",
]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> list[dict[str, str]]:
    return results(spawn("_scenarios_horovod:horovod_suite", 2, tmp_path_factory.mktemp("hvd")))


@pytest.mark.timeout(240)
def test_suite_ran_every_check(suite):
    for outcome in suite:
        assert list(outcome) == CHECKS


@pytest.mark.timeout(240)
@pytest.mark.parametrize("check", CHECKS)
def test_horovod_torch_api(suite, check):
    for rank, outcome in enumerate(suite):
        assert outcome[check] == "ok", f"rank {rank}:\n{outcome[check]}"
