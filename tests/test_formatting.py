"""The lines the converter changed are laid out at the file's own line length by black, and only
those: every other line stays byte for byte, and the result is still a fixed point."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sdp_convert.base import Options
from sdp_convert.engine import convert
from sdp_convert.formatting import format_changed, line_length_for

SDP_CONVERT = str(Path(sys.executable).with_name("sdp-convert"))

# The user's own long lines (a comment and a call) stay as they are; the optimizer line, which the
# converter changes, becomes 93 characters long.
SCRIPT = """\
import torch  # a long comment that the user wrote and that no formatter should touch at all

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1), torch.randn(32, 1))
for x, y, _ in torch.utils.data.DataLoader(data, batch_size=8):
    loss = (model(x) - y).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def test_a_changed_line_over_the_limit_is_formatted_and_every_other_line_stays():
    result = convert(SCRIPT, Options(line_length=88))
    output = result.output.decode()
    assert (
        "optimizer = torch.optim.SGD(\n"
        "    model.parameters(), lr=0.01 * sdp.size(), momentum=0.9, weight_decay=5e-4\n"
        ")\n"
    ) in output
    # The user's long lines are still there, byte for byte, and so is every unchanged line.
    for line in SCRIPT.splitlines(keepends=True):
        if "optimizer = torch.optim.SGD" not in line and "DataLoader" not in line:
            assert line in output.splitlines(keepends=True)
    assert SCRIPT.splitlines()[0] in output
    assert SCRIPT.splitlines(keepends=True)[4] in output  # the user's 98-character line
    # Converting the result again changes nothing.
    assert not convert(result.output, Options(line_length=88)).changed


def test_at_a_longer_line_length_nothing_is_reformatted():
    output = convert(SCRIPT, Options(line_length=120)).output.decode()
    assert (
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * sdp.size(), momentum=0.9, "
        "weight_decay=5e-4)\n"
    ) in output


def test_changed_lines_that_fit_run_no_black(monkeypatch):
    black = pytest.importorskip("black")

    def refuse(*args, **kwargs):
        raise AssertionError("black ran although every changed line fits")

    monkeypatch.setattr(black, "format_str", refuse)
    result = convert(SCRIPT, Options(line_length=120))
    assert result.changed


def test_a_statement_changed_in_part_keeps_its_layout_and_its_long_line():
    # Only the lr line changes; black would re-lay out the whole call, touching the first line,
    # which the converter did not change: the long line stays rather than that.
    source = (
        "import torch\n"
        "model = torch.nn.Linear(4, 1)\n"
        "optimizer = torch.optim.SGD(model.parameters(),\n"
        "                            lr=0.01, momentum=0.9, weight_decay=5e-4, nesterov=True)\n"
    )
    output = (
        "import torch\n"
        "model = torch.nn.Linear(4, 1)\n"
        "optimizer = torch.optim.SGD(model.parameters(),\n"
        "                            lr=0.01 * sdp.size(), momentum=0.9, weight_decay=5e-4, "
        "nesterov=True)\n"
    )
    assert format_changed(source.encode(), output.encode(), 88) == output.encode()


def test_line_length_from_the_nearest_pyproject(tmp_path: Path):
    (tmp_path / ".git").mkdir()
    assert line_length_for(tmp_path / "train.py") == 88
    black_dir = tmp_path / "black"
    black_dir.mkdir()
    (black_dir / "pyproject.toml").write_text("[tool.black]\nline-length = 120\n")
    assert line_length_for(black_dir / "sub" / "train.py") == 120
    ruff_dir = tmp_path / "ruff"
    ruff_dir.mkdir()
    (ruff_dir / "pyproject.toml").write_text("[tool.ruff]\nline-length = 100\n")
    assert line_length_for(ruff_dir / "train.py") == 100
    both = tmp_path / "both"
    both.mkdir()
    (both / "pyproject.toml").write_text(
        "[tool.ruff]\nline-length = 100\n[tool.black]\nline-length = 79\n"
    )
    assert line_length_for(both / "train.py") == 79


@pytest.mark.slow
def test_the_cli_formats_at_the_projects_line_length(tmp_path: Path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "pyproject.toml").write_text("[tool.black]\nline-length = 60\n")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        [SDP_CONVERT, str(script)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    output = script.read_text()
    assert (
        "optimizer = torch.optim.SGD(\n    model.parameters(),\n    lr=0.01 * sdp.size(),\n"
    ) in output
    assert SCRIPT.splitlines()[0] in output
    again = subprocess.run(
        [SDP_CONVERT, "--check", str(script)], capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 0, again.stdout + again.stderr


def test_a_long_argument_the_converter_adds_to_the_users_call_is_laid_out_alone():
    # The user's fit(...) is spread over lines; the converter adds a long callbacks argument.
    # Only that argument is laid out; the user's lines stay byte for byte.
    source = (
        "import numpy as np\n"
        "import tensorflow as tf\n"
        "x = np.zeros((64, 4), dtype='float32')\n"
        "y = np.zeros((64, 1), dtype='float32')\n"
        "model = tf.keras.Sequential([tf.keras.Input(shape=(4,)), tf.keras.layers.Dense(1)])\n"
        "model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss='mse')\n"
        "model.fit(\n"
        "    x,\n"
        "    y,\n"
        "    epochs=2,\n"
        "    callbacks=[tf.keras.callbacks.TerminateOnNaN()],\n"
        ")\n"
    )
    output = convert(source, Options(line_length=88)).output.decode()
    assert (
        "model.fit(\n"
        "    sdp.shard(x),\n"
        "    sdp.shard(y),\n"
        "    epochs=2,\n"
        "    callbacks=[\n"
        "        sdp.keras.callbacks.BroadcastGlobalVariablesCallback(0),\n"
        "        sdp.keras.callbacks.MetricAverageCallback(),\n"
        "        tf.keras.callbacks.TerminateOnNaN(),\n"
        "    ],\n"
    ) in output
    assert all(len(line) <= 88 for line in output.splitlines())
    # The user's quotes stay single: black normalises no string.
    assert "x = np.zeros((64, 4), dtype='float32')\n" in output


@pytest.mark.slow
def test_stdin_takes_the_line_length_of_the_current_directory(tmp_path: Path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "pyproject.toml").write_text("[tool.ruff]\nline-length = 60\n")
    proc = subprocess.run(
        [SDP_CONVERT, "-"], input=SCRIPT, capture_output=True, text=True, timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "optimizer = torch.optim.SGD(\n    model.parameters(),\n" in proc.stdout


def test_a_layout_that_is_not_the_same_program_is_dropped(monkeypatch):
    # format_str skips black's own safety check; the converter makes it (a black bug must never
    # change what the script does).
    black = pytest.importorskip("black")
    monkeypatch.setattr(black, "format_str", lambda src, **kw: src.replace("0.9", "0.8"))
    output = convert(SCRIPT, Options(line_length=88)).output.decode()
    assert "momentum=0.9" in output and "momentum=0.8" not in output
