"""The runtime's notebook reader and runner (``sdp_runtime._cells``, ``sdp_runtime._notebook``),
in one process: which IPython lines run and which are skipped, line numbers kept, the cell and
line of an error, ``display`` and a cell's last value, ``%%writefile`` and ``%%capture``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sdp_runtime import _cells

from ._notebooks import write


def test_line_magics_that_are_safe_run_and_the_others_become_pass():
    cell = _cells.translate(3, "%env SEED=1\n%env LR 0.1\n%env SEED\n%cd /tmp\n%time x = 1\n"
                               "!pip install torch\n%matplotlib inline\nmodel?\n%timeit f()")
    lines = cell.source.split("\n")
    assert lines[0] == "__import__('os').environ['SEED'] = '1'"
    assert lines[1] == "__import__('os').environ['LR'] = '0.1'"
    assert lines[2] == "__import__('os').environ.get('SEED')"
    assert "chdir" in lines[3] and "'/tmp'" in lines[3]
    assert lines[4] == "x = 1"
    assert lines[5:] == ["pass"] * 4
    assert [(x.line, x.run) for x in cell.ipython] == [
        (1, True), (2, True), (3, True), (4, True), (5, True),
        (6, False), (7, False), (8, False), (9, False)]


def test_a_magic_inside_a_block_keeps_its_indentation_and_line():
    cell = _cells.translate(1, "for i in range(2):\n    !echo $i\n    y = i\n")
    compile(cell.source, "cell", "exec")
    assert cell.source.split("\n")[1] == "    pass"


def test_percent_lines_of_strings_and_expressions_are_python():
    text = "s = '''\n%d items\n!not shell\n'''\nx = (10\n     % 3)\nprint(s, x)"
    cell = _cells.translate(1, text)
    assert cell.source == text and cell.ipython == []


def test_cell_magics():
    assert _cells.translate(2, "%%time\nx = 1").kind == "time"
    capture = _cells.translate(2, "%%capture out\nprint('hidden')")
    assert (capture.kind, capture.argument) == ("capture", "out")
    assert capture.source == "\nprint('hidden')"  # line 2 of the cell is line 2 here
    written = _cells.translate(2, "%%writefile helper.py\nA = 1\n")
    assert (written.kind, written.argument, written.body) == ("writefile", "helper.py", "A = 1\n")
    for text in ("%%bash\necho hi", "%%writefile -a log.txt\nx", "%%timeit\nf()"):
        assert _cells.translate(2, text).kind == "skipped", text


def test_the_skipped_lines_are_said_in_one_line(tmp_path):
    path = write(tmp_path / "nb.ipynb", [
        ("markdown", "# title"),
        ("code", "%pip install torch\n%env A=1\nimport os"),
        ("code", "%%bash\necho hi"),
    ])
    cells = _cells.read(str(path))
    assert [c.number for c in cells] == [2, 3]  # numbered among all cells, as sdp-convert does
    assert _cells.describe_skipped("nb.ipynb", cells) == (
        "nb.ipynb: IPython lines not run (not Python): cell 2, line 1: %pip install torch; "
        "cell 3: %%bash (the whole cell)")


@pytest.mark.parametrize("content, message", [
    (b"{not json", "not a valid notebook"),
    (b"[1, 2]", "no list of cells"),
    (json.dumps({"cells": [3]}).encode(), "cell 1 is not an object"),
    (json.dumps({"cells": [{"cell_type": "code", "source": 7}]}).encode(), "cell 1"),
])
def test_broken_notebooks_are_one_value_error(tmp_path, content, message):
    path = tmp_path / "bad.ipynb"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        _cells.read(str(path))


def _run(tmp_path: Path, cells: list[tuple[str, str]], *args: str) -> subprocess.CompletedProcess:
    path = write(tmp_path / "nb.ipynb", cells)
    return subprocess.run([sys.executable, "-m", "sdp_runtime._notebook", path.name, *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)


def test_cells_run_in_one_namespace_with_display_and_last_values(tmp_path):
    done = _run(tmp_path, [
        ("code", "import sys\nclass Point:\n    pass\nargs = sys.argv[1:]"),
        ("code", "display({'lr': 0.1}, 'text')\nPoint.__module__, args"),
        ("code", "1 + 1;"),  # a trailing semicolon hides the value, as in Jupyter
        ("code", "import pickle\nprint(type(pickle.loads(pickle.dumps(Point()))).__name__)\nNone"),
        ("code", "%%capture out\nprint('captured')"),
        ("code", "print('got', out.stdout.strip())"),
        ("code", "%%writefile helper.py\nVALUE = 42"),
        ("code", "import helper\nprint('helper', helper.VALUE, '__file__' in globals())"),
    ], "--epochs", "3")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "{'lr': 0.1}", "'text'", "('__main__', ['--epochs', '3'])", "Point", "got captured",
        "helper 42 False"]
    assert (tmp_path / "helper.py").read_text() == "VALUE = 42\n"


def test_an_error_names_the_cell_and_its_line_and_nothing_of_the_runner(tmp_path):
    done = _run(tmp_path, [
        ("markdown", "# one"),
        ("code", "%env A=1\nx = 1"),
        ("code", "def f():\n    return 1 / 0\n\nf()"),
        ("code", "print('never')"),
    ])
    assert done.returncode == 1
    assert 'File "nb.ipynb, cell 3", line 4, in <module>' in done.stderr
    assert 'File "nb.ipynb, cell 3", line 2, in f' in done.stderr
    assert "    return 1 / 0" in done.stderr  # the line's text, from the cell
    assert "ZeroDivisionError: division by zero" in done.stderr
    assert "_notebook.py" not in done.stderr and "never" not in done.stdout


def test_a_syntax_error_stops_before_any_cell_runs(tmp_path):
    done = _run(tmp_path, [("code", "print('first')"), ("code", "x = (1,\ny = 2")])
    assert done.returncode == 1 and done.stdout == ""
    assert 'File "nb.ipynb, cell 2", line 1' in done.stderr and "SyntaxError" in done.stderr
