"""``sdp_runtime.notebook_launcher`` in a real Jupyter kernel (ipykernel, run by nbclient): a
notebook converted by ``sdp-convert`` trains on 2 forked processes with the strict audit, as one
process does at twice the batch; a failing rank stops the other and raises in the notebook,
leaving no process behind. Also from a plain Python process, and its argument errors."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from . import _notebooks
from ._spawn import clean_env
from .test_notebook_run import TORCH_LOG_LINE

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

SDP_CONVERT = str(Path(sys.executable).with_name("sdp-convert"))
CELL_TIMEOUT_S = 240


def _execute(nb, folder: Path, *, allow_errors: bool = False):
    """Run every cell of ``nb`` in a fresh python3 kernel started in ``folder``; the kernel
    (and every process in its group) is gone when this returns."""
    env = clean_env({"JUPYTER_RUNTIME_DIR": str(folder / ".jupyter"),
                     "IPYTHONDIR": str(folder / ".ipython")})
    client = nbclient.NotebookClient(
        nb, kernel_name="python3", timeout=CELL_TIMEOUT_S, allow_errors=allow_errors,
        resources={"metadata": {"path": str(folder)}})
    client.execute(env=env)
    return nb


def _text(cell) -> str:
    """A cell's output as one text: its streams, values and errors."""
    parts = []
    for out in cell.outputs:
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type in ("execute_result", "display_data"):
            parts.append(out.data.get("text/plain", "") + "\n")
        elif out.output_type == "error":
            parts.append(f"{out.ename}: {out.evalue}\n")
    return "".join(parts)


def _code(source: str):
    return nbformat.v4.new_code_cell(source)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_converted_notebook_trains_through_the_launcher_in_a_jupyter_kernel(tmp_path):
    path = _notebooks.write(tmp_path / "train.ipynb", _notebooks.IN_A_FUNCTION)
    done = subprocess.run([SDP_CONVERT, "--no-cache", path.name], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "(manual)" not in done.stderr, done.stderr
    # The hint says how to run it from inside Jupyter.
    assert "sdp_runtime.notebook_launcher(train, num_processes=2, audit=True)" in done.stderr
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(_code("import signal\nbefore = signal.getsignal(signal.SIGINT)"))
    nb.cells.extend(_code(source) for _, source in _notebooks.LAUNCH)
    nb.cells.append(_code("print('handler kept', signal.getsignal(signal.SIGINT) is before)\n"
                          "import sdp_runtime.torch as sdp\nprint('kernel', sdp.rank(), "
                          "sdp.size())"))
    start = time.monotonic()
    _execute(nb, tmp_path)
    took = time.monotonic() - start

    cells = {"".join(c.source).splitlines()[0]: _text(c) for c in nb.cells
             if c.cell_type == "code"}
    assert "env: SDP_NB_MARK=set by %env" in cells["%env SDP_NB_MARK=set by %env"]
    launched = cells["from sdp_runtime import notebook_launcher"]
    for r in (0, 1):
        assert f"[rank{r}]: DistributedDataParallel(" in launched, launched  # display(model)
        assert re.search(rf"^\[rank{r}\]: epoch 1 loss \d", launched, re.M), launched
    assert "sdp audit: no problem found" in launched
    assert not TORCH_LOG_LINE.search(launched), launched
    checks = cells['print("ranks agree", weights[0] == weights[1])']
    assert checks.splitlines() == ["ranks agree True", "as one process at twice the batch True",
                                   "mark set by %env"]
    # The kernel's interrupt handler is its own again, and so is its one-process runtime.
    assert cells["print('handler kept', signal.getsignal(signal.SIGINT) is before)"] == (
        "handler kept True\nkernel 0 1\n")
    print(f"kernel start, conversion's cells, launch and checks: {took:.1f} s")


FAILING = """\
import os, time
import torch
import sdp_runtime.torch as sdp
from sdp_runtime import LaunchError, notebook_launcher

def train():
    sdp.init()
    total = sdp.allreduce(torch.ones(1), op=sdp.Sum)
    if sdp.rank() == 1:
        raise ValueError(f"planned failure after a sum of {total.item():g}")
    time.sleep(120)  # rank 0: stopped by the launcher, long before this ends
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_failing_rank_stops_the_other_and_raises_in_the_notebook(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [_code(FAILING),
                _code("start = time.monotonic()\nnotebook_launcher(train, num_processes=2)"),
                _code("print('stopped within', round(time.monotonic() - start))\n"
                      "import psutil\nprint('left', psutil.Process().children(recursive=True))")]
    _execute(nb, tmp_path, allow_errors=True)
    launch, after = _text(nb.cells[1]), _text(nb.cells[2])
    assert "[rank1]: Traceback (most recent call last):" in launch
    assert "[rank1]: ValueError: planned failure after a sum of 2" in launch
    assert ("LaunchError: rank 1 failed first: ValueError: planned failure after a sum of 2 "
            "(exit status 1); the other ranks were stopped") in launch
    assert not TORCH_LOG_LINE.search(launch), launch
    seconds = int(re.search(r"stopped within (\d+)", after)[1])
    assert seconds < 60, after  # rank 0 would sleep 120 s
    assert "left []" in after


PLAIN = """\
import sys, time
import torch
import sdp_runtime.torch as sdp
from sdp_runtime import LaunchError, notebook_launcher

def train(fail):
    sdp.init()
    total = sdp.allreduce(torch.tensor([float(sdp.rank())]), op=sdp.Sum)
    print("rank", sdp.rank(), "of", sdp.size(), "sum", total.item())
    if fail and sdp.rank() == 0:
        sys.exit(3)
    return sdp.rank()

print("returned", notebook_launcher(train, args=(False,), num_processes=2))
try:
    notebook_launcher(train, args=(True,), num_processes=2)
except LaunchError as error:
    print("raised", error.rank, error.status, error)
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_from_a_plain_python_process(tmp_path):
    script = tmp_path / "launch_twice.py"
    script.write_text(PLAIN)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=clean_env(),
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert "returned [0, 1]" in out
    assert "[rank0]: rank 0 of 2 sum 1.0" in out and "[rank1]: rank 1 of 2 sum 1.0" in out
    assert "raised 0 3 rank 0 failed first: exit status 3; the other ranks were stopped" in out
    assert not TORCH_LOG_LINE.search(done.stderr), done.stderr


@pytest.mark.parametrize("kwargs, message", [
    ({"num_processes": 0}, "num_processes=0"),
    ({"audit": "sometimes"}, "audit='sometimes'"),
])
def test_bad_arguments(kwargs, message):
    from sdp_runtime import notebook_launcher

    with pytest.raises(ValueError, match=re.escape(message)):
        notebook_launcher(print, **kwargs)


SLEEPING = """\
import time
import sdp_runtime.torch as sdp
from sdp_runtime import notebook_launcher

def train():
    sdp.init()
    print("rank", sdp.rank(), "sleeping", flush=True)
    time.sleep(120)

notebook_launcher(train, num_processes=2)
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_interrupting_the_kernel_stops_every_rank(tmp_path):
    """The notebook's stop button (SIGINT to the kernel's process group)."""
    from jupyter_client.manager import start_new_kernel

    env = clean_env({"JUPYTER_RUNTIME_DIR": str(tmp_path / ".jupyter"),
                     "IPYTHONDIR": str(tmp_path / ".ipython")})
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(tmp_path), env=env)
    try:
        def run(code: str, interrupt_when_sleeping: bool = False) -> tuple[str, float | None]:
            msg_id, texts, interrupted = kc.execute(code), [], None
            deadline = time.monotonic() + 200
            while time.monotonic() < deadline:
                try:
                    msg = kc.get_iopub_msg(timeout=1)
                except Exception:  # queue.Empty: nothing for a second
                    ready = "".join(texts).count("sleeping") == 2
                    if interrupt_when_sleeping and interrupted is None and ready:
                        interrupted = time.monotonic()
                        km.interrupt_kernel()
                    continue
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                kind, content = msg["msg_type"], msg["content"]
                if kind == "stream":
                    texts.append(content["text"])
                elif kind == "error":
                    texts.append(f"{content['ename']}: {content['evalue']}\n")
                elif kind == "status" and content["execution_state"] == "idle":
                    took = time.monotonic() - interrupted if interrupted else None
                    return "".join(texts), took
            pytest.fail(f"the cell did not end: {''.join(texts)}")

        shown, took = run(SLEEPING, interrupt_when_sleeping=True)
        assert "KeyboardInterrupt: stopped by SIGINT; every rank was stopped" in shown, shown
        assert took is not None and took < 30, shown  # the ranks would sleep 120 s
        after, _ = run("import psutil, signal\nprint(psutil.Process().children(recursive=True))\n"
                       "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)")
        assert after == "[]\nTrue\n"  # no rank left; the kernel's interrupt handler is back
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
