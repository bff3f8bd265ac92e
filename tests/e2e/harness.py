"""What the e2e tests share: the case spec, running processes safely, and reading what they learn.

Every process is started in its own session and, past its time limit, the whole process group is
killed (``sdp-run`` starts a launcher that starts the ranks; all of them go). A failing process
fails the test with its command, directory and the tail of its output.
"""

from __future__ import annotations

import ast
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures"
AUDIT_PATH = Path(__file__).resolve().parent / "audit"
BIN = Path(sys.executable).parent
SDP_RUN = str(BIN / "sdp-run")

#: Default hard limit for one process (or one launch of several).
TIMEOUT_S = 120
#: Float tolerance of "N processes at batch B == 1 process at batch N*B": the same sums in another
#: order, over a few steps of tiny models.
RTOL, ATOL = 1e-5, 1e-6
#: Shuffled data: the sampler's order differs by design; the weights must stay as big (relative).
NORM_RTOL = 0.1

# Variables that would make a "single" process believe it is a rank of something bigger.
_LAUNCH_VARS = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
    "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK", "PMI_SIZE", "SM_HOSTS", "SM_CURRENT_HOST",
)
_LAUNCH_PREFIXES = ("SLURM_", "TORCHELASTIC_", "SDP_")


@dataclass(frozen=True)
class Output:
    """One state dict a case writes: ``file`` (relative to the run directory), ``key`` inside it."""

    file: str
    key: str | None = None
    model: str | None = None


@dataclass(frozen=True)
class Spec:
    """A case's ``e2e.json`` (schema: see ``test_torch_equivalence``)."""

    case: Path
    batch: int
    lr: float
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    outputs: tuple[Output, ...] = ()
    writes: tuple[str, ...] = ()
    shuffle: bool = False
    scales_lr: bool = True
    unchanged: bool = False
    resume_args: tuple[str, ...] = ()
    timeout: float = TIMEOUT_S

    @property
    def name(self) -> str:
        return f"{self.case.parent.name}/{self.case.name}"

    @classmethod
    def load(cls, case: Path) -> Spec:
        raw = json.loads((case / "e2e.json").read_text())
        known = {"batch", "lr", "args", "env", "outputs", "writes", "shuffle", "scales_lr",
                 "unchanged", "resume_args", "timeout"}
        unknown = set(raw) - known
        if unknown:
            raise ValueError(f"{case}/e2e.json: unknown keys {sorted(unknown)}")
        if not raw.get("outputs"):
            raise ValueError(f"{case}/e2e.json: no outputs")
        return cls(
            case=case,
            batch=int(raw["batch"]),
            lr=float(raw["lr"]),
            args=tuple(raw.get("args", ())),
            env=dict(raw.get("env", {})),
            outputs=tuple(Output(**o) for o in raw["outputs"]),
            writes=tuple(raw.get("writes", ())),
            shuffle=bool(raw.get("shuffle", False)),
            scales_lr=bool(raw.get("scales_lr", True)),
            unchanged=bool(raw.get("unchanged", False)),
            resume_args=tuple(raw.get("resume_args", ())),
            timeout=float(raw.get("timeout", TIMEOUT_S)),
        )

    def command_line(self, batch: int, lr: float) -> tuple[list[str], dict[str, str]]:
        """The script's arguments and environment for per-process ``batch`` and ``lr``."""
        values = {"batch": str(batch), "lr": repr(lr)}
        return (
            [a.format(**values) for a in self.args],
            {k: v.format(**values) for k, v in self.env.items()},
        )


def all_specs(kind: str) -> list[Spec]:
    cases = sorted((FIXTURES / kind).glob("*/"))
    return [Spec.load(c) for c in cases if (c / "e2e.json").is_file()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def base_env(
    extra: Mapping[str, str] | None = None, audit_dir: Path | None = None
) -> dict[str, str]:
    """A clean environment: one CPU process that knows of no launcher, plus ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _LAUNCH_VARS and not k.startswith(_LAUNCH_PREFIXES)
    }
    env.update(
        CUDA_VISIBLE_DEVICES="",  # equivalence is defined (and tested) on CPU processes
        OMP_NUM_THREADS="1",
        PYTHONHASHSEED="0",
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONUNBUFFERED="1",
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=os.pathsep.join(p for p in (str(AUDIT_PATH), env.get("PYTHONPATH")) if p),
        # sdp-run checks every multi-process run as it trains (README, "The audit"): identical
        # data on the ranks, gradients never averaged, weights that drift apart, unequal steps,
        # files written by several ranks. Strict: a problem makes the launch exit with status 3,
        # which fails the test with the audit's report in the output.
        SDP_AUDIT="strict",
    )
    if audit_dir is not None:
        audit_dir.mkdir(parents=True, exist_ok=True)
        env["SDP_E2E_AUDIT"] = str(audit_dir)
    env.update(extra or {})
    return env


@dataclass
class Proc:
    cmd: list[str]
    cwd: Path
    env_extra: Mapping[str, str]
    popen: subprocess.Popen[bytes]
    log: IO[bytes]  # stdout and stderr (a file: a pipe nobody reads while waiting could fill up)
    timeout: float
    started: float

    @property
    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def describe(self, why: str) -> str:
        env = " ".join(f"{k}={v}" for k, v in self.env_extra.items())
        return (
            f"{why}\n  cwd: {self.cwd}\n  cmd: {env + ' ' if env else ''}{' '.join(self.cmd)}\n"
            f"  output (last 6000 characters):\n{self.output[-6000:]}"
        )


def start(
    cmd: Sequence[str], cwd: Path, env_extra: Mapping[str, str] | None = None, *,
    audit_dir: Path | None = None, timeout: float = TIMEOUT_S,
) -> Proc:
    cwd.mkdir(parents=True, exist_ok=True)
    env_extra = dict(env_extra or {})
    log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the Proc
    popen = subprocess.Popen(
        list(cmd), cwd=cwd, env=base_env(env_extra, audit_dir), stdin=subprocess.DEVNULL,
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    return Proc(list(cmd), cwd, env_extra, popen, log, timeout, time.monotonic())


def finish(*procs: Proc) -> None:
    """Wait for ``procs``; fail (killing the others) as soon as one fails or passes its limit.

    Processes that train together (the nodes of one job) would otherwise wait for a dead partner
    until their own limit.
    """
    pending = list(procs)
    failures = []
    try:
        while pending and not failures:
            time.sleep(0.05)
            for proc in list(pending):
                code = proc.popen.poll()
                if code is None:
                    if time.monotonic() - proc.started > proc.timeout:
                        _kill_group(proc.popen)
                        pending.remove(proc)
                        why = f"timed out after {proc.timeout:.0f}s (killed)"
                        failures.append(proc.describe(why))
                    continue
                pending.remove(proc)
                if code != 0:
                    failures.append(proc.describe(f"exited with status {code}"))
    finally:  # also on pytest-timeout or ^C: leave no partner (rank, node) behind
        for proc in pending:
            _kill_group(proc.popen)
    if failures:
        pytest.fail("\n\n".join(failures), pytrace=False)
    for proc in procs:
        if _audited(proc) and "sdp audit: " not in proc.output:
            pytest.fail(proc.describe("sdp-run printed no audit report"), pytrace=False)


def _audited(proc: Proc) -> bool:
    """A launch of several processes by sdp-run, which must end with the audit's report."""
    if not proc.cmd or proc.cmd[0] != SDP_RUN or proc.env_extra.get("SDP_AUDIT", "x") == "":
        return False
    args = proc.cmd[1:]
    for flag in ("-n", "--nproc-per-node", "-np"):
        if flag in args:
            value = args[args.index(flag) + 1]
            return value.isdigit() and int(value) > 1
    return False


def run(
    cmd: Sequence[str], cwd: Path, env_extra: Mapping[str, str] | None = None, *,
    audit_dir: Path | None = None, timeout: float = TIMEOUT_S,
) -> Proc:
    proc = start(cmd, cwd, env_extra, audit_dir=audit_dir, timeout=timeout)
    finish(proc)
    return proc


def _kill_group(popen: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(popen.pid, signal.SIGKILL)
    popen.wait()


def copy_script(src: Path, dest_dir: Path, name: str) -> Path:
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / name
    shutil.copyfile(src, dest)
    return dest


def converted_copy(src: Path, dest_dir: Path, name: str = "train.py") -> Path:
    """``src`` copied to ``dest_dir/name`` and converted there by the ``sdp-convert`` command
    installed next to this Python, as a user does (it must succeed)."""
    script = copy_script(src, dest_dir, name)
    cli = shutil.which("sdp-convert", path=str(Path(sys.executable).parent))
    assert cli, "sdp-convert is not installed next to this Python"
    done = subprocess.run([cli, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return script


# -- what a run wrote ------------------------------------------------------------------------------


def files_in(run_dir: Path, script: str) -> set[str]:
    """Files a run left in its directory, relative, without the script itself."""
    return {
        str(p.relative_to(run_dir))
        for p in run_dir.rglob("*")
        if p.is_file() and p.name != script and "__pycache__" not in p.parts
    }


def writers(audit_dir: Path) -> dict[str, list[str]]:
    """``{relative path: [RANK of each process that wrote it]}`` from the audit logs of a run."""
    found: dict[str, set[tuple[str, str]]] = {}
    for log in audit_dir.glob("writes.*.log"):
        pid = log.name.split(".")[1]
        for line in log.read_text().splitlines():
            rank, _how, path = line.split("\t", 2)
            found.setdefault(path, set()).add((pid, rank))
    return {path: sorted(rank for _pid, rank in procs) for path, procs in found.items()}


def load_state(run_dir: Path, output: Output) -> dict[str, object]:
    import torch

    path = run_dir / output.file
    assert path.is_file(), f"{path} was not written (files there: {sorted(files_in(run_dir, ''))})"
    obj = torch.load(path, map_location="cpu", weights_only=True)
    if output.key is not None:
        assert isinstance(obj, dict) and output.key in obj, f"{path} has no key {output.key!r}"
        obj = obj[output.key]
    assert isinstance(obj, dict), f"{path}: expected a state dict, got {type(obj).__name__}"
    return obj


def assert_same_layout(got: Mapping[str, object], want: Mapping[str, object], what: str) -> None:
    import torch

    assert list(got) == list(want), (
        f"{what}: state dict keys differ\n  got:  {list(got)}\n  want: {list(want)}"
    )
    for k in want:
        g, w = got[k], want[k]
        if isinstance(w, torch.Tensor):
            assert isinstance(g, torch.Tensor) and g.shape == w.shape and g.dtype == w.dtype, (
                f"{what}: {k} is {getattr(g, 'shape', g)} / {getattr(g, 'dtype', '')}, "
                f"want {w.shape} / {w.dtype}"
            )


def assert_state_close(
    got: Mapping[str, object], want: Mapping[str, object], what: str, *, exact: bool = False,
    rtol: float = RTOL, atol: float = ATOL,
) -> None:
    import torch

    assert_same_layout(got, want, what)
    bad = []
    for k, w in want.items():
        g = got[k]
        if not isinstance(w, torch.Tensor):
            continue
        ok = torch.equal(g, w) if exact else torch.allclose(g, w, rtol=rtol, atol=atol)
        if not ok:
            diff = (g.double() - w.double()).abs().max().item()
            bad.append(f"{k}: max |diff| {diff:.3g} (max |want| {w.abs().max().item():.3g})")
    rule = "bit for bit" if exact else f"rtol={rtol}, atol={atol}"
    assert not bad, f"{what}: weights differ ({rule}):\n  " + "\n  ".join(bad)


def flat_norm(state: Mapping[str, object]) -> float:
    import torch

    return math.sqrt(
        sum(float(t.double().pow(2).sum()) for t in state.values() if isinstance(t, torch.Tensor))
    )


def assert_state_similar(got: Mapping[str, object], want: Mapping[str, object], what: str) -> None:
    """For runs whose data order differs by design: same layout, finite, norm within NORM_RTOL."""
    import torch

    assert_same_layout(got, want, what)
    for k, t in got.items():
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            assert torch.isfinite(t).all(), f"{what}: {k} has non-finite values"
    n_got, n_want = flat_norm(got), flat_norm(want)
    assert abs(n_got - n_want) <= NORM_RTOL * n_want, (
        f"{what}: weight norm {n_got:.5g} vs {n_want:.5g} (more than {NORM_RTOL:.0%} apart)"
    )


# -- the original script's classes, without running the script ------------------------------------


def definitions_of(script: Path) -> types.ModuleType:
    """A module holding ``script``'s imports, classes, functions and literal constants only.

    Module-level training code is left out, so that ``Net()`` can be built from a script that
    trains as soon as it is imported.
    """
    tree = ast.parse(script.read_bytes(), str(script))

    def wanted(node: ast.stmt) -> bool:
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.ClassDef, ast.FunctionDef)):
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            try:
                ast.literal_eval(node.value)
            except ValueError:
                return False
            return True
        return False

    tree.body = [node for node in tree.body if wanted(node)]
    name = f"_e2e_defs_{script.parent.name}"
    module = types.ModuleType(name)
    module.__file__ = str(script)
    sys.modules[name] = module  # dataclasses and pickling look classes up here
    exec(compile(tree, str(script), "exec"), module.__dict__)
    return module


# -- TensorFlow / Keras weights --------------------------------------------------------------------


def load_weights(run_dir: Path, output: Output) -> dict[str, object]:
    """An output as ``{name: torch tensor}``: a torch state dict, ``np.savez`` arrays (``.npz``:
    ``{"arr_0": ..., ...}``) or every dataset of an HDF5 file (``.h5``, e.g. Keras'
    ``save_weights``: ``{"layers/dense/vars/0": ...}``, in file order)."""
    if not output.file.endswith((".npz", ".h5")):
        return load_state(run_dir, output)
    import numpy as np
    import torch

    path = run_dir / output.file
    assert path.is_file(), f"{path} was not written (files there: {sorted(files_in(run_dir, ''))})"
    if output.file.endswith(".npz"):
        with np.load(path) as arrays:
            return {k: torch.from_numpy(arrays[k].copy()) for k in arrays.files}
    import h5py

    found: dict[str, object] = {}

    def visit(name: str, node: object) -> None:
        if isinstance(node, h5py.Dataset):
            found[name] = torch.from_numpy(np.array(node[()]))

    with h5py.File(path, "r") as f:
        f.visititems(visit)
    return found
