"""Converted TensorFlow / Keras scripts train data-parallel correctly (DESIGN.md, "Equivalence").

For every ``fixtures/tensorflow/<case>/`` and ``fixtures/keras/<case>/`` with an ``e2e.json``
(schema: ``test_torch_equivalence``), ``input.py`` is converted with the real ``sdp-convert`` and
run as in ``test_torch_equivalence``:

* ``original_2b``: the original, one process, batch 2B and learning rate 2*lr;
* ``converted_2p``: the converted script under ``sdp-run -n 2``, batch B and lr per process (the
  script scales the lr by ``size()`` itself);
* ``converted_1p`` / ``original_1p``: both with plain ``python``, batch B, lr;
* ``converted_1p_2b`` (shuffled cases only): the converted script, one process, batch 2B, 2*lr.

and one test per case asserts, from those runs:

* 2 processes at B == 1 process at 2B (``rtol``/``atol`` of ``harness``): ``dataset.shard`` /
  ``x[rank::size]`` give each rank every other example, so the two per-rank batches of a step are
  the original's batch, and the averaged gradients are the original's. Shuffled data cannot be
  compared exactly (each rank shuffles its own shard): the weights must then be finite and as big
  as the original's, and as the converted script's on one process at 2B;
* 1 converted process == the original at B, bit for bit (shuffled: finite and as big): on one
  process the runtime's collectives, shard and lr scaling change nothing;
* every output and every file in ``writes`` is written by one process only, rank 0, and the run
  leaves the same files as the original (TensorBoard event files, named after their host and
  process, are compared by count).

Outputs are ``.npz`` files (``np.savez(path, *model.weights)``) or HDF5 weights (``.h5``, Keras
``save_weights``); see ``harness.load_weights``. TensorFlow takes 2-3 s to import in each process,
so all runs of a case are started at once and each case is one test with several assertions.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from .harness import (
    Spec,
    all_specs,
    assert_state_close,
    assert_state_similar,
    files_in,
    load_weights,
    writers,
)
from .test_torch_equivalence import Runs

HAS_TF = importlib.util.find_spec("tensorflow") is not None

pytestmark = [
    pytest.mark.slow,
    pytest.mark.tensorflow,
    pytest.mark.skipif(not HAS_TF, reason="tensorflow is not installed"),
]

SPECS = all_specs("tensorflow") + all_specs("keras")
# ``Runs`` keeps one directory per case name: tensorflow/x and keras/x would share it.
assert len({s.case.name for s in SPECS}) == len(SPECS), "two e2e cases have the same name"
#: TensorBoard names each event file after its time, host and process.
_EVENT_FILE = re.compile(r"(^|/)events\.out\.tfevents\.[^/]*$")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tmp_path_factory.mktemp("e2e_tf"))


def left_files(run_dir: Path, script: str) -> list[str]:
    """The files a run left, event files reduced to their directory (so counted, not named)."""
    return sorted(_EVENT_FILE.sub(r"\1events.out.tfevents.*", f) for f in files_in(run_dir, script))


@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
def test_converted_case_trains_like_the_original(spec: Spec, runs: Runs):
    two = runs.get(spec, "converted_2p")
    original_2b = runs.get(spec, "original_2b")
    converted_1p = runs.get(spec, "converted_1p")
    original_1p = runs.get(spec, "original_1p")

    for out in spec.outputs:
        what = f"{spec.name} {out.file}"
        got = load_weights(two.dir, out)
        if spec.shuffle:
            same_script = load_weights(runs.get(spec, "converted_1p_2b").dir, out)
            assert_state_similar(got, same_script, f"{what}: 2 processes x B vs 1 process x 2B")
            assert_state_similar(got, load_weights(original_2b.dir, out), f"{what} vs the original")
        else:
            assert_state_close(
                got, load_weights(original_2b.dir, out),
                f"{what}: 2 processes x B vs the original at 2B, 2*lr",
            )

        got, want = load_weights(converted_1p.dir, out), load_weights(original_1p.dir, out)
        what = f"{what}: converted vs original, one process"
        if spec.shuffle:
            assert_state_similar(got, want, what)
        else:
            assert_state_close(got, want, what, exact=True)

    who = writers(two.audit)
    for path in dict.fromkeys([*(o.file for o in spec.outputs), *spec.writes]):
        assert (two.dir / path).exists(), f"{spec.name}: {path} was not written"
        assert who.get(path) == ["0"], (
            f"{spec.name}: {path} must be written by one process, rank 0; written by ranks "
            f"{who.get(path)} (- = no RANK)"
        )
    others = {path: ranks for path, ranks in who.items() if set(ranks) != {"0"}}
    assert not others, f"{spec.name}: files written by processes other than rank 0: {others}"
    assert left_files(two.dir, two.script) == left_files(original_2b.dir, original_2b.script), (
        f"{spec.name}: the 2-process run left other files than the original"
    )
