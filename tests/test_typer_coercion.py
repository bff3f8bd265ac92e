"""``sdp_convert.typer_coercion``: the command's options get exactly the values typer's own
converters give them, and a run that needs no real conversion does not load pydantic."""

from __future__ import annotations

import subprocess
import sys

import pytest
import typer
import typer.core
import typer.main
from sdp_convert.cli import app
from sdp_convert.typer_coercion import Command

from .test_cli import TRAIN, write

ARGVS = [
    ["t.py"],
    ["--check", "-q", "a.py", "b.py", "dir/"],
    ["--diff", "--lr-scaling", "sqrt", "--framework", "torch", "--rank0-output", "all", "t.py"],
    ["--only", "wrap_model_ddp,shard_dataloader", "--only", "x", "--skip", "y", "t.py"],
    ["--exclude", "a/", "--extend-exclude", "b*", "--force-exclude", "--no-cache", "t.py"],
    ["-o", "out/", "--report", "r.json", "--report-format", "json", "-j", "3", "t.py"],
    ["--stdin-filename", "x.py", "--config", "c.toml", "--no-respect-gitignore", "-"],
    ["--explain", "wrap_model_ddp"],
    ["--report-format", "GITHUB", "t.py"],  # typer's own converter answers (case-sensitive)
    ["-j", "0", "t.py"],
    ["--lr-scaling", "LINEAR", "t.py"],
]


def _parse(command_class: type, argv: list[str]) -> object:
    command = typer.main.get_command(app)
    command.__class__ = command_class
    try:
        return command.make_context("sdp-convert", list(argv)).params
    except Exception as error:  # noqa: BLE001 - the error is the value compared
        return (type(error).__name__, str(error))


@pytest.mark.parametrize("argv", ARGVS, ids=" ".join)
def test_the_values_are_those_typer_gives(argv):
    assert typer.main.get_command(app).__class__ is Command
    ours = _parse(Command, argv)
    assert ours == _parse(typer.core.TyperCommand, argv)
    if isinstance(ours, dict):
        assert [type(v) for v in ours.values()] == [
            type(v) for v in _parse(typer.core.TyperCommand, argv).values()  # type: ignore[attr-defined]
        ]


def test_a_cached_check_loads_no_pydantic(tmp_path):
    script = write(tmp_path / "train.py", TRAIN)
    probe = (
        "import sys\nfrom sdp_convert.cli import main\n"
        f"code = main(['--check', '-q', {str(script)!r}])\n"
        "print(code, 'pydantic' in sys.modules)\n"
    )
    run = [sys.executable, "-c", probe]
    subprocess.run(run, capture_output=True, timeout=120)  # fills the cache
    out = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["1", "False"], out.stderr
    # A value that typer must check loads it (typer >= 0.27), and the check is typer's.
    bad = subprocess.run([sys.executable, "-m", "sdp_convert", "-j", "0", str(script)],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--jobs" in bad.stderr
