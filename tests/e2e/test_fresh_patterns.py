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
