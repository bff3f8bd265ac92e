"""The installed ``sdp-convert`` on trees and files: what is selected (``.gitignore``,
``--exclude``/``--extend-exclude``/``--force-exclude``, an output directory inside the input),
``[tool.sdp-convert]`` in pyproject.toml, I/O errors that must not stop the run, file owners and
read-only files, and Ctrl-C in the middle of a tree."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from .test_cli import NOT_TRAINING, SDP_CONVERT, TRAIN, sdp, write


def converted(path: Path) -> bool:
    return "sdp.init()" in path.read_text()


def test_gitignore_is_honoured_when_recursing(tmp_path):
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)  # the top of a git work tree
    write(repo / ".gitignore", "generated/\n*_tmp.py\n/top_only.py\n!keep_tmp.py\n")
    write(repo / "src" / ".gitignore", "local.py\n")
    for name in ("train.py", "generated/train.py", "x_tmp.py", "keep_tmp.py", "top_only.py",
                 "sub/top_only.py", "src/local.py", "src/train.py"):
        write(repo / name, TRAIN)
    out = sdp(str(repo))
    assert out.returncode == 0, out.stderr
    done = sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*.py") if converted(p))
    assert done == ["keep_tmp.py", "src/train.py", "sub/top_only.py", "train.py"]
    # Walking a subdirectory still applies the rules above it; --no-respect-gitignore does not.
    write(repo / "src" / "local.py", TRAIN)
    assert sdp(str(repo / "src")).returncode == 0 and not converted(repo / "src" / "local.py")
    assert sdp("--no-respect-gitignore", str(repo / "src")).returncode == 0
    assert converted(repo / "src" / "local.py")
    # An ignored directory named on the command line is converted, as a named file is (the
    # standard library inside a pyenv checkout, whose .gitignore ignores versions/, is one);
    # with --force-exclude it is not.
    assert sdp("--check", "--force-exclude", str(repo / "generated")).returncode == 0
    assert sdp(str(repo / "generated")).returncode == 0
    assert converted(repo / "generated" / "train.py")


def test_exclude_extend_exclude_and_directory_globs(tmp_path):
    for name in ("train.py", "old/train.py", "old_train.py", "exp/a/train.py", "b/train.py"):
        write(tmp_path / "src" / name, TRAIN)
    out = sdp("src", "--exclude", "old/", "--extend-exclude", "src/exp", "--check",
              "--report", "-", "--report-format", "json", cwd=tmp_path)
    files = sorted(f["path"] for f in json.loads(out.stdout)["files"])
    # "old/" matches the directory only, not old_train.py; src/exp is matched as written.
    assert files == ["src/b/train.py", "src/old_train.py", "src/train.py"]


def test_force_exclude_applies_to_files_named_on_the_command_line(tmp_path):
    legacy = write(tmp_path / "legacy" / "train.py", TRAIN)
    write(tmp_path / "pyproject.toml", '[tool.sdp-convert]\nexclude = ["legacy/"]\n')
    # Named explicitly, a file is converted (as black and ruff do) ...
    assert sdp("--check", "legacy/train.py", cwd=tmp_path).returncode == 1
    # ... unless --force-exclude (what pre-commit needs: it passes every staged file).
    forced = sdp("--check", "--force-exclude", "legacy/train.py", cwd=tmp_path)
    assert forced.returncode == 0
    assert b"0 would be converted, 0 need attention, 0 unchanged" in forced.stderr
    assert legacy.read_text() == TRAIN


def test_output_directory_inside_the_input_tree_is_not_converted_again(tmp_path):
    write(tmp_path / "src" / "train.py", TRAIN)
    write(tmp_path / "src" / "notes.txt", "hi\n")
    for _ in range(2):
        out = sdp("src", "-o", "src/converted", cwd=tmp_path)
        assert out.returncode == 0, out.stderr
    assert b"1 converted" in out.stderr
    assert converted(tmp_path / "src" / "converted" / "train.py")
    assert not (tmp_path / "src" / "converted" / "converted").exists()


def test_output_newdir_with_trailing_slash_for_one_file(tmp_path):
    write(tmp_path / "train.py", TRAIN)
    out = sdp("train.py", "-o", "newdir/", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert converted(tmp_path / "newdir" / "train.py")
    assert (tmp_path / "train.py").read_text() == TRAIN


def test_pyproject_configuration_is_read_and_flags_win(tmp_path):
    project = tmp_path / "project"
    write(project / "pyproject.toml", """\
[tool.black]
line-length = 100

[tool.sdp-convert]
lr-scaling = "sqrt"
exclude = ["vendor/"]
skip = ["pin_gpu_device"]
jobs = 1
""")
    write(project / "src" / "train.py", TRAIN)
    write(project / "vendor" / "train.py", TRAIN)
    (project / ".git").mkdir()
    # Found from the paths given (here from a directory below the project), not from the cwd.
    out = sdp(str(project / "src"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    text = (project / "src" / "train.py").read_text()
    assert "lr=0.1 * sdp.size() ** 0.5" in text
    assert "set_device" not in text  # skipped transform
    assert sdp(str(project), cwd=tmp_path).returncode == 0
    assert not converted(project / "vendor" / "train.py")
    # A flag wins over the file.
    write(project / "src" / "b.py", TRAIN)
    assert sdp("--lr-scaling", "none", str(project / "src" / "b.py")).returncode == 0
    assert "lr=0.1)" in (project / "src" / "b.py").read_text()
    # --config names another file.
    other = write(tmp_path / "other.toml", '[tool.sdp-convert]\nonly = ["add_runtime_init"]\n')
    write(tmp_path / "c.py", TRAIN)
    out = sdp("--config", str(other), "--check", str(tmp_path / "c.py"))
    assert out.returncode == 1 and b"[wrap_model_ddp]" not in out.stderr


def test_rank0_output_from_the_file_and_the_flag(tmp_path):
    script = TRAIN + 'print("done")\n'
    write(tmp_path / "pyproject.toml", '[tool.sdp-convert]\nrank0-output = "all"\n')
    write(tmp_path / "a.py", script)
    assert sdp(str(tmp_path / "a.py")).returncode == 0
    assert 'sdp.rank0_print("done")' in (tmp_path / "a.py").read_text()
    write(tmp_path / "b.py", script)
    assert sdp("--rank0-output", "progress", str(tmp_path / "b.py")).returncode == 0
    assert 'print("done")' in (tmp_path / "b.py").read_text()
    assert "rank0_print" not in (tmp_path / "b.py").read_text()


@pytest.mark.parametrize(("table", "message"), [
    ('lr-scalling = "sqrt"', "unknown key 'lr-scalling'"),
    ('rank0-output = "some"', "rank0-output: 'some' is not one of progress, all, none"),
    ('lr-scaling = "cubic"', "lr-scaling: 'cubic' is not one of linear, sqrt, none"),
    ("jobs = 0", "jobs: must be a whole number"),
    ('skip = ["no_such_transform"]', "unknown transform no_such_transform"),
    ("exclude = [1]", "exclude: must be a list of strings"),
])
def test_bad_configuration_is_one_line_and_exit_2(tmp_path, table, message):
    write(tmp_path / "pyproject.toml", f"[tool.sdp-convert]\n{table}\n")
    script = write(tmp_path / "train.py", TRAIN)
    out = sdp(str(script))
    err = out.stderr.decode()
    assert out.returncode == 2 and err.count("\n") == 1 and message in err, err
    assert script.read_text() == TRAIN


def _without_root_powers() -> list[str]:
    """A prefix that makes root subject to file permissions (as any user is), or [] when not root.

    root reads a chmod 000 directory; with CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH dropped
    from its bounding set it cannot, which is the situation of a normal user.
    """
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: cannot make a directory unreadable")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


def test_unreadable_subdirectory_is_one_line_and_the_rest_is_converted(tmp_path):
    write(tmp_path / "src" / "train.py", TRAIN)
    locked = tmp_path / "src" / "locked"
    write(locked / "train.py", TRAIN)
    locked.chmod(0)
    try:
        out = subprocess.run([*_without_root_powers(), SDP_CONVERT, str(tmp_path / "src")],
                             capture_output=True, text=True, timeout=120)
    finally:
        locked.chmod(0o755)
    assert out.returncode == 2
    assert f"{locked}: cannot read directory: Permission denied" in out.stderr
    assert "Traceback" not in out.stderr
    assert converted(tmp_path / "src" / "train.py")
    assert not converted(locked / "train.py")


def test_read_only_file_is_refused_and_left_alone(tmp_path):
    script = write(tmp_path / "train.py", TRAIN)
    other = write(tmp_path / "other.py", TRAIN)
    script.chmod(0o444)
    out = sdp(str(script), str(other))
    assert out.returncode == 2
    assert f"{script}: cannot write: read-only file, not replaced" in out.stderr.decode()
    assert script.read_text() == TRAIN and converted(other)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another user")
def test_in_place_write_keeps_the_owner(tmp_path):
    script = write(tmp_path / "train.py", TRAIN)
    os.chown(script, 65534, 65534)
    assert sdp(str(script)).returncode == 0
    assert converted(script)
    assert (script.stat().st_uid, script.stat().st_gid) == (65534, 65534)
    # Without the power to give a file away (a normal user), another user's file is refused.
    theirs = write(tmp_path / "theirs.py", TRAIN)
    os.chown(theirs, 65534, 65534)
    theirs.chmod(0o666)
    out = subprocess.run(["setpriv", "--bounding-set=-chown", SDP_CONVERT, str(theirs)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "owned by another user (uid 65534)" in out.stderr
    assert theirs.read_text() == TRAIN and theirs.stat().st_uid == 65534


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_ctrl_c_in_a_tree_lists_the_files_already_written(tmp_path, jobs):
    tree = tmp_path / "tree"
    names = [f"t{i:03d}.py" for i in range(80)]
    for name in names:  # each its own content: the cache would answer for copies at once
        write(tree / name, f"# {name}\n{TRAIN}")
    write(tree / "notes.py", NOT_TRAINING)
    proc = subprocess.Popen([SDP_CONVERT, "-j", jobs, str(tree)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not converted(tree / names[0]):
            assert proc.poll() is None and time.monotonic() < deadline, "no file was converted"
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    lines = err.splitlines()
    head = next(i for i, line in enumerate(lines) if "stopped by SIGINT" in line)
    listed = {Path(line.strip()).name for line in lines[head + 1:]}
    assert f"{len(listed)} file(s) had been written" in lines[head]
    assert names[0] in listed and len(listed) < len(names)
    for name in names:  # every file listed was converted, every other one left as it was
        assert converted(tree / name) == (name in listed), name
    assert not list(tree.glob(".*.sdp-tmp"))
