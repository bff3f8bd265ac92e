"""``sdp_runtime.torch.shard``: this rank's part of a list of examples, or of a dataset's
``examples`` (a legacy torchtext iterator's data, ``shard_torchtext_iterator``), the same count
on every rank, on two real processes."""

from __future__ import annotations

import pytest

from ._spawn import results, spawn


@pytest.mark.timeout(180)
def test_every_rank_gets_its_own_examples_and_the_same_count(tmp_path):
    first, second = results(spawn("_scenarios_shard:shard_examples", 2, tmp_path))
    assert first["before_init"] == second["before_init"] == [0, 1, 2, 3, 4]
    assert first["list"] == ["a", "c", "e"] and second["list"] == ["b", "d", "a"]
    # Five examples on two ranks: three each, the first one again on rank 1 (as
    # DistributedSampler pads), so both make the same number of batches.
    assert first["examples"] == [0, 2, 4] and second["examples"] == [1, 3, 0]
    for out in (first, second):
        assert out["fields"] == {"src": "field"} and out["a_copy"] is True
        assert out["original_whole"] == [0, 1, 2, 3, 4]
