"""Converted PyTorch projects train data-parallel correctly: run them (DESIGN.md, "Equivalence").

For every ``fixtures/projects/<case>/`` with an ``e2e.json`` (the schema of
``test_torch_equivalence``; the entry point is ``main.py``; outputs are torch state dicts or, for
the TensorFlow and Keras projects, ``.npz``/``.h5`` weights), the ``input/`` tree is converted
with ``sdp-convert .`` (every module of it, as a user does) and run as:

* ``original_2b``: the original project, one process, batch 2B, lr 2*lr;
* ``converted_2p``: the converted project under ``sdp-run -n 2``, batch B, lr per process;
* ``converted_1p_2b`` (shuffled cases): the converted project, one process, batch 2B, lr 2*lr;
* ``original_1p`` / ``converted_1p``: both with plain ``python``, batch B, lr.

and the tests assert that 2 processes at B give 1 process at 2B (exactly against the converted
project's own sampler when shuffled, else against the original), that one converted process
behaves as the original, that every file is written by rank 0 only (a helper of another module
that saves included), and that a module that builds the data (sharded there for ``main.py``)
still gives a single-process importer, which never calls ``sdp.init()``, the original batches.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .harness import (
    FIXTURES,
    SDP_RUN,
    Spec,
    assert_state_close,
    assert_state_similar,
    finish,
    load_weights,
    run,
    start,
    writers,
)

#: All runs of a case start together on the first test that needs one (TensorFlow: ~5 processes
#: that import it at once).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

HAS_TF = importlib.util.find_spec("tensorflow") is not None
CASES = sorted(p for p in (FIXTURES / "projects").glob("*/") if (p / "e2e.json").is_file())
#: TensorFlow and Keras projects (``tf_*``, ``keras_*``) run only where TensorFlow is installed.
SPECS = [
    pytest.param(spec, id=spec.name, marks=pytest.mark.skipif(
        spec.case.name.startswith(("tf_", "keras_")) and not HAS_TF,
        reason="tensorflow is not installed"))
    for spec in (Spec.load(c) for c in CASES)
]
ENTRY = "main.py"



def convert_tree(case: Path, dest: Path) -> Path:
    shutil.copytree(case / "input", dest)
    done = subprocess.run(
        [sys.executable, "-m", "sdp_convert", "."], cwd=dest, capture_output=True, text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"sdp-convert failed ({done.returncode}):\n{done.stderr}"
    return dest


class ProjectRuns:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.done: dict[tuple[str, str], Path] = {}

    def get(self, spec: Spec, name: str) -> Path:
        if (spec.name, name) not in self.done:
            self._run_all(spec)
        return self.done[(spec.name, name)]

    def _run_all(self, spec: Spec) -> None:
        base = self.root / spec.case.name
        converted = convert_tree(spec.case, base / "converted")
        plans = {
            "original_2b": (spec.case / "input", 2, 1),
            "original_1p": (spec.case / "input", 1, 1),
            "converted_1p": (converted, 1, 1),
            "converted_2p": (converted, 1, 2),
        }
        if spec.shuffle:
            plans["converted_1p_2b"] = (converted, 2, 1)
        started = []
        for name, (tree, factor, processes) in plans.items():
            run_dir = base / name
            shutil.copytree(tree, run_dir)
            # A learning rate the converted project leaves to a person ("scales_lr": false) is
            # given scaled, as that person would.
            rate = factor * (processes if not spec.scales_lr else 1)
            args, env = spec.command_line(spec.batch * factor, spec.lr * rate)
            cmd = ([sys.executable, ENTRY] if processes == 1
                   else [SDP_RUN, "-n", str(processes), ENTRY]) + args
            audit = base / f"{name}.audit"
            proc = start(cmd, run_dir, env, audit_dir=audit, timeout=spec.timeout)
            started.append((name, run_dir, proc))
        finish(*(proc for _, _, proc in started))
        for name, run_dir, _ in started:
            self.done[(spec.name, name)] = run_dir


@pytest.fixture(scope="session")
def project_runs(tmp_path_factory: pytest.TempPathFactory) -> ProjectRuns:
    return ProjectRuns(tmp_path_factory.mktemp("e2e_projects"))


@pytest.mark.parametrize("spec", SPECS)
def test_two_processes_match_one_process_at_double_batch(spec: Spec, project_runs: ProjectRuns):
    two = project_runs.get(spec, "converted_2p")
    for out in spec.outputs:
        got = load_weights(two, out)
        what = f"{spec.name} {out.file}"
        original = load_weights(project_runs.get(spec, "original_2b"), out)
        if spec.shuffle:
            same_sampler = load_weights(project_runs.get(spec, "converted_1p_2b"), out)
            assert_state_close(got, same_sampler, f"{what}: 2 processes x B vs 1 process x 2B")
            assert_state_similar(got, original, f"{what} vs the original")
        else:
            assert_state_close(got, original, f"{what}: 2 processes x B vs the original at 2B")


@pytest.mark.parametrize("spec", SPECS)
def test_one_converted_process_behaves_as_the_original(spec: Spec, project_runs: ProjectRuns):
    one = project_runs.get(spec, "converted_1p")
    original = project_runs.get(spec, "original_1p")
    for out in spec.outputs:
        got, want = load_weights(one, out), load_weights(original, out)
        if spec.shuffle:
            assert_state_similar(got, want, f"{spec.name} {out.file}")
        else:
            assert_state_close(got, want, f"{spec.name} {out.file}", exact=True)


#: Imports the project's data module without ``sdp.init()`` (an evaluation script) and prints
#: the first training batch of each of two epochs.
_IMPORTER = """
import sys, torch
sys.path.insert(0, sys.argv[1])
import importlib
module = importlib.import_module(sys.argv[2])
torch.manual_seed(0)
loader = getattr(module, sys.argv[3])(4)
loader = loader[0] if isinstance(loader, tuple) else loader
for epoch in range(2):
    x, _ = next(iter(loader))
    print(x.sum().item())
"""


@pytest.mark.parametrize("case", [c for c in CASES if (c / "importer.txt").is_file()],
                         ids=lambda c: f"projects/{c.name}")
def test_a_single_process_importer_gets_the_original_batches(case: Path, tmp_path: Path):
    """``importer.txt``: the module and the function (``data get_loaders``) to import."""
    module, function = (case / "importer.txt").read_text().split()
    converted = convert_tree(case, tmp_path / "converted")
    outputs = []
    for tree in (case / "input", converted):
        proc = run([sys.executable, "-c", _IMPORTER, str(tree), module, function], tmp_path)
        outputs.append(proc.output)
    assert outputs[0] == outputs[1], f"original:\n{outputs[0]}\nconverted:\n{outputs[1]}"
    assert "sdp.is_initialized()" in (converted / f"{module.replace('.', '/')}.py").read_text()


@pytest.mark.parametrize("spec", SPECS)
def test_only_rank0_writes_files(spec: Spec, project_runs: ProjectRuns):
    two = project_runs.get(spec, "converted_2p")
    who = writers(two.parent / "converted_2p.audit")
    for path in [*(o.file for o in spec.outputs), *spec.writes]:
        assert who.get(path) == ["0"], f"{path} written by ranks {who.get(path)}"
    others = {path: ranks for path, ranks in who.items() if set(ranks) != {"0"}}
    assert not others, f"files written by processes other than rank 0: {others}"
