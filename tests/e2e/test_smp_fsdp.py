"""A migrated SMP script with two partitions trains sharded with FSDP, to data parallelism's result.

``fixtures/smp/torch_partitioned_resume/input.py`` (two ``smp.partition`` blocks, AMP with
``smp.amp.GradScaler``, gradient clipping, AdamW, a partial checkpoint per partition each epoch
and a resume from it) is converted with ``sdp-convert`` and run four times:

* ``one``: plain ``python``, no SMP configuration (1 microbatch), batch 2B, two epochs: the
  reference;
* ``dp``: ``sdp-run -n 2``, ``{"microbatches": 2}``: data parallel, batch B per replica;
* ``fsdp``: ``sdp-run -n 2``, ``{"partitions": 2, "microbatches": 4}``: one replica sharded with
  FSDP over both processes, batch 2B, one epoch; then again, resuming from the partial
  checkpoint, for the second epoch.

The final weights (``smp.save(..., partial=False)``) of ``dp`` and ``fsdp`` equal the reference's
within float tolerance and load into the plain ``Classifier()`` with ``strict=True``; the
sharded run wrote one partial file per shard, the data-parallel run one.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from .harness import (
    FIXTURES,
    SDP_RUN,
    Output,
    assert_state_close,
    converted_copy,
    copy_script,
    definitions_of,
    files_in,
    finish,
    load_state,
    start,
)

pytestmark = pytest.mark.slow

CASE = FIXTURES / "smp" / "torch_partitioned_resume"
B = 16
FINAL = Output("final.pt", key="model")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("smp_fsdp")
    script = converted_copy(CASE / "input.py", root / "convert")
    assert "smdistributed" not in script.read_text()
    plans = {
        "one": ([sys.executable], 2 * B, None),
        "dp": ([SDP_RUN, "-n", "2"], B, '{"microbatches": 2}'),
        "fsdp": ([SDP_RUN, "-n", "2"], 2 * B, '{"partitions": 2, "microbatches": 4}'),
    }
    dirs, procs = {}, []
    for name, (launcher, batch, config) in plans.items():
        dirs[name] = root / name
        copy_script(script, dirs[name], "train.py")
        env = {"SM_HP_MP_PARAMETERS": config} if config else {}
        epochs = "1" if name == "fsdp" else "2"
        procs.append(start([*launcher, "train.py", "--batch-size", str(batch), "--epochs", epochs],
                           dirs[name], env, timeout=180))
    finish(*procs)
    # The second epoch of the sharded run, from its partial checkpoint.
    finish(start([SDP_RUN, "-n", "2", "train.py", "--batch-size", str(2 * B), "--epochs", "2"],
                 dirs["fsdp"], {"SM_HP_MP_PARAMETERS": plans["fsdp"][2]}, timeout=180))
    dirs["script"] = script
    return dirs


def test_sharded_run_resumed_from_partial_checkpoints_matches_one_process(runs):
    assert_state_close(load_state(runs["fsdp"], FINAL), load_state(runs["one"], FINAL),
                       "FSDP, 2 partitions, resumed after epoch 1 vs 1 process x 2B")


def test_data_parallel_run_matches_one_process(runs):
    assert_state_close(load_state(runs["dp"], FINAL), load_state(runs["one"], FINAL),
                       "2 replicas x B (2 microbatches) vs 1 process x 2B")


def test_sharded_checkpoint_loads_into_the_plain_model(runs):
    classes = definitions_of(runs["script"])
    model = classes.Classifier()
    model.load_state_dict(load_state(runs["fsdp"], FINAL), strict=True)


def test_partial_checkpoints_one_file_per_shard(runs):
    assert {f for f in files_in(runs["fsdp"], "train.py") if f.startswith("partial")} == {
        "partial.pt_0", "partial.pt_1"}
    assert {f for f in files_in(runs["dp"], "train.py") if f.startswith("partial")} == {
        "partial.pt_0"}
