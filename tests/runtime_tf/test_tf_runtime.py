"""sdp_runtime.tensorflow on real processes (sdp-run, Gloo, CPU).

Each test starts one worker script per world size, which runs many checks and reports which
passed; see ``workers/``. TF takes 2-3 s to import, so checks are batched per process.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.runtime_tf.launch import HAS_TF, run_alone, run_ranks

pytestmark = [
    pytest.mark.tensorflow,
    pytest.mark.slow,
    pytest.mark.skipif(not HAS_TF, reason="tensorflow is not installed"),
]

COLLECTIVE_CHECKS = [
    "basics",
    "allreduce_every_dtype_and_op",
    "allreduce_scalar_and_horovod_spellings",
    "inputs_are_never_written",
    "earlier_results_stay_valid",
    "xla_is_refused_clearly",
    "tf_function_hands_over_eagerly_on_the_tensors_device",
    "dlpack_layout_and_gpu_numbering",
    "grouped_allreduce_mixed_dtypes_none_and_slices",
    "allgather_uneven_first_dims",
    "broadcast_from_each_root",
    "objects",
    "broadcast_keras_model_optimizer_and_tf_variables",
    "tape_training_matches_union_batch",
    "tape_analytic_none_nested_and_sparse",
    "distributed_optimizer_custom_loop",
    "sharded_sequence_reshuffles_alike",
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nproc", [2, 3])
def test_collectives_tape_and_optimizer(tmp_path: Path, nproc: int) -> None:
    results = run_ranks("collectives_worker.py", nproc, tmp_path, timeout=240)
    for result in results:
        assert result["size"] == nproc
        assert result["passed"] == COLLECTIVE_CHECKS


@pytest.mark.timeout(300)
def test_fit_on_two_ranks_equals_one_rank_with_the_union_batch(tmp_path: Path) -> None:
    (one,) = run_ranks("fit_worker.py", 1, tmp_path / "one", timeout=120)
    two = run_ranks("fit_worker.py", 2, tmp_path / "two", timeout=180)

    assert one["passed"] == ["save_and_load", "warmup", "schedule"]
    assert two[0]["passed"] == ["save_and_load", "warmup", "schedule"]
    assert two[1]["passed"] == ["warmup", "schedule"]
    # The ranks started from different random weights and saw different data.
    for a, b in zip(two[0]["weights"], two[1]["weights"], strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(two[0]["weights"], one["weights"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # MetricAverageCallback: every rank's history holds the mean of the ranks' own losses.
    assert two[0]["local_loss"] != two[1]["local_loss"]
    mean = np.mean([two[0]["local_loss"], two[1]["local_loss"]], axis=0)
    for rank in two:
        np.testing.assert_allclose(rank["loss"], mean, rtol=1e-6)
    assert one["loss"] == one["local_loss"]


@pytest.mark.timeout(300)
def test_xla_steps_on_two_ranks_equal_one_rank_with_the_union_batch(tmp_path: Path) -> None:
    """jit_compile=True: fit (split step; XLA off: by default without a GPU, for a custom
    train_step) and a custom loop's step as sdp-convert leaves it."""
    (one,) = run_ranks("xla_worker.py", 1, tmp_path / "one", timeout=150)
    two = run_ranks("xla_worker.py", 2, tmp_path / "two", timeout=200)

    cases = ["fit", "fit_auto", "fit_custom_step", "tape_step"]
    assert one["passed"] == cases and all(rank["passed"] == cases for rank in two)
    for case in cases:
        for a, b in zip(two[0][case], two[1][case], strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"{case}: ranks differ")
        for a, b in zip(two[0][case], one[case], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=case)
    # What the runtime did is said once, on rank 0, and nothing is said on one process.
    said = {case: two[0][f"{case}_warnings"] for case in ("fit", "fit_auto", "custom")}
    assert [len(w) for w in said.values()] == [1, 1, 1], said
    assert "forward and backward pass in one XLA function" in said["fit"][0]
    assert "without XLA" in said["fit_auto"][0] and "has no GPU" in said["fit_auto"][0]
    assert "TapeModel defines its own train_step" in said["custom"][0]
    for key in ("fit_warnings", "fit_auto_warnings", "custom_warnings"):
        assert two[1][key] == [] and one[key] == []


@pytest.mark.timeout(200)
def test_one_process_without_launcher_is_the_unwrapped_script(tmp_path: Path) -> None:
    result = run_alone("single_worker.py", tmp_path, timeout=150)
    assert result["passed"] == [
        "quiet_light_import",
        "collectives_are_identities",
        "fit_unchanged",
        "tape_unchanged",
    ]


def _gpu_count() -> int:
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        listing = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU ") for line in listing.splitlines())


@pytest.mark.cuda
@pytest.mark.timeout(300)
@pytest.mark.skipif(_gpu_count() == 0, reason="needs a CUDA GPU")
def test_nccl_smoke(tmp_path: Path) -> None:
    nproc = min(2, _gpu_count())
    results = run_ranks("cuda_worker.py", nproc, tmp_path, timeout=240)
    assert all(result["passed"] == ["nccl"] for result in results)


LAZY_CHECKS = [
    "sequential_dropout",
    "sequential_batchnorm",
    "sequential_noise_flip",
    "subclassed",
    "functional",
    "barrier",
]


@pytest.mark.timeout(300)
def test_broadcast_callback_waits_for_lazily_built_models_alone(tmp_path: Path) -> None:
    """Issue 18: a Sequential without Input holding Dropout has variables (a seed) but no
    trainable ones before its first step; building the optimizer then broke the first step."""
    result = run_alone("lazy_build_worker.py", tmp_path, timeout=150)
    assert result["passed"] == LAZY_CHECKS


@pytest.mark.timeout(300)
def test_broadcast_callback_lazily_built_models_end_equal_on_two_ranks(tmp_path: Path) -> None:
    first, second = run_ranks("lazy_build_worker.py", 2, tmp_path, timeout=200)
    assert first["passed"] == second["passed"] == LAZY_CHECKS
    # Different seeds and data per rank: equal weights mean the broadcast and averaging worked.
    for name in LAZY_CHECKS[:-1]:
        for a, b in zip(first["weights"][name], second["weights"][name], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


_WITHOUT_INIT = """
import numpy as np
import tensorflow as tf
import sdp_runtime.tensorflow as sdp

x = np.arange(10, dtype="float32")
ds = tf.data.Dataset.from_tensor_slices(x)
assert sdp.shard(ds) is ds
assert sdp.shard(x) is x
assert not sdp.is_initialized()
print("ok")
"""


@pytest.mark.timeout(120)
def test_shard_without_init_returns_the_data_itself() -> None:
    # A data module the converter sharded (project mode), imported by an evaluation script that
    # never calls init(): one process reads all of it, as before the conversion.
    done = subprocess.run([sys.executable, "-c", _WITHOUT_INIT], capture_output=True, text=True,
                          timeout=100, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
