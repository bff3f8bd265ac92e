"""No input takes a run down, and nothing is written that does not compile: through the real
``sdp-convert`` command, with real processes (issue 32, section 3).

Each test bounds what it starts (timeouts, and a kill of the process group in ``finally``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest
import sdp_convert
from sdp_convert.changes import ConversionError

from .test_cli import SDP_CONVERT, TRAIN, sdp, write

HEAD = ("import torch\nmodel = torch.nn.Linear(4, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n")
LOOP = (
    "for step in range(3):\n    loss = model(torch.randn(8, 4)).pow(2).mean()\n"
    "    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"
)


def long_script(statements: int) -> str:
    """A training script with ``statements`` flat top-level statements (an exported notebook)."""
    return HEAD + "".join(f"v{i} = torch.zeros({i % 7 + 1})\n" for i in range(statements)) + LOOP


def functions_script(functions: int) -> str:
    """``functions`` plain functions, 3 lines each: 1,000 give the issue's 3,084-line file."""
    body = "".join(f"def f{i}(a):\n    return a + {i}\n\n" for i in range(functions))
    return HEAD + body + LOOP


#: 5,000 nested parentheses: libcst's native parser crashes on them; CPython says no.
NESTED = HEAD + "x = " + "(" * 5000 + "1" + ")" * 5000 + "\n" + LOOP
#: libcst parses it, CPython refuses to compile it.
RETURN_OUTSIDE = HEAD + LOOP + "return opt\n"


def test_long_flat_files_convert(tmp_path):
    for name, text in (("flat.py", long_script(1000)), ("functions.py", functions_script(1000))):
        script = write(tmp_path / name, text)
        out = sdp("--check", str(script))
        assert out.returncode == 1, out.stderr
        assert b"Traceback" not in out.stderr and b"nested too deeply" not in out.stderr
        assert b"[add_runtime_init]" in out.stderr
    assert len(functions_script(1000).splitlines()) == 3008


def test_the_python_api_raises_its_documented_error_never_a_recursion_error():
    # Code CPython itself refuses (too many parentheses for its parser, too deep for its
    # compiler): the documented error, never a RecursionError.
    for text in (NESTED, "x = " + " + ".join(f"a{i}" for i in range(3000)) + "\n" + LOOP):
        with pytest.raises(ConversionError):
            sdp_convert.convert(HEAD + text)


def test_deeply_nested_code_cpython_compiles_converts():
    """150 nested lists, which CPython compiles: converted (issue 39: any file CPython
    compiles converts), not refused as "nested too deeply" as it was before the converter's
    walks took fewer frames a level (2026-11-29)."""
    deep = HEAD + "x = " + "[" * 150 + "1" + "]" * 150 + "\n" + LOOP
    result = sdp_convert.convert(deep)
    assert result.changed
    output = result.output.decode()
    assert "model = sdp.DistributedDataParallel(model)" in output
    assert "x = " + "[" * 150 + "1" + "]" * 150 + "\n" in output
    compile(result.output, "deep.py", "exec")


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_code_cpython_rejects_is_reported_with_its_error_and_the_run_goes_on(tmp_path, jobs):
    tree = tmp_path / "tree"
    nested = write(tree / "nested.py", NESTED)
    outside = write(tree / "outside.py", RETURN_OUTSIDE)
    train = write(tree / "train.py", TRAIN)
    out = subprocess.run([SDP_CONVERT, "-j", jobs, str(tree)], capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert f"{nested}:4:205: syntax error: too many nested parentheses" in out.stderr
    assert f"{outside}:9:1: syntax error: 'return' outside function" in out.stderr
    assert "1 converted" in out.stderr.splitlines()[-1] and "2 failed" in out.stderr
    assert nested.read_text() == NESTED and outside.read_text() == RETURN_OUTSIDE
    assert "sdp.init()" in train.read_text()


def test_fifos_symlink_loops_and_broken_notebooks_are_one_line_each(tmp_path):
    tree = tmp_path / "tree"
    train = write(tree / "train.py", TRAIN)
    os.mkfifo(tree / "pipe.py")  # a neighbour read for project mode: must not hang
    with contextlib.suppress(PermissionError):  # a device too, where we may make one (root)
        os.mknod(tree / "null.py", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    (tree / "loop.py").symlink_to(tree / "loop.py")
    shapes = ['{"cells": [1, 2]}', '{"cells": null}', "[1]",
              '{"cells": [{"cell_type": "code", "source": 5}]}']
    for n, shape in enumerate(shapes):
        write(tree / f"nb{n}.ipynb", shape)
    out = subprocess.run([SDP_CONVERT, "-j", "1", str(tree), str(tree / "loop.py"),
                          str(tree / "pipe.py")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and "internal error" not in out.stderr
    assert f"{tree / 'pipe.py'}: not a regular file" in out.stderr
    if (tree / "null.py").exists():
        assert f"{tree / 'null.py'}: not a regular file" in out.stderr
    assert f"skipped {tree / 'loop.py'}: symlink, not followed" in out.stderr
    for n in range(len(shapes)):
        assert f"nb{n}.ipynb: not a valid notebook: " in out.stderr
    assert "sdp.init()" in train.read_text()


# -- files that change while they are converted -------------------------------------------------

_IN_CLOSE_NOWRITE = 0x10


def _wait_until_read(path: Path, proc: subprocess.Popen, reads: int = 2,
                     timeout: float = 120) -> None:
    """Block until ``path`` was opened for reading and closed ``reads`` times (inotify): once
    by ``siblings.read_project`` (the run's files and their neighbours), once to convert it."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK)
    assert fd >= 0
    try:
        assert libc.inotify_add_watch(fd, str(path).encode(), _IN_CLOSE_NOWRITE) >= 0
        deadline = time.monotonic() + timeout
        seen = 0
        while seen < reads:
            assert time.monotonic() < deadline, "the file was not read"
            assert proc.poll() is None, "the run ended before it read the file"
            try:
                seen += len(os.read(fd, 4096)) // 16  # one event: 16 bytes, no name (a file)
            except BlockingIOError:
                time.sleep(0.005)
    finally:
        os.close(fd)


@pytest.mark.parametrize("change", ["delete", "edit"])
def test_a_file_changed_while_being_converted_is_left_as_the_user_left_it(tmp_path, change):
    script = write(tmp_path / "train.py", long_script(3000))
    proc = subprocess.Popen([SDP_CONVERT, "--no-cache", str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _wait_until_read(script, proc)  # converting a 3,000-line file takes seconds more
        if change == "delete":
            script.unlink()
        else:
            script.write_text("print('my edit')\n")
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 2, err
    assert f"{script}: changed or deleted while it was being converted; left as it is" in err
    if change == "delete":
        assert not script.exists(), "a deleted file was re-created"
    else:
        assert script.read_text() == "print('my edit')\n"


# -- processes ---------------------------------------------------------------------------------

def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _big_tree(root: Path, files: int, statements: int) -> Path:
    for i in range(files):  # separate folders: independent scripts, no project to plan
        write(root / f"d{i}" / "train.py", f"# {i}\n" + long_script(statements))
    return root


def test_kill_9_of_the_main_process_ends_its_workers(tmp_path):
    tree = _big_tree(tmp_path / "tree", 2, 4000)
    proc = subprocess.Popen([SDP_CONVERT, "--no-cache", "--check", "-j", "2", str(tree)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while len(workers) < 2 and time.monotonic() < deadline and proc.poll() is None:
            workers = _children(proc.pid)
            time.sleep(0.05)
        assert len(workers) == 2, "the workers never started"
        time.sleep(0.5)
        proc.kill()
        proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [w for w in workers if _alive(w)], "workers outlived their parent"
    finally:
        for pid in [proc.pid, *workers]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_sigterm_under_check_stops_at_once(tmp_path, jobs):
    tree = _big_tree(tmp_path / "tree", 2, 6000)
    proc = subprocess.Popen([SDP_CONVERT, "--no-cache", "--check", "-j", jobs, str(tree)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _wait_until_read(tree / "d0" / "train.py", proc)  # converting takes many seconds more
        time.sleep(0.3)
        assert proc.poll() is None
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, err
    assert "stopped by SIGTERM; no file was written." in err
    assert "Traceback" not in err
    assert took < 3, f"took {took:.1f} s to stop"
    time.sleep(0.5)
    assert not _children(proc.pid)


def test_a_worker_that_dies_fails_its_file_and_the_run_goes_on(tmp_path):
    """A worker killed by the kernel (here: over its CPU-time limit, SIGXCPU/SIGKILL) fails the
    file it was converting, with one line; every other file is converted, the summary is
    printed and the exit status is 2 ("error"), not 1 ("would change")."""
    tree = tmp_path / "tree"
    big = write(tree / "big" / "train.py", long_script(8000))  # many seconds of CPU
    small = [write(tree / f"s{i}" / "train.py", f"# {i}\n{TRAIN}") for i in range(3)]

    def limit_cpu() -> None:  # every process of the run: 3 s of CPU each
        resource.setrlimit(resource.RLIMIT_CPU, (3, 4))

    out = subprocess.run([SDP_CONVERT, "--no-cache", "-j", "2", str(tree)], capture_output=True,
                         text=True, timeout=300, preexec_fn=limit_cpu)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and "BrokenProcessPool" not in out.stderr
    lines = out.stderr.splitlines()
    assert f"{big}: the converter's process died converting it" in out.stderr
    assert len([ln for ln in lines if "process died" in ln]) == 1
    assert lines[-1].startswith("sdp-convert: 3 converted") and "1 failed" in lines[-1]
    assert big.read_text() == long_script(8000)
    assert all("sdp.init()" in s.read_text() for s in small)


def test_an_output_that_does_not_compile_is_never_written(tmp_path, monkeypatch, capsys):
    """The guard behind every write: were a transform to produce code CPython rejects (here a
    conversion is made to return one), the file is failed with one line and left alone."""
    from sdp_convert import engine
    from sdp_convert.cli import main

    real = engine.convert

    def broken(source, options=None):
        result = real(source, options)
        result.output = result.output.replace(b"sdp.init()", b"sdp.init(")
        return result

    monkeypatch.setattr(engine, "convert", broken)
    script = write(tmp_path / "train.py", TRAIN)
    assert main(["--no-cache", "-j", "1", str(script)]) == 2
    err = capsys.readouterr().err
    assert f"{script}: internal error: the converted code does not compile (syntax error: " in err
    assert script.read_text() == TRAIN
