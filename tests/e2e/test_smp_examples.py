"""SageMaker's public SMP examples, in their shape, converted and run to their end (issue 40).

Four fixtures are written in the shape of the public model-parallel examples (not copies):
``fixtures/smp/torch_mnist_split`` (PyTorch MNIST: SplitDataset by ``dp_rank``, AMP, an
evaluation step returning Python numbers, a partial checkpoint), ``tf2_mnist`` (TF2 MNIST:
DistributedModel subclass, ``reset_states``, ``smp.CheckpointManager``), ``tf2_mnist_horovod``
(the same with Horovod's allreduce and broadcast) and ``torch_gpt_sharded_data_parallel`` (GPT-2
with sharded data parallelism: ``get_module``, ``set_activation_checkpointing``, FP16 optimizer
options, ``save_checkpoint`` / ``resume_from_checkpoint``, a loader factory given ``dp_rank``, a
per-rank logits file). Each is converted with ``sdp-convert`` and run on CPU processes with
synthetic data: the MNIST downloads come from ``tests/e2e/real/stubs`` (which also audits who
writes which file), torchnet and Hugging Face's ``transformers`` from ``tests/e2e/smp_stubs``, and
the GPT token files are written by the test.

Where the configuration is data parallel, the two-process run ends with the weights of the
one-process run it equals:

* PyTorch MNIST: 2 replicas x B (each one half of the data, one batch an epoch) == 1 process x 2B;
* TF2 MNIST (with and without Horovod): every rank reads all of the data (SMP's recipe only seeds
  the shuffle by ``dp_rank``), one batch of all of it an epoch, so 2 processes == 1 process at the
  same batch; equal only when both start from the same weights (``tf.random.set_seed``);
* GPT-2: 2 replicas x B == 1 process x 2B (dropout off), and the sharded run (sharded data
  parallelism over both processes, stopped after a partial ``save_checkpoint`` and resumed with
  ``resume_from_checkpoint``) == the data-parallel run.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
from pathlib import Path

import pytest

from .harness import (
    AUDIT_PATH,
    FIXTURES,
    SDP_RUN,
    Output,
    assert_state_close,
    converted_copy,
    copy_script,
    finish,
    load_weights,
    start,
    writers,
)

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
STUBS = os.pathsep.join([str(HERE / "smp_stubs"), str(HERE / "real" / "stubs"), str(AUDIT_PATH)])
SMP = FIXTURES / "smp"
TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_NUM_INTEROP_THREADS": "1",
          "TF_NUM_INTRAOP_THREADS": "1"}


def _env(samples: int, **extra: str) -> dict[str, str]:
    return {"PYTHONPATH": STUBS, "SDP_REAL_SAMPLES": str(samples), **extra}


def _launch(script: Path, run_dir: Path, n: int, args: list[str], env: dict[str, str],
            timeout: float = 240):
    copy_script(script, run_dir, "train.py")
    launcher = [SDP_RUN, "-n", str(n)] if n > 1 else [sys.executable]
    return start([*launcher, "train.py", *args], run_dir, env, audit_dir=run_dir.parent
                 / f"{run_dir.name}.audit", timeout=timeout)


def _partial_model(path: Path) -> dict[str, object]:
    import torch

    state = torch.load(path, map_location="cpu", weights_only=True)["model_state_dict"]
    assert state.pop("_smp_is_partial") is True
    return state


# -- PyTorch MNIST ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mnist(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("smp_pt_mnist")
    script = converted_copy(SMP / "torch_mnist_split" / "input.py", root / "convert")
    env = _env(64, SM_HP_MP_PARAMETERS='{"microbatches": 2, "ddp": true}')
    args = ["--epochs", "2", "--checkpoint-dir", "ckpt", "--log-interval", "1"]
    procs = [_launch(script, root / "two", 2, [*args, "--batch-size", "32"], env),
             _launch(script, root / "one", 1, [*args, "--batch-size", "64"], env)]
    finish(*procs)
    return {"root": root, "two": root / "two", "one": root / "one", "log": procs[0].output}


def test_pytorch_mnist_runs_to_its_end_with_one_process_weights(mnist):
    ckpt = Path("ckpt") / "pt_mnist_checkpoint.pt_0"
    assert_state_close(_partial_model(mnist["two"] / ckpt), _partial_model(mnist["one"] / ckpt),
                       "PyTorch MNIST: 2 replicas x 32 (SplitDataset by dp_rank) vs 1 x 64")
    assert "Test set: Average loss" in mnist["log"]


def test_pytorch_mnist_checkpoint_written_once(mnist):
    who = writers(mnist["root"] / "two.audit")
    assert who.get("ckpt/pt_mnist_checkpoint.pt_0") == ["0"], who


# -- TensorFlow 2 MNIST, without and with Horovod ------------------------------------------------


@pytest.fixture(scope="module", params=["tf2_mnist", "tf2_mnist_horovod"])
def tf_mnist(request, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("tensorflow")
    root = tmp_path_factory.mktemp(f"smp_{request.param}")
    script = converted_copy(SMP / request.param / "input.py", root / "convert")
    env = _env(64, SM_HP_MP_PARAMETERS='{"microbatches": 2}', **TF_ENV)
    args = ["--batch-size", "64", "--epochs", "2", "--model-dir", "."]
    if request.param == "tf2_mnist":
        args += ["--checkpoint-dir", "ckpt"]
    procs = [_launch(script, root / "two", 2, args, env),
             _launch(script, root / "one", 1, args, env)]
    finish(*procs)
    return {"root": root, "two": root / "two", "one": root / "one", "name": request.param,
            "log": procs[0].output}


def test_tensorflow_mnist_runs_to_its_end_from_the_same_weights(tf_mnist):
    out = Output("mnist.weights.h5")
    assert_state_close(load_weights(tf_mnist["two"], out), load_weights(tf_mnist["one"], out),
                       f"{tf_mnist['name']}: 2 processes vs 1 (every rank reads all the data)")
    assert "Epoch 2, Loss" in tf_mnist["log"]


def test_tensorflow_mnist_checkpoint_manager_writes_on_rank_0(tf_mnist):
    if tf_mnist["name"] != "tf2_mnist":
        pytest.skip("the Horovod example writes no checkpoint")
    who = writers(tf_mnist["root"] / "two.audit")
    written = {p: r for p, r in who.items() if p.startswith("ckpt/")}
    assert written and all(r == ["0"] for r in written.values()), who


# -- GPT-2, sharded data parallelism -------------------------------------------------------------

GPT_ARGS = [
    "--max_context_width", "16", "--vocab_size", "64", "--hidden_width", "32", "--num_layers",
    "2", "--num_heads", "2", "--resid_pdrop", "0", "--embd_pdrop", "0", "--attn_pdrop", "0",
    "--lr", "0.001", "--lr_decay_iters", "4", "--warmup", "0", "--same_seed", "1",
    "--microbatches", "2",
    "--save_final_full_model", "1", "--logits_output", "logits.pt", "--epochs", "1",
    "--validation_freq", "2", "--validation_batches", "1",
]


def _token_files(directory: Path, count: int, seed: int) -> None:
    import random

    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    with gzip.open(directory / "part-0.json.gz", "wt") as f:
        for _ in range(count):
            ids = [rng.randrange(64) for _ in range(16)]
            f.write(json.dumps({"input_ids": ids, "attention_mask": [1] * 16}) + "\n")


@pytest.fixture(scope="module")
def gpt(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("smp_gpt")
    script = converted_copy(SMP / "torch_gpt_sharded_data_parallel" / "input.py",
                            root / "convert")
    _token_files(root / "data" / "train", 64, 1)
    _token_files(root / "data" / "test", 16, 2)
    data = ["--training-dir", str(root / "data" / "train"), "--test-dir",
            str(root / "data" / "test"), "--model-dir", ".", "--checkpoint-dir", "ckpt"]
    env = _env(64)
    b = 4
    steps = ["--max_steps", "4"]
    procs = [
        _launch(script, root / "dp", 2, [*GPT_ARGS, *data, *steps, "--train_batch_size", str(b)],
                env),
        _launch(script, root / "one", 1,
                [*GPT_ARGS, *data, *steps, "--train_batch_size", str(2 * b)], env),
        _launch(script, root / "sharded", 2,
                [*GPT_ARGS, *data, "--max_steps", "2", "--checkpoint_freq", "2",
                 "--sharded_data_parallel_degree", "2", "--train_batch_size", str(b)], env),
    ]
    finish(*procs)
    # The sharded run, resumed from its partial checkpoint for steps 3 and 4.
    resumed = start([SDP_RUN, "-n", "2", "train.py", *GPT_ARGS, *data, *steps,
                     "--sharded_data_parallel_degree", "2", "--train_batch_size", str(b),
                     "--load_partial", "1"], root / "sharded", env,
                    audit_dir=root / "resumed.audit", timeout=240)
    finish(resumed)
    return {"root": root, "dp": root / "dp", "one": root / "one", "sharded": root / "sharded",
            "log": procs[0].output + resumed.output}


def _full_model(run_dir: Path) -> dict[str, object]:
    import torch

    return torch.load(run_dir / "fullmodel.pt", map_location="cpu", weights_only=False)


def _sharded_model(run_dir: Path, shards: int) -> dict[str, object]:
    """The whole model from a partial ``save_checkpoint``: FSDP shards dimension 0 of every
    parameter in rank order."""
    import torch

    tags = sorted(run_dir.glob("sharded_data_parallel_final_full_*_partial"))
    assert len(tags) == 1, sorted(p.name for p in run_dir.iterdir())
    parts = [torch.load(tags[0] / f"model_{r}.pt", map_location="cpu", weights_only=False)
             for r in range(shards)]
    return {k: torch.cat([p[k] for p in parts]) if parts[0][k].dim() else parts[0][k]
            for k in parts[0] if k != "_smp_is_partial"}


def test_gpt_data_parallel_run_equals_one_process(gpt):
    assert_state_close(_full_model(gpt["dp"]), _full_model(gpt["one"]),
                       "GPT-2: 2 replicas x 4 vs 1 process x 8", rtol=1e-4, atol=1e-5)
    assert "SMP training finished successfully" in gpt["log"]


def test_gpt_sharded_run_resumed_from_save_checkpoint_equals_data_parallel(gpt):
    assert "Batch 3 Loss" in gpt["log"]
    assert_state_close(_sharded_model(gpt["sharded"], 2), _full_model(gpt["dp"]),
                       "GPT-2: sharded data parallelism over 2, resumed after step 2, vs 2 "
                       "replicas", rtol=1e-4, atol=1e-5)


def test_gpt_per_rank_logits_file_and_checkpoints(gpt):
    files = {p.name for p in gpt["dp"].iterdir()}
    assert "rank_0_logits.pt" in files and "rank_1_logits.pt" not in files
    partial = gpt["sharded"] / "ckpt" / "total_steps2_partial"
    assert {p.name for p in partial.iterdir()} >= {"model_0.pt", "model_1.pt", "optimizer_0.pt",
                                                    "optimizer_1.pt", "user_content.pt"}
    assert (gpt["sharded"] / "ckpt" / "newest").read_text().strip() == "total_steps2"
