"""A Keras ``Sequence`` that reshuffles its batches without a seed every epoch trains
data-parallel right once converted: ``fixtures/keras/sequence_reshuffled``'s conversion
(``expected.py``, held to the converter's output by ``test_golden``) under ``sdp-run -n 2`` at
batch B ends with the weights of the original on one process at batch 2B and twice the rate.

Each epoch is one step of the whole data set at 2B (64 samples), so the original's weights do not
depend on its order; on two processes the step's two batches are the whole data set only when
both ranks order it alike (``sdp.shard`` runs the Sequence's ``on_epoch_end`` with numpy's global
generator seeded alike on every rank): with different orders the ranks' batches overlap and the
averaged gradient is another. The rate must be scaled too (``LR * sdp.size()``).

(``ImageDataGenerator`` iterators, which reshuffle the same way, are checked on the runtime's
side by ``tests/runtime_tf``'s collectives worker: their files need Pillow to be read.)
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from .harness import (
    FIXTURES,
    SDP_RUN,
    Output,
    assert_state_close,
    copy_script,
    finish,
    load_weights,
    start,
)

HAS_TF = importlib.util.find_spec("tensorflow") is not None

pytestmark = [
    pytest.mark.slow,
    pytest.mark.tensorflow,
    pytest.mark.skipif(not HAS_TF, reason="tensorflow is not installed"),
]

CASE = FIXTURES / "keras" / "sequence_reshuffled"
PYTHON = str(Path(SDP_RUN).parent / "python")
BATCH, LR = 32, 0.05


def test_reshuffled_sequence_on_two_processes_equals_one_at_twice_the_batch(tmp_path: Path):
    original_dir, converted_dir = tmp_path / "original", tmp_path / "converted"
    copy_script(CASE / "input.py", original_dir, "train.py")
    copy_script(CASE / "expected.py", converted_dir, "train.py")
    original = start(
        [PYTHON, "train.py"], original_dir,
        {"BATCH_SIZE": str(2 * BATCH), "LR": repr(2 * LR)}, timeout=150,
    )
    converted = start(
        [SDP_RUN, "-n", "2", "train.py"], converted_dir,
        {"BATCH_SIZE": str(BATCH), "LR": repr(LR)}, timeout=150,
    )
    finish(original, converted)
    weights = Output("weights.npz")
    assert_state_close(
        load_weights(converted_dir, weights), load_weights(original_dir, weights),
        "2 processes x B vs the original at 2B, 2*lr",
    )
