"""Fresh public-program patterns (issue 30) converted and run on 2 processes."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .harness import FIXTURES, SDP_RUN, run

pytestmark = pytest.mark.slow
SDP_CONVERT = str(Path(sys.executable).with_name("sdp-convert"))


def test_an_unseeded_random_split_is_the_same_on_every_rank(tmp_path: Path):
    shutil.copy(FIXTURES / "torch" / "random_split_validation" / "input.py",
                tmp_path / "train.py")
    done = subprocess.run([SDP_CONVERT, "train.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "random_split(...) gets generator=" in done.stderr
    proc = run([SDP_RUN, "-n", "2", "train.py", "--epochs", "1"], tmp_path, timeout=120)
    splits = re.findall(r"split (-?\d+)", proc.output)
    assert len(splits) == 2 and splits[0] == splits[1], proc.output
    # Unconverted, two processes draw two different splits (what the generator prevents).
    shutil.copy(FIXTURES / "torch" / "random_split_validation" / "input.py",
                tmp_path / "original.py")
    drawn = {re.findall(r"split (-?\d+)", run([sys.executable, "original.py", "--epochs", "0"],
                                              tmp_path, timeout=60).output)[0]
             for _ in range(2)}
    assert len(drawn) == 2


@pytest.mark.tensorflow
def test_a_batch_iterator_class_reads_its_own_part_on_each_rank(tmp_path: Path):
    pytest.importorskip("tensorflow")
    shutil.copy(FIXTURES / "tensorflow" / "batch_iterator_shuffle" / "input.py",
                tmp_path / "train.py")
    done = subprocess.run([SDP_CONVERT, "train.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "sdp.shard(np.arange(len(self.x)))" in (tmp_path / "train.py").read_text()
    proc = run([SDP_RUN, "-n", "2", "train.py"], tmp_path, {"BATCH_SIZE": "16", "LR": "0.05"},
               timeout=180)
    # 256 samples: each of the 2 ranks reads its own 128 every epoch (not all 256).
    seen = re.findall(r"epoch \d: (\d+) samples", proc.output)
    assert seen == ["128"] * 4, proc.output


@pytest.mark.tensorflow
def test_a_preview_take_leaves_both_fits_on_the_sharded_data(tmp_path: Path):
    pytest.importorskip("tensorflow")
    shutil.copy(FIXTURES / "keras" / "preview_take_two_fits" / "input.py", tmp_path / "train.py")
    done = subprocess.run([SDP_CONVERT, "train.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    proc = run([SDP_RUN, "-n", "2", "train.py"], tmp_path, {"BATCH_SIZE": "16", "LR": "0.05"},
               timeout=180)
    # 256 samples, batch 16 per rank: 8 steps per rank in BOTH fits (16 = the second fit
    # training on all the data, as before the fix).
    steps = re.findall(r"steps per epoch: (\d+)", proc.output)
    assert steps and set(steps) == {"8"}, proc.output


@pytest.mark.tensorflow
def test_keras_weights_read_before_fit_are_rank_0s_on_every_rank(tmp_path: Path):
    pytest.importorskip("tensorflow")
    shutil.copy(FIXTURES / "keras" / "weights_read_before_fit" / "input.py", tmp_path / "train.py")
    done = subprocess.run([SDP_CONVERT, "train.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    converted = (tmp_path / "train.py").read_text()
    broadcast = "sdp.broadcast_variables(model.variables, root_rank=0)\n"
    assert broadcast in converted
    # The same script without the broadcast: the control that shows what it changes.
    (tmp_path / "control.py").write_text(converted.replace(broadcast, ""))
    env = {"BATCH_SIZE": "16", "LR": "0.05"}
    for script, same in (("train.py", True), ("control.py", False)):
        proc = run([SDP_RUN, "-n", "2", script], tmp_path, env, timeout=180)
        before = re.findall(r"loss before training: (\S+)", proc.output)
        moved = re.findall(r"distance moved from the initial weights: (\S+)", proc.output)
        assert len(before) == 2 and len(moved) == 2, proc.output
        # Unseeded: each rank builds its own random weights; read before fit, they are rank 0's
        # only with the broadcast (and the distance moved is then the same on both ranks).
        assert (before[0] == before[1] and moved[0] == moved[1]) is same, proc.output
