"""docs/tutorial.md runs as written: its shell commands in order, in one shell, in a scratch
folder, and its Jupyter cell in a real kernel in place of the converted notebook's last cell;
each output block on the page is found in what the command before it printed (a line ``...`` on
the page stands for any lines, ``...`` within a line for any text)."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from .runtime._spawn import clean_env

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "tutorial.md"
SCRATCH = "/tmp/sdp-tutorial"  # the page's folder; each test run uses its own instead
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```[ \t]*$", re.M | re.S)
MARK = "@@ tutorial step {} done @@"


@dataclass
class Step:
    kind: str  # "shell" or "jupyter"
    code: str
    expected: list[str]


def steps() -> list[Step]:
    """The page's commands, each with the output block that follows it."""
    found: list[Step] = []
    for match in FENCE.finditer(PAGE.read_text(encoding="utf-8")):
        lang, info, body = match[1], match[2], match[3]
        if lang == "bash":
            found.append(Step("shell", body, []))
        elif lang == "python" and 'title="Jupyter cell"' in info:
            found.append(Step("jupyter", body, []))
        elif lang == "text":
            assert found and not found[-1].expected, "an output block follows a command"
            found[-1].expected = [line for line in body.splitlines() if line.strip()]
    return found


def _pattern(line: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in line.split("...")))


def _assert_shown(expected: list[str], output: str, what: str) -> None:
    lines = output.splitlines()
    for line in expected:
        if line.strip() == "...":
            continue
        pattern = _pattern(line)
        assert any(pattern.fullmatch(x) for x in lines), (
            f"{what}: the page shows {line!r}, which is not in the output:\n{output[-4000:]}")


def test_the_page_has_the_steps_the_issue_asks_for():
    commands = "\n".join(s.code for s in steps() if s.kind == "shell")
    for command in ("sdp-convert train.py", "sdp-run --audit -n 2 train.py",
                    "sdp-convert train.ipynb", "sdp-run -n 2 train.ipynb"):
        assert command in commands
    assert [s.kind for s in steps()].count("jupyter") == 1
    # The script shown is the file the commands copy.
    assert '--8<-- "docs/tutorial/train.py"' in PAGE.read_text(encoding="utf-8")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_command_of_the_tutorial_runs_and_shows_what_the_page_says(tmp_path):
    work = tmp_path / "sdp-tutorial"
    shell = [s for s in steps() if s.kind == "shell"]
    script = ["set -euo pipefail"]
    for n, step in enumerate(shell):
        code = step.code.replace(SCRATCH, str(work))
        if not (REPO / ".venv" / "bin" / "activate").exists():  # a suite run from another venv
            code = code.replace("source .venv/bin/activate",
                                f"source {Path(sys.executable).parent / 'activate'}")
        script += [code, f"echo '{MARK.format(n)}'"]
    done = subprocess.run(["bash", "-c", "\n".join(script)], cwd=REPO, env=clean_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=700, start_new_session=True)
    output = done.stdout
    assert done.returncode == 0, output[-6000:]
    for n, step in enumerate(shell):
        before, _, output = output.partition(MARK.format(n) + "\n")
        _assert_shown(step.expected, before, step.code.strip())

    jupyter = next(s for s in steps() if s.kind == "jupyter")
    shown = _run_in_jupyter(work, jupyter.code)
    _assert_shown(jupyter.expected, shown, "the Jupyter cell")


def _run_in_jupyter(work: Path, cell: str) -> str:
    """The converted train.ipynb with its last cell replaced by ``cell``, run in a kernel
    started in ``work``; the last cell's output, as text."""
    import nbclient
    import nbformat

    nb = nbformat.read(work / "train.ipynb", as_version=4)
    nb.cells[-1] = nbformat.v4.new_code_cell(cell)
    env = clean_env({"JUPYTER_RUNTIME_DIR": str(work / ".jupyter"),
                     "IPYTHONDIR": str(work / ".ipython")})
    nbclient.NotebookClient(nb, kernel_name="python3", timeout=300,
                            resources={"metadata": {"path": str(work)}}).execute(env=env)
    parts = []
    for out in nb.cells[-1].outputs:
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type in ("execute_result", "display_data"):
            parts.append(out.data.get("text/plain", "") + "\n")
    return "".join(parts)
