"""The hooks in .pre-commit-hooks.yaml, installed and run by the real ``pre-commit`` tool."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PRE_COMMIT = str(Path(sys.executable).with_name("pre-commit"))

TRAIN = """\
import torch

model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def git(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def hook_repo(tmp_path_factory) -> tuple[Path, str]:
    """A committed snapshot of this repository (working tree included), as pre-commit needs."""
    snap = tmp_path_factory.mktemp("hook-repo")
    for name in ("pyproject.toml", "README.md", ".pre-commit-hooks.yaml"):
        if (REPO / name).exists():
            shutil.copy2(REPO / name, snap / name)
    for name in ("rewriter", "runtime"):
        shutil.copytree(
            REPO / name, snap / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
        )
    git(snap, "init", "-q")
    git(snap, "add", "-A")
    git(snap, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "snapshot")
    return snap, git(snap, "rev-parse", "HEAD").stdout.strip()


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("pre-commit-home")
    return {**os.environ, "PRE_COMMIT_HOME": str(home), "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def user_repo(tmp_path: Path, hook_repo: tuple[Path, str], hook_id: str) -> Path:
    repo = tmp_path / "project"
    repo.mkdir()
    git(repo, "init", "-q")
    snap, rev = hook_repo
    (repo / ".pre-commit-config.yaml").write_text(
        f"repos:\n- repo: {snap}\n  rev: {rev}\n  hooks:\n  - id: {hook_id}\n"
    )
    (repo / "train.py").write_text(TRAIN)
    (repo / "notes.txt").write_text("not python\n")
    return repo


def run(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_rewriting_hook_converts_on_commit_then_passes(tmp_path, hook_repo, env):
    repo = user_repo(tmp_path, hook_repo, "sdp-convert")
    assert run([PRE_COMMIT, "install"], repo, env).returncode == 0
    git(repo, "add", "-A")
    first = run(["git", "commit", "-m", "add training script"], repo, env)
    # The hook rewrote the file, so pre-commit stops the commit for review.
    assert first.returncode == 1, first.stdout + first.stderr
    assert "files were modified by this hook" in first.stdout + first.stderr
    converted = (repo / "train.py").read_text()
    assert "import sdp_runtime.torch as sdp" in converted and "sdp.init()" in converted
    assert git(repo, "log", "--oneline").returncode != 0  # nothing committed yet

    git(repo, "add", "-A")
    second = run(["git", "commit", "-m", "add training script"], repo, env)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "Passed" in second.stdout + second.stderr
    assert (repo / "train.py").read_text() == converted


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_check_hook_fails_with_diff_and_writes_nothing(tmp_path, hook_repo, env):
    repo = user_repo(tmp_path, hook_repo, "sdp-convert-check")
    git(repo, "add", "-A")
    failed = run([PRE_COMMIT, "run", "--all-files"], repo, env)
    assert failed.returncode == 1
    assert "+sdp.init()" in failed.stdout
    assert (repo / "train.py").read_text() == TRAIN

    # A converted script still fails while it carries its manual notes (as comments) ...
    subprocess.run([str(Path(sys.executable).with_name("sdp-convert")), str(repo / "train.py")],
                   check=True, capture_output=True, timeout=120)
    git(repo, "add", "-A")
    marked = run([PRE_COMMIT, "run", "--all-files"], repo, env)
    assert marked.returncode == 1
    assert "[manual_marker] (manual)" in marked.stdout
    assert (repo / "train.py").read_text().count("# sdp-convert: manual - ") == 2
    # ... and still fails with the comments deleted while the program cannot be shown to hold
    # (its batches come from nowhere the converter can follow: the data part is unknown) ...
    lines = (repo / "train.py").read_text().splitlines(keepends=True)
    (repo / "train.py").write_text("".join(ln for ln in lines if "sdp-convert: manual" not in ln))
    git(repo, "add", "-A")
    unknown = run([PRE_COMMIT, "run", "--all-files"], repo, env)
    assert unknown.returncode == 1, unknown.stdout
    assert "[contract] (manual)" in unknown.stdout and "[data]" in unknown.stdout
    # ... until the person, having checked it (sdp-run --audit), says so in the configuration.
    (repo / "pyproject.toml").write_text("[tool.sdp-convert]\nallow-manual-markers = true\n")
    git(repo, "add", "-A")
    passed = run([PRE_COMMIT, "run", "--all-files"], repo, env)
    assert passed.returncode == 0, passed.stdout
    assert "Passed" in passed.stdout


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_one_process_for_all_files_and_configured_exclusions_apply(tmp_path, hook_repo, env):
    """require_serial: pre-commit runs one sdp-convert for the whole batch (it converts in
    parallel itself) instead of one per core; --force-exclude: [tool.sdp-convert] exclude
    applies to the files pre-commit names."""
    repo = user_repo(tmp_path, hook_repo, "sdp-convert-check")
    config = repo / ".pre-commit-config.yaml"
    config.write_text(config.read_text() + "    verbose: true\n")
    for i in range(12):
        (repo / f"train_{i:02d}.py").write_text(TRAIN)
    (repo / "legacy").mkdir()
    (repo / "legacy" / "train.py").write_text(TRAIN)
    (repo / "pyproject.toml").write_text('[tool.sdp-convert]\nexclude = ["legacy/"]\n')
    git(repo, "add", "-A")
    out = run([PRE_COMMIT, "run", "--all-files"], repo, env)
    assert out.returncode == 1, out.stdout + out.stderr
    summaries = [line for line in out.stdout.splitlines() if line.startswith("sdp-convert: ")]
    # 13 training scripts given (pre-commit would split them in one batch per core otherwise);
    # legacy/train.py is excluded by the configuration.
    # Each trains on tensors drawn in the loop, which the converter cannot split: two manual
    # notes each (the data, and the learning rate left as it is), so each needs attention.
    assert summaries == ["sdp-convert: 0 would be converted, 13 need attention, 0 unchanged, "
                         "0 skipped, 0 failed; 26 manual items"], out.stdout
    assert "legacy/train.py" not in out.stdout
