"""Report positions in notebooks point at the ``.ipynb`` file: the message names the cell and
its line, and the position (``path:line:col``, GitHub's ``line=``) is the line of the JSON file
where that source line is; through the real command line."""

from __future__ import annotations

import json

from .test_cli import sdp, write

CELLS = [
    {"cell_type": "markdown", "metadata": {}, "source": ["# Training\n"]},
    {"cell_type": "code", "metadata": {}, "execution_count": 1, "outputs": [],
     "source": ["import torch\n", "model = torch.nn.Linear(4, 1)\n",
                "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"]},
    {"cell_type": "code", "metadata": {}, "execution_count": 2, "outputs": [],
     "source": ["for step in range(3):\n", "    loss = model(torch.randn(8, 4)).pow(2).mean()\n",
                "    opt.zero_grad()\n", "    loss.backward()\n", "    opt.step()"]},
]


def _line_of(path, text: str) -> int:
    (row,) = [n for n, ln in enumerate(path.read_text().splitlines(), 1) if text in ln]
    return row


def test_positions_are_lines_of_the_ipynb_file(tmp_path):
    nb = {"cells": CELLS, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = write(tmp_path / "train.ipynb", json.dumps(nb, indent=1) + "\n")
    out = sdp("--check", str(path)).stderr.decode()
    sgd = _line_of(path, "torch.optim.SGD")
    backward = _line_of(path, "loss.backward()")
    assert f"train.ipynb:{sgd}:7: [scale_learning_rate] (manual) cell 2, line 3: SGD" in out
    assert f"train.ipynb:{backward}:5: [shard_dataloader] (manual) cell 3, line 4: " in out
    github = sdp("--check", "--report", "-", "--report-format", "github", str(path))
    assert f"file={path},line={sgd},col=7," in github.stdout.decode()

    # Converted, its manual notes are comments in the cells: reported at their own lines.
    assert sdp(str(path)).returncode == 0
    again = sdp("--check", "--allow-manual-markers", str(path)).stderr.decode()
    note = _line_of(path, "# sdp-convert: manual - SGD")
    assert f"train.ipynb:{note}:1: [manual_marker] (manual) cell 2, line " in again


def test_a_cell_whose_source_is_one_string_points_at_that_string(tmp_path):
    cells = [dict(c, source="".join(c["source"])) for c in CELLS]
    nb = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = write(tmp_path / "train.ipynb", json.dumps(nb, indent=2) + "\n")
    out = sdp("--check", str(path)).stderr.decode()
    assert f"train.ipynb:{_line_of(path, 'torch.optim.SGD')}:7: " in out
    broken = write(tmp_path / "broken.ipynb", json.dumps(
        {"cells": [CELLS[0], {"cell_type": "code", "source": ["x = 1\n", "y = (\n"]}]}, indent=1))
    err = sdp("--check", str(broken)).stderr.decode()
    assert f"broken.ipynb:{_line_of(broken, 'y = (')}:5: cell 2, line 2: syntax error" in err


def test_a_shell_line_continued_with_a_backslash_is_the_shells(tmp_path):
    """Eco check (yolov3-tf2's Colab notebook): ``!python tools/voc2012.py \\`` followed by
    ``  --data_dir ...`` was reported "syntax error: unexpected indent": IPython joins the lines
    into one shell command. The notebook converts, and the command is written back as it was."""
    shell = {"cell_type": "code", "metadata": {}, "execution_count": 0, "outputs": [],
             "source": ["!python tools/voc2012.py \\\n", "  --data_dir ./data \\\n",
                        "  --split train\n", "print('prepared')\n"]}
    nb = {"cells": [CELLS[0], shell, *CELLS[1:]], "metadata": {}, "nbformat": 4,
          "nbformat_minor": 5}
    path = write(tmp_path / "train.ipynb", json.dumps(nb, indent=1) + "\n")
    out = sdp(str(path))
    assert out.returncode == 0, out.stderr.decode()
    assert "syntax error" not in out.stderr.decode()
    cells = json.loads(path.read_text())["cells"]
    assert cells[1]["source"][:3] == shell["source"][:3]  # the command, whole
    assert cells[1]["source"][-1].startswith("print('prepared')")
    assert any("sdp.init()" in "".join(c["source"]) for c in cells)


def test_writes_in_two_cells_in_a_row_are_guarded_in_each_cell(tmp_path):
    # One `if sdp.rank() == 0:` may hold several statements in a row, never two cells' worth:
    # each cell keeps its own code (the second cell's save was moved into the first's guard).
    saves = [
        {"cell_type": "code", "metadata": {}, "execution_count": 3, "outputs": [],
         "source": ['torch.save(model.state_dict(), "a.pt")']},
        {"cell_type": "code", "metadata": {}, "execution_count": 4, "outputs": [],
         "source": ['torch.save(opt.state_dict(), "b.pt")']},
    ]
    nb = {"cells": CELLS + saves, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = write(tmp_path / "train.ipynb", json.dumps(nb, indent=1) + "\n")
    assert sdp(str(path)).returncode == 0
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    sources = ["".join(c["source"]) for c in cells]
    assert len(cells) == 4
    assert sources[2] == 'if sdp.rank() == 0:\n    torch.save(model.state_dict(), "a.pt")'
    assert sources[3] == 'if sdp.rank() == 0:\n    torch.save(opt.state_dict(), "b.pt")'
    assert not any("sdp-convert cell" in s for s in sources)
