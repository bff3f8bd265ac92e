"""Converted TensorFlow / Keras scripts split the right data, once, and keep the ranks in step
(issue 22), run for real: each case's conversion (``expected.py``, which ``test_golden`` holds
to the converter's output) under ``sdp-run -n 2``, and for some the original on one process, all
through ``tf_probe`` (which records the samples each process trains on,
its steps, its evaluation data and its broadcasts). For each case:

* the two ranks run the same number of steps (an uneven split would leave one waiting);
* their training samples are disjoint and as many as the original's (no sample twice, none left
  out), none of them evaluation samples; where the right part must be found (a split, adapt's
  statistics, a helper, a zip) the original runs too and the samples are the same;
* every evaluation input is the original's, whole and non-empty, on both ranks;
* rank 0's weights reach the other rank once: one ``broadcast_variables`` call per model and
  optimizer in a custom loop, one by the Keras callback for ``fit`` (none inside ``train_step``).
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from .harness import FIXTURES, SDP_RUN, copy_script, finish, start

HAS_TF = importlib.util.find_spec("tensorflow") is not None

pytestmark = [
    pytest.mark.slow,
    pytest.mark.tensorflow,
    pytest.mark.skipif(not HAS_TF, reason="tensorflow is not installed"),
]

PROBE = Path(__file__).resolve().parent / "tf_probe.py"
PYTHON = str(Path(SDP_RUN).parent / "python")


@dataclass(frozen=True)
class Case:
    name: str
    #: training samples of one epoch in the original (None: not an exact split, e.g.
    #: validation_split takes its part of each worker's shard)
    samples: int | None
    broadcasts: int  # per rank
    evaluations: tuple[int, ...] = ()
    #: run the original too, and compare the ranks' samples with its samples (where the right
    #: part must be found: a split, adapt's statistics, a helper); else only their number
    as_original: bool = False
    #: both ranks get the same number of samples (False where whole batches are split)
    even: bool = True


CASES = [
    Case("keras/gan_fit_images", 64, broadcasts=1),
    Case("tensorflow/zip_two_pipelines", 64, broadcasts=2, as_original=True),
    Case("keras/split_take_skip", 64, broadcasts=1, evaluations=(16, 16), as_original=True),
    Case("keras/permuted_arrays", 64, broadcasts=1, evaluations=(16,)),
    Case("keras/dataset_helper", 64, broadcasts=1, evaluations=(16, 16), as_original=True),
    Case("keras/sequence_batches", 64, broadcasts=1),
    Case("keras/timeseries_utility", 60, broadcasts=1, even=False),
    Case("keras/normalization_adapt_split", 64, broadcasts=1, as_original=True),
    Case("tensorflow/early_stop_loop", 64, broadcasts=2),
    Case("keras/environment_first", None, broadcasts=1),
]


def _probes(directory: Path) -> list[dict]:
    found = [json.loads(p.read_text()) for p in sorted(directory.glob("probe.*.json"))]
    return sorted(found, key=lambda p: p["rank"])


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_ranks_train_disjoint_parts_in_step_and_evaluate_everything(case: Case, tmp_path: Path):
    source = FIXTURES / case.name / "input.py"
    original_dir, converted_dir = tmp_path / "original", tmp_path / "converted"
    copy_script(source, original_dir, "train.py")
    copy_script(FIXTURES / case.name / "expected.py", converted_dir, "train.py")
    procs = []
    if case.as_original:
        env = {"SDP_PROBE_DIR": str(original_dir)}
        procs.append(start([PYTHON, str(PROBE), "train.py"], original_dir, env, timeout=150))
    env = {"SDP_PROBE_DIR": str(converted_dir)}
    converted = start(
        [SDP_RUN, "-n", "2", str(PROBE), "train.py"], converted_dir, env, timeout=150
    )
    finish(*procs, converted)

    ranks = _probes(converted_dir)
    assert [r["rank"] for r in ranks] == ["0", "1"], converted.output[-3000:]
    first, second = (set(r["train"]) for r in ranks)
    # In step: the same number of optimizer steps and of fit batches on both ranks.
    assert ranks[0]["steps"] == ranks[1]["steps"] > 0
    assert ranks[0]["fit_batches"] == ranks[1]["fit_batches"]
    # Disjoint parts, each about half, and none of them evaluation data.
    assert ranks[0]["train"] and ranks[1]["train"]
    assert not first & second, f"{len(first & second)} samples on both ranks"
    for rank, mine in zip(ranks, (first, second), strict=True):
        assert not mine & set(rank["eval_ids"]), "evaluation samples in the training data"
    if case.samples is not None:
        assert len(first | second) == case.samples
    if case.as_original:
        (alone,) = _probes(original_dir)
        assert len(set(alone["train"])) == case.samples
        assert first | second == set(alone["train"]), "not the original's training data"
        assert alone["eval"] == list(case.evaluations)
    if case.even:
        assert len(ranks[0]["train"]) == len(ranks[1]["train"])
    # Evaluation data whole and non-empty on every rank.
    for rank in ranks:
        assert rank["eval"] == list(case.evaluations)
    # Rank 0's weights broadcast once per rank (the callback, or the loop's two calls).
    assert [r["broadcasts"] for r in ranks] == [case.broadcasts] * 2
