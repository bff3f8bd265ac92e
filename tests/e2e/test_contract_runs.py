"""Converted programs of issue 28's shapes run on 2 processes, where they used to crash or hang.

* A module-level ``train.py`` (no ``__main__`` block) that calls ``engine.train`` of another
  module: ``engine.py`` gets ``tqdm(..., disable=sdp.rank() != 0)``, so ``train.py`` must call
  ``sdp.init()`` first (it used to get none: ``NotInitializedError`` at the first epoch, also with
  plain ``python train.py``). The rest of the program is reported, not converted (the contract).
* ``if not os.path.exists(p): <write on rank 0> else: <read>``: no barrier is put in the ``else``
  (the ranks that see the file waited there for rank 0, which had gone on: a deadlock). With the
  file present on every rank, and absent on every rank, both ranks finish.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ..test_contract import EXISTS_ELSE
from .harness import FIXTURES, SDP_RUN, run

pytestmark = pytest.mark.slow
SDP_CONVERT = str(Path(sys.executable).with_name("sdp-convert"))


def convert(tree: Path, *paths: str) -> str:
    done = subprocess.run([SDP_CONVERT, *paths], cwd=tree, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_a_module_level_entry_runs_converted_on_one_and_two_processes(tmp_path: Path):
    tree = tmp_path / "project"
    shutil.copytree(FIXTURES / "projects" / "torch_module_level_entry" / "input", tree)
    report = convert(tree, ".")
    assert "train.py:7:1: [add_runtime_init] import sdp_runtime.torch as sdp and call sdp.init()"\
        in report
    assert "need attention" in report and "[contract]" in report
    one = run([sys.executable, "train.py"], tree, timeout=120)
    assert "NotInitializedError" not in one.output
    two = run([SDP_RUN, "-n", "2", "train.py"], tree, timeout=120)
    assert "epoch 1" in two.output
    assert (tree / "model.pt").is_file()


@pytest.mark.parametrize("present", [False, True], ids=["absent", "present"])
def test_a_read_under_exists_else_finishes_on_two_processes(tmp_path: Path, present: bool):
    (tmp_path / "train.py").write_text(EXISTS_ELSE)
    (tmp_path / "corpus_source.txt").write_text("abcdefgh" * 64)
    if present:
        shutil.copy(tmp_path / "corpus_source.txt", tmp_path / "corpus.txt")
    report = convert(tmp_path, "train.py")
    assert "[barrier_before_reads] (manual)" in report
    assert "barrier" not in (tmp_path / "train.py").read_text()
    run([SDP_RUN, "-n", "2", "train.py"], tmp_path, {"SDP_TIMEOUT": "60"}, timeout=120)
    assert (tmp_path / "corpus.txt").read_text() == "abcdefgh" * 64
