"""Migrated Horovod / SMDDP / SMP scripts train data-parallel correctly on sdp_runtime: run them.

For every ``fixtures/horovod/<case>/``, ``fixtures/smddp/<case>/`` and ``fixtures/smp/<case>/``
with an ``e2e.json`` (schema:
``test_torch_equivalence``), ``input.py`` is converted as a user does (``sdp-convert``, or the
engine when no command is installed next to this Python) and the *converted* script is run twice:

* ``two``: under ``sdp-run -n 2``, batch B and learning rate lr per process;
* ``one``: with plain ``python`` (no launcher: the runtime runs as rank 0 of 1), batch 2B and
  learning rate 2*lr (lr when the script does not scale it by ``size()``: ``"scales_lr": false``).

The original cannot run here (no Horovod, no SageMaker), so the reference is the converted script
on one process, which is what the original computes on one process once its imports point at the
runtime (SMP cases set ``microbatches`` in ``SM_HP_MP_PARAMETERS``: both runs split every batch;
``test_smp_fsdp`` compares with runs that do not). The tests assert that:

* 2 processes at B give the weights of 1 process at 2B (``rtol``/``atol`` of ``harness``): the
  gradients are averaged, every rank starts from the same weights and sees its own shard;
* every output and every other file the case lists is written by one process only, rank 0, and the
  two runs leave the same files;
* the migrated script runs with neither Horovod nor SageMaker installed (both runs above).

Outputs are torch state dicts, or ``.npz`` files (``np.savez(path, *model.get_weights())``) for
TensorFlow cases, which need tensorflow installed and are skipped without it.
"""

from __future__ import annotations

import ast
import importlib.util
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from .harness import (
    SDP_RUN,
    Output,
    Proc,
    Spec,
    all_specs,
    assert_state_close,
    copy_script,
    files_in,
    finish,
    load_state,
    start,
    writers,
)

pytestmark = pytest.mark.slow

SPECS = all_specs("horovod") + all_specs("smddp") + all_specs("smp")
HAS_TF = importlib.util.find_spec("tensorflow") is not None


def _param(spec: Spec) -> object:
    tf = "import tensorflow" in (spec.case / "input.py").read_text()
    marks = [pytest.mark.tensorflow, pytest.mark.skipif(not HAS_TF, reason="needs tensorflow")]
    return pytest.param(spec, id=spec.name, marks=marks if tf else ())


PARAMS = [_param(s) for s in SPECS]


@dataclass
class Run:
    dir: Path
    audit: Path
    proc: Proc


class Runs:
    """The two runs of each case, once per session, started together."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.done: dict[str, dict[str, Run]] = {}

    def get(self, spec: Spec) -> dict[str, Run]:
        if spec.name not in self.done:
            self.done[spec.name] = self._run(spec)
        return self.done[spec.name]

    def _run(self, spec: Spec) -> dict[str, Run]:
        work = self.root / spec.case.parent.name / spec.case.name
        script = convert(spec, work / "convert")
        plans = {
            "two": ([SDP_RUN, "-n", "2"], spec.batch, spec.lr),
            "one": ([sys.executable], spec.batch * 2, spec.lr * (2 if spec.scales_lr else 1)),
        }
        runs = {}
        for name, (launcher, batch, lr) in plans.items():
            run_dir = work / name
            copy_script(script, run_dir, "train.py")
            args, env = spec.command_line(batch, lr)
            audit = work / f"{name}.audit"
            proc = start([*launcher, "train.py", *args], run_dir, env, audit_dir=audit,
                         timeout=spec.timeout)
            runs[name] = Run(run_dir, audit, proc)
        finish(*(r.proc for r in runs.values()))
        return runs


def _imported_modules(source: str) -> set[str]:
    """Every module a script imports (docstrings and comments may still name Horovod)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def convert(spec: Spec, work: Path) -> Path:
    """``sdp-convert train.py`` in place, as a user does; the migration must change the script."""
    script = copy_script(spec.case / "input.py", work, "train.py")
    cli = shutil.which("sdp-convert", path=str(Path(sys.executable).parent))
    if cli:
        done = subprocess.run(
            [cli, str(script)], capture_output=True, text=True, timeout=120, cwd=work
        )
        assert done.returncode == 0, f"sdp-convert failed ({done.returncode}):\n{done.stderr}"
    else:  # until the CLI is installed
        from sdp_convert.engine import Options
        from sdp_convert.engine import convert as convert_source

        script.write_bytes(convert_source(script.read_bytes(), Options()).output)
    converted = script.read_text()
    assert converted != (spec.case / "input.py").read_text(), f"{spec.name}: not migrated"
    imported = _imported_modules(converted)
    assert not [m for m in imported if m.split(".")[0] in ("horovod", "smdistributed")], (
        f"{spec.name}: the migrated script still imports Horovod/SMDDP: {sorted(imported)}"
    )
    return script


def load(run_dir: Path, output: Output) -> dict[str, object]:
    """A torch state dict, or a TensorFlow case's ``.npz`` weights as ``{"arr_0": tensor, ...}``."""
    if not output.file.endswith(".npz"):
        return load_state(run_dir, output)
    import numpy as np
    import torch

    path = run_dir / output.file
    assert path.is_file(), f"{path} was not written (files there: {sorted(files_in(run_dir, ''))})"
    with np.load(path) as arrays:
        return {k: torch.from_numpy(arrays[k].copy()) for k in arrays.files}


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tmp_path_factory.mktemp("e2e_migration"))


@pytest.mark.parametrize("spec", PARAMS)
def test_two_processes_match_one_process_at_double_batch(spec: Spec, runs: Runs):
    done = runs.get(spec)
    for out in spec.outputs:
        what = f"{spec.name} {out.file}{f'[{out.key}]' if out.key else ''}"
        assert_state_close(
            load(done["two"].dir, out), load(done["one"].dir, out),
            f"{what}: 2 processes x B vs 1 process x 2B",
        )


@pytest.mark.parametrize("spec", PARAMS)
def test_only_rank0_writes_files(spec: Spec, runs: Runs):
    done = runs.get(spec)
    two, one = done["two"], done["one"]
    who = writers(two.audit)
    for path in dict.fromkeys([*(o.file for o in spec.outputs), *spec.writes]):
        assert (two.dir / path).is_file(), f"{spec.name}: {path} was not written"
        assert who.get(path) == ["0"], (
            f"{spec.name}: {path} must be written by one process, rank 0; written by ranks "
            f"{who.get(path)} (- = no RANK)"
        )
    others = {path: ranks for path, ranks in who.items() if set(ranks) != {"0"}}
    assert not others, f"{spec.name}: files written by processes other than rank 0: {others}"
    assert files_in(two.dir, "train.py") == files_in(one.dir, "train.py"), (
        f"{spec.name}: 2 processes left other files than 1"
    )
