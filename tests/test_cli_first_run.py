"""A first run without stumbles, through the installed ``sdp-convert``: the first-run hint names
the file just written (and, for a notebook, both ways to run it); ``--report-format`` without
``--report`` is a usage error, not a silent no-op; the JSON example of docs/cli.md is what the
command writes, ``contract`` included, its init detail naming the file and line."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .runtime import _notebooks

REPO = Path(__file__).resolve().parents[1]
SDP_CONVERT = str(Path(sys.executable).with_name("sdp-convert"))
MNIST = REPO / "fixtures" / "torch" / "mnist_basic" / "input.py"


def sdp(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([SDP_CONVERT, "--no-cache", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def _hint(stderr: str) -> str:
    return next(line for line in stderr.splitlines() if "first run of a converted" in line)


def test_the_hint_names_the_file_converted_in_place(tmp_path):
    shutil.copy(MNIST, tmp_path / "train.py")
    done = sdp("train.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert _hint(done.stderr) == (
        "sdp-convert: first run of a converted script: sdp-run --audit -n 2 train.py checks "
        "that its ranks train one model on split data")
    assert done.stderr.splitlines()[-1].startswith("sdp-convert: 1 converted")  # still last


def test_the_hint_names_the_file_written_with_o_quoted_for_the_shell(tmp_path):
    shutil.copy(MNIST, tmp_path / "my train.py")
    done = sdp("my train.py", "-o", "out/", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "sdp-run --audit -n 2 'out/my train.py' checks" in _hint(done.stderr)
    assert (tmp_path / "out" / "my train.py").is_file()


def test_the_hint_names_the_entry_point_of_a_project(tmp_path):
    project = REPO / "fixtures" / "projects" / "torch_learner_kwargs"
    shutil.copytree(project, tmp_path / "p", ignore=shutil.ignore_patterns("expected*", "*.txt"))
    done = sdp("p", cwd=tmp_path)
    assert done.returncode in (0, 1), done.stderr
    hint = _hint(done.stderr)
    entry = re.search(r"sdp-run --audit -n 2 (\S+) checks", hint)[1]
    # The program is run from its entry point, whatever the order the files were converted in.
    report = sdp("--check", "--report", "-", "--report-format", "json", "p", cwd=tmp_path)
    entries = [f["path"] for f in json.loads(report.stdout)["files"] if "contract" in f]
    assert entry in entries


def test_a_notebook_hint_says_how_to_run_it_and_how_from_jupyter(tmp_path):
    _notebooks.write(tmp_path / "train.ipynb", _notebooks.IN_A_FUNCTION)
    done = sdp("train.ipynb", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert _hint(done.stderr) == (
        "sdp-convert: first run of a converted notebook: sdp-run --audit -n 2 train.ipynb runs "
        "its code cells on 2 processes and checks that its ranks train one model on split data; "
        "inside Jupyter, put the training in a function and call "
        "sdp_runtime.notebook_launcher(train, num_processes=2, audit=True)")


def test_no_hint_when_nothing_was_written_or_with_q(tmp_path):
    shutil.copy(MNIST, tmp_path / "train.py")
    for args in (["--check"], ["--diff"], ["-q"]):
        done = sdp(*args, "train.py", cwd=tmp_path)
        assert "first run of a converted" not in done.stderr, args


@pytest.mark.parametrize("fmt", ["json", "github", "text"])
def test_report_format_without_report_is_a_usage_error(tmp_path, fmt):
    shutil.copy(MNIST, tmp_path / "train.py")
    done = sdp("--report-format", fmt, "train.py", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == (
        f"sdp-convert: error: --report-format {fmt} is the format of the report that --report "
        "writes, and no --report was given: add --report FILE (or --report - for stdout)\n")
    assert (tmp_path / "train.py").read_bytes() == MNIST.read_bytes()  # nothing was converted


def test_report_format_with_report_still_works(tmp_path):
    shutil.copy(MNIST, tmp_path / "train.py")
    done = sdp("--check", "--report", "-", "--report-format", "github", "train.py", cwd=tmp_path)
    assert done.returncode == 1 and done.stdout.startswith("::notice file=train.py,")
    done = sdp("--check", "--report", "report.txt", "train.py", cwd=tmp_path)  # text by default
    assert (tmp_path / "report.txt").read_text().startswith("train.py:12:1: [add_runtime_init]")


def test_the_json_example_of_the_docs_is_what_the_command_writes(tmp_path):
    page = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    block = re.search(r"`--report-format json` writes one\s+object.*?```json\n(.*?)```", page,
                      re.S)
    assert block, "docs/cli.md has the JSON example"
    shown = json.loads(block[1])
    shutil.copy(MNIST, tmp_path / "train.py")
    done = sdp("--check", "--report", "-", "--report-format", "json", "train.py", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert shown == json.loads(done.stdout)
    # The contract's init names the file and the line: the original's, where sdp.init() goes
    # (after the imports that end on line 12), as every position of the report is.
    init = shown["files"][0]["contract"]["parts"]["init"]["detail"]
    assert init == "sdp.init() at train.py:13"
    assert MNIST.read_text().splitlines()[11].startswith("from torch.utils.data import")
