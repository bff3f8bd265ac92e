"""A migrated SMP script that saves under ``if smp.rank() == 0:`` / ``if smp.dp_rank() == 0:``
trains sharded (FSDP) on 2 processes and writes whole checkpoints equal to data parallelism's.

``fixtures/smp/torch_sharded_guarded_save/input.py`` gathers ``model.state_dict()`` and
``optimizer.state_dict()`` under rank tests, as SMP's guides do. Under sharded data parallelism
``dp_rank() == rank()``, so either test leaves rank 1 out of a gather that needs it. Converted with
``sdp-convert`` (the calls move before the tests), it runs three times on 2 processes, batch B per
data-parallel replica:

* ``dp``: ``{"microbatches": 2}``: plain data parallelism, the reference;
* ``sharded``: ``{"sharded_data_parallel_degree": 2, "microbatches": 2}``: FSDP over both ranks,
  each rank its own B rows;
* ``tensor``: ``{"tensor_parallel_degree": 2, "microbatches": 2}``: tensor parallelism, which is
  FSDP here too (one replica over both ranks, batch 2B, the same on both ranks).

Their ``final.pt`` / ``epoch1.pt`` equal the reference within float tolerance and load into the
plain ``Regressor()`` (and its ``Adam``); the partial checkpoint saved under ``if smp.dp_rank() ==
0:`` has one file per shard. The script with only its import changed (the calls
still under the tests) stops under the sharded configuration with an error naming
``model.state_dict()`` within its time limit instead of hanging, and writes no checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from .harness import (
    FIXTURES,
    SDP_RUN,
    Output,
    assert_state_close,
    converted_copy,
    copy_script,
    definitions_of,
    finish,
    load_state,
    start,
)

pytestmark = pytest.mark.slow

CASE = FIXTURES / "smp" / "torch_sharded_guarded_save"
B = 16
FINAL = Output("final.pt", key="model")
EPOCH = Output("epoch1.pt", key="model")
SHARDED = '{"sharded_data_parallel_degree": 2, "microbatches": 2}'


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("smp_guarded_save")
    script = converted_copy(CASE / "input.py", root / "convert")
    plans = {
        "dp": (B, '{"microbatches": 2}'),
        "sharded": (B, SHARDED),
        "tensor": (2 * B, '{"tensor_parallel_degree": 2, "microbatches": 2}'),
    }
    dirs, procs = {}, []
    for name, (batch, config) in plans.items():
        dirs[name] = root / name
        copy_script(script, dirs[name], "train.py")
        procs.append(start([SDP_RUN, "-n", "2", "train.py", "--batch-size", str(batch)],
                           dirs[name], {"SM_HP_MP_PARAMETERS": config}, timeout=180))
    finish(*procs)
    dirs["script"] = script
    return dirs


@pytest.mark.timeout(600)
def test_sharded_run_saved_under_rank_tests_equals_data_parallel(runs):
    for output in (FINAL, EPOCH):
        assert_state_close(load_state(runs["sharded"], output), load_state(runs["dp"], output),
                           f"{output.file}: sharded data parallel (FSDP) vs data parallel")


@pytest.mark.timeout(600)
def test_tensor_parallel_run_is_fsdp_and_equals_data_parallel(runs):
    assert_state_close(load_state(runs["tensor"], FINAL), load_state(runs["dp"], FINAL),
                       "tensor_parallel_degree 2 (FSDP) vs data parallel")


@pytest.mark.timeout(600)
def test_partial_checkpoint_saved_under_a_rank_test_has_every_shard(runs):
    shards = {"dp": {"partial.pt_0"}, "sharded": {"partial.pt_0", "partial.pt_1"},
              "tensor": {"partial.pt_0", "partial.pt_1"}}
    for name, files in shards.items():
        assert {p.name for p in runs[name].glob("partial.pt*")} == files, name
    # Each rank's file holds its own shard: together they are the whole weight.
    whole = load_state(runs["sharded"], FINAL)["body.0.weight"]
    parts = [torch.load(runs["sharded"] / f"partial.pt_{i}", weights_only=False)["model"]
             for i in (0, 1)]
    assert torch.equal(torch.cat([p["body.0.weight"] for p in parts]), whole)


@pytest.mark.timeout(600)
def test_sharded_checkpoint_loads_into_the_plain_model_and_optimizer(runs):
    classes = definitions_of(runs["script"])
    model = classes.Regressor()
    model.load_state_dict(load_state(runs["sharded"], FINAL), strict=True)
    whole = torch.load(runs["sharded"] / "final.pt", weights_only=False)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    optimizer.load_state_dict(whole["optimizer"])
    reference = torch.load(runs["dp"] / "final.pt", weights_only=False)["optimizer"]
    for got, want in zip(optimizer.state.values(), reference["state"].values(), strict=True):
        assert torch.allclose(got["exp_avg_sq"], want["exp_avg_sq"], rtol=1e-4, atol=1e-7)


@pytest.mark.timeout(300)
def test_unmigrated_guarded_save_stops_naming_the_call_instead_of_hanging(tmp_path):
    """Rank 1 goes on training (2 epochs) or ends its script (1 epoch) while rank 0 waits."""
    text = (CASE / "input.py").read_text().replace(
        "import smdistributed.modelparallel.torch as smp", "import sdp_runtime.torch.smp as smp")
    procs = {}
    for epochs in ("2", "1"):
        (tmp_path / epochs).mkdir()
        (tmp_path / epochs / "train.py").write_text(text)
        procs[epochs] = start(
            [SDP_RUN, "-n", "2", "train.py", "--batch-size", str(B), "--epochs", epochs],
            tmp_path / epochs, {"SM_HP_MP_PARAMETERS": SHARDED, "SDP_TIMEOUT": "10",
                                "SDP_AUDIT": ""}, timeout=120)
    for proc in procs.values():
        with pytest.raises(pytest.fail.Exception) as failed:
            finish(proc)
        assert "exited with status 1" in str(failed.value), str(failed.value)
    said = ("CommunicationError: model.state_dict() on rank 0 needs ranks [0, 1] to call it "
            "together: rank(s) [1] ")
    assert said + "did not call it within 5 s (half of SDP_TIMEOUT)" in procs["2"].output
    assert said + "left the job without calling it" in procs["1"].output
    for proc in procs.values():
        assert "call state_dict() on every rank, outside any rank test" in proc.output
        assert not list(proc.cwd.glob("*.pt"))
