"""allow_existing_dirs: every rank creates its directories without a FileExistsError race."""

from __future__ import annotations

from .helpers import messages, run

ONLY = "allow_existing_dirs"
TRAIN = """\
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn(model(x), y).backward()
optimizer.step()
"""


def _convert(body: str) -> tuple[str, list[str]]:
    result = run("import os\nimport tempfile\nfrom pathlib import Path\n\nimport torch\n\n"
                 + TRAIN + body, ONLY)
    return result.output.decode(), messages(result, ONLY)


def test_the_kuangliu_checkpoint_directory():
    code, notes = _convert(
        "if not os.path.isdir('checkpoint'):\n    os.mkdir('checkpoint')\n"
    )
    assert "    os.makedirs('checkpoint', exist_ok=True)\n" in code
    assert notes == ["os.mkdir(...) -> os.makedirs(..., exist_ok=True): every rank creates it, "
                     "none fails because another was first"]


def test_makedirs_and_path_mkdir_get_exist_ok():
    code, _ = _convert(
        "os.makedirs(out_dir)\nlogs = Path(out_dir) / 'logs'\nlogs.mkdir(parents=True)\n"
        "Path('runs').mkdir()\n"
    )
    assert "os.makedirs(out_dir, exist_ok=True)" in code
    assert "logs.mkdir(parents=True, exist_ok=True)" in code
    assert "Path('runs').mkdir(exist_ok=True)" in code


def test_left_alone():
    body = (
        "os.makedirs(a, exist_ok=True)\nos.makedirs(b, 0o755, False)\n"
        "try:\n    os.mkdir(c)\nexcept FileExistsError:\n    pass\n"
        "tmp = tempfile.mkdtemp()\nos.mkdir(os.path.join(tmp, 'x'))\n"
        "os.mkdir(d, 0o700)\nzipfile.mkdir('inside')\n"
    )
    code, notes = _convert(body)
    assert body in code and notes == []
