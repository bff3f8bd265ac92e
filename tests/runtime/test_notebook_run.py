"""``sdp-run -n N train.ipynb``: a notebook converted by ``sdp-convert`` trains on 2 processes,
with ``--audit=strict``, as the original does on one at twice the batch; a rank's error is named
in cell-and-line terms; a broken notebook is one line. Through the installed commands."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from . import _notebooks
from ._spawn import clean_env
from .test_launch import _finish, _lines

BIN = Path(sys.executable).parent
SDP_RUN, SDP_CONVERT = str(BIN / "sdp-run"), str(BIN / "sdp-convert")
#: A line of torch's own logging (glog style: E1128 17:21:17.759000 16597 torch/...).
TORCH_LOG_LINE = re.compile(r"^(\[rank\d+\]: )?[IWEF]\d{4} \d\d:\d\d:\d\d", re.M)


def _weights(out: str, rank: int | None = None) -> list[float]:
    prefix = f"[rank{rank}]: " if rank is not None else ""
    line = next(x for x in out.splitlines() if x.startswith(prefix + "weights "))
    return [float(w) for w in line[len(prefix + "weights "):].split()]


@pytest.fixture
def converted(tmp_path) -> tuple[Path, Path]:
    """The top-level notebook as written, and as sdp-convert writes it."""
    original = _notebooks.write(tmp_path / "original.ipynb", _notebooks.TOP_LEVEL)
    path = _notebooks.write(tmp_path / "train.ipynb", _notebooks.TOP_LEVEL)
    done = subprocess.run([SDP_CONVERT, "--no-cache", path.name], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "(manual)" not in done.stderr, done.stderr  # a complete conversion
    assert "sdp-run --audit -n 2 train.ipynb" in done.stderr  # the hint names the notebook
    return original, path


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_converted_notebook_trains_on_two_processes_as_the_original_on_one(converted, tmp_path):
    original, path = converted
    env = clean_env({"BATCH_SIZE": "32", "LR": "0.02"})
    ((code, out, err),) = _finish([subprocess.Popen(
        [SDP_RUN, "-n", "1", original.name], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True)], 200)
    assert code == 0, err
    alone = _weights(out, 0)

    env = clean_env({"BATCH_SIZE": "16", "LR": "0.01"})
    ((code, out, err),) = _finish([subprocess.Popen(
        [SDP_RUN, "--audit=strict", "-n", "2", path.name], cwd=tmp_path, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)], 200)
    assert code == 0, err
    lines = _lines(out)
    for r in (0, 1):
        # display(model), the training loop, %env, a string's "%" line, the last value.
        assert f"[rank{r}]: DistributedDataParallel(" in lines
        assert any(x.startswith(f"[rank{r}]: epoch 1 loss ") for x in lines)
        assert (f"[rank{r}]: mark set by %env %not a magic: a line of a string") in lines
        assert f"[rank{r}]: 9" in lines
        assert _weights(out, r) == pytest.approx(alone, rel=1e-5, abs=1e-6)
    # What does not run is said once, by rank 0 (the shell line's line in the converted cell).
    cell3 = "".join(json.loads(path.read_text())["cells"][2]["source"]).split("\n")
    shell = cell3.index("!nvidia-smi -L") + 1
    skipped = [x for x in err.splitlines() if "IPython lines not run" in x]
    assert skipped == ["[rank0]: sdp-run: train.ipynb: IPython lines not run (not Python): "
                       f"cell 2, line 1: %pip install -q torch; cell 3, line {shell}: "
                       "!nvidia-smi -L; cell 5: %%bash (the whole cell)"], err
    assert "sdp audit: no problem found" in err
    assert not TORCH_LOG_LINE.search(err), err


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_failing_rank_is_named_with_the_cell_and_line(converted, tmp_path):
    _, path = converted
    env = clean_env({"BATCH_SIZE": "16", "LR": "0.01", "FAIL_ONE": "1"})
    ((code, out, err),) = _finish([subprocess.Popen(
        [SDP_RUN, "-n", "2", path.name], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True)], 200)
    assert code == 1
    found = re.search(r"sdp-run: rank (\d) failed first: ValueError: planned failure in the "
                      r"last cell \(exit status 1\)", err)
    assert found, err
    # The traceback, in the rank's output and in sdp-run's summary, is in .ipynb terms.
    cell6 = "".join(json.loads(path.read_text())["cells"][5]["source"]).split("\n")
    line = next(n for n, x in enumerate(cell6, 1) if "raise ValueError" in x)
    assert f'[rank{found[1]}]:   File "train.ipynb, cell 6", line {line}, in <module>' in err
    assert f'      File "train.ipynb, cell 6", line {line}, in <module>' in err
    assert "_notebook.py" not in err
    assert not TORCH_LOG_LINE.search(err), err


@pytest.mark.parametrize("content, message", [
    (b"{not json", "sdp-run: error: bad.ipynb: not a valid notebook"),
    (b'{"cells": 3}', "sdp-run: error: bad.ipynb: not a valid notebook (no list of cells)"),
])
def test_a_broken_notebook_is_one_line_and_exit_2(tmp_path, content, message):
    (tmp_path / "bad.ipynb").write_bytes(content)
    done = subprocess.run([SDP_RUN, "-n", "2", "bad.ipynb"], cwd=tmp_path, env=clean_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith(message) and len(done.stderr.splitlines()) == 1, done.stderr
