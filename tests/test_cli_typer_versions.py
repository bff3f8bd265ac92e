"""The command line with the lowest and the newest typer that pyproject.toml allows (and the
lowest pathspec): usage errors stay one line and exit 2, help and conversion work.

typer changed a lot across this range (0.26 stopped depending on click and vendors it, 0.29
validates values through its own layer), so each end is installed for real (``pip install
--target``, a few seconds, cached for the session) and put in front of the venv's own packages
with PYTHONPATH; the venv's ``sdp-convert`` script is then run as users run it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

from .test_cli import SDP_CONVERT, TRAIN, write

REPO = Path(__file__).resolve().parents[1]
LOWEST = {"typer": "0.16.0", "click": "8.5.0", "shellingham": "1.5.4", "pathspec": "0.12.1"}
NEWEST = {"typer": "0.29.2"}


def _requirement(name: str) -> Requirement:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return next(r for r in map(Requirement, project["dependencies"]) if r.name == name)


def test_the_tested_versions_are_the_ends_of_the_allowed_range():
    typer = _requirement("typer").specifier
    assert f">={LOWEST['typer'].rsplit('.', 1)[0]}" in {str(s) for s in typer}
    assert LOWEST["typer"] in typer and NEWEST["typer"] in typer
    next_minor = f"0.{int(NEWEST['typer'].split('.')[1]) + 1}.0"
    assert next_minor not in typer  # nothing newer than what is tested is allowed
    assert f">={LOWEST['pathspec'].rsplit('.', 1)[0]}" in {
        str(s) for s in _requirement("pathspec").specifier}


@pytest.fixture(scope="session", params=["lowest", "newest"])
def site(request, tmp_path_factory) -> tuple[str, dict[str, str]]:
    pins = LOWEST if request.param == "lowest" else NEWEST
    target = tmp_path_factory.mktemp(f"typer-{request.param}")
    # --no-deps: the other dependencies are the venv's; only the pinned ones are shadowed.
    out = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
         "--disable-pip-version-check", "--target", str(target),
         *(f"{name}=={version}" for name, version in pins.items())],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    env = {**os.environ, "PYTHONPATH": str(target)}
    return request.param, env


@pytest.mark.timeout(600)
def test_usage_errors_help_and_conversion(site, tmp_path):
    which, env = site
    pins = LOWEST if which == "lowest" else NEWEST

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([SDP_CONVERT, *args], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=120)

    probe = subprocess.run(
        [sys.executable, "-c", "import typer, pathspec; print(typer.__version__, "
         "pathspec.__version__ if hasattr(pathspec, '__version__') else '')"],
        env=env, capture_output=True, text=True, timeout=60)
    assert probe.stdout.split()[0] == pins["typer"]
    if "pathspec" in pins:
        assert probe.stdout.split()[1] == pins["pathspec"]

    for argv, name in ((["--bogus", "x.py"], "--bogus"), (["-o"], "-o"),
                       (["--check", "--typo"], "--typo"), (["--lr-scaling", "x", "t.py"],
                                                          "--lr-scaling"),
                       (["-j", "0", "t.py"], "--jobs"), (["--only", "nope", "t.py"], "--only")):
        out = run(*argv)
        assert out.returncode == 2, (argv, out.stderr)
        assert out.stderr.count("\n") == 1 and name in out.stderr, (argv, out.stderr)
        assert out.stderr.startswith("sdp-convert: error: ")
    assert run("--help").returncode == 0 and "--stdin-filename" in run("--help").stdout
    assert run("--version").stdout.startswith("sdp-convert ")

    (tmp_path / ".git").mkdir()
    write(tmp_path / ".gitignore", "ignored/\n")
    write(tmp_path / "ignored" / "train.py", TRAIN)
    script = write(tmp_path / "train.py", TRAIN)
    out = run(".")
    assert out.returncode == 0, out.stderr
    assert "sdp.init()" in script.read_text()
    assert (tmp_path / "ignored" / "train.py").read_text() == TRAIN
