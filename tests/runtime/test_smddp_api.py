"""Every name of SageMaker's SMDDP API reference (smdistributed.dataparallel.torch.distributed,
...torch.parallel.DistributedDataParallel, ...tensorflow) is provided by the module a migrated
script imports, or refused with an error that says what to do: each one imported and called with
its documented signature, on two real processes."""

from __future__ import annotations

import importlib

import pytest
from sdp_convert.migration import ADVICE
from sdp_convert.transforms.migrate_smddp import SMDDP_MODULES

from ._spawn import results, spawn

#: SMDDP's PyTorch API reference (deprecated by SageMaker in v1.4.0 for the "smddp" backend of
#: torch.distributed, which the migration handles too): module -> documented names.
TORCH_API = {
    "smdistributed.dataparallel.torch.distributed": [
        "is_available", "init_process_group", "is_initialized", "get_world_size", "get_rank",
        "get_local_rank", "all_reduce", "broadcast", "all_gather", "all_to_all_single",
        "barrier", "ReduceOp",
    ],
    "smdistributed.dataparallel.torch.parallel": ["DistributedDataParallel"],
}
#: SMDDP's TensorFlow API reference.
TF_API = [
    "init", "size", "local_size", "rank", "local_rank", "allreduce", "broadcast_variables",
    "oob_allreduce", "overlap", "broadcast", "shutdown", "DistributedOptimizer",
    "DistributedGradientTape", "Compression", "ReduceOp",
]
#: Documented, not provided (TF1 graph mode): refused, saying what to call instead.
TF_REFUSED = ["broadcast_global_variables", "BroadcastGlobalVariablesHook"]


@pytest.mark.parametrize(
    ("module", "name"), [(m, n) for m, names in TORCH_API.items() for n in names]
)
def test_each_torch_name_maps_to_a_runtime_name(module: str, name: str) -> None:
    target = SMDDP_MODULES[module]
    assert name in target.names
    assert hasattr(importlib.import_module(target.module), name)


@pytest.mark.tensorflow
def test_each_tensorflow_name_is_provided_or_refused_with_advice() -> None:
    pytest.importorskip("tensorflow")
    target = SMDDP_MODULES["smdistributed.dataparallel.tensorflow"]
    runtime = importlib.import_module(target.module)
    for name in TF_API:
        assert name in target.names and hasattr(runtime, name), name
    for name in TF_REFUSED:
        assert name not in target.names and name in ADVICE
        with pytest.raises(NotImplementedError, match=f"{name} is not provided"):
            getattr(runtime, name)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_every_torch_name_works_as_documented_on_two_processes(tmp_path) -> None:
    called = [n for names in TORCH_API.values() for n in names]
    for outcome in results(spawn("_scenarios_smddp:smddp_torch_api", 2, tmp_path)):
        for name in called:
            key = {"DistributedDataParallel": "distributed_data_parallel",
                   "ReduceOp": "reduce_op"}.get(name, name)
            assert outcome[key] == "ok", f"{name}:\n{outcome[key]}"


@pytest.mark.slow
@pytest.mark.tensorflow
@pytest.mark.timeout(300)
def test_every_tensorflow_name_works_as_documented_on_two_processes(tmp_path) -> None:
    pytest.importorskip("tensorflow")
    from tests.runtime_tf.launch import run_ranks

    for outcome in run_ranks("smddp_tf_worker.py", 2, tmp_path, timeout=240):
        for name in [*TF_API, *TF_REFUSED]:
            assert outcome["names"][name] == "ok", f"{name}:\n{outcome['names'][name]}"
