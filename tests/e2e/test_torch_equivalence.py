"""Converted PyTorch scripts train data-parallel correctly (DESIGN.md, "Equivalence"): run them.

For every ``fixtures/torch/<case>/`` with an ``e2e.json``, ``input.py`` is converted with the real
``sdp-convert`` command (the engine when no command is installed next to this Python) and run as:

* ``original_2b``: the original, one process, batch 2B and learning rate 2*lr;
* ``converted_2p``: the converted script under ``sdp-run -n 2``, batch B and lr per process (the
  script scales the lr by ``size()`` itself);
* ``converted_1p`` / ``original_1p``: both with plain ``python``, batch B, lr;
* ``converted_1p_2b`` (shuffled cases only): the converted script, one process, batch 2B, lr 2*lr.

and the tests assert:

* 2 processes at B == 1 process at 2B (``rtol``/``atol`` in ``harness``). With shuffled data the
  converted script draws its order from DistributedSampler, not from the original's sampler, so the
  exact comparison is with ``converted_1p_2b`` (same sampler, one replica) and the comparison with
  the original only checks that the weights are finite and as big;
* 1 converted process == the original, bit for bit (shuffled: finite and as big);
* what the converted script saves loads with ``load_state_dict(strict=True)`` into the original,
  unwrapped model class (built from the original script's definitions, which are not run), and has
  the original's keys (no ``module.`` prefix);
* each file is written by one process only, rank 0, and the run leaves the same files as the
  original (``audit/sitecustomize.py`` logs who writes what);
* the converted script resumes from a checkpoint the original wrote (``resume_args``);
* two ``sdp-run --nnodes 2`` launches (two "machines") give the 2-process result.

``e2e.json`` schema (only ``batch``, ``lr`` and ``outputs`` are required)::

    {
      "batch": 16,                 # B: per-process batch of the converted run (int)
      "lr": 0.05,                  # per-process, unscaled learning rate (float)
      "args": ["--bs", "{batch}", "--lr", "{lr}"],   # script arguments; {batch} {lr} filled in
      "env": {"LR": "{lr}"},       # environment of the script; same placeholders
      "outputs": [                 # state dicts to compare, relative to the run directory
        {"file": "ckpt.pt",        #   the file torch.save wrote
         "key": "model",           #   optional: the state dict is obj[key]
         "model": "Net()"}         #   optional: builds the original model (from the script's
      ],                           #   imports, defs and literal constants) for the strict load
      "writes": ["log.json"],      # other files the script writes (rank 0 only)
      "shuffle": false,            # the training loader shuffles (see above)
      "scales_lr": true,           # the converted script multiplies the lr by size() itself;
                                   # false: the 2-process run is given 2*lr
      "unchanged": false,          # true: sdp-convert must leave the script byte for byte alone
      "resume_args": ["--epochs", "1"],  # optional: appended for a shorter original run whose
                                   # checkpoint the 2-process converted run then resumes from
      "timeout": 120               # seconds for each launch
    }

Dataset sizes must be divisible by 2B and losses averaged over the batch (see STYLE.md).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from .harness import (
    SDP_RUN,
    Proc,
    Spec,
    all_specs,
    assert_same_layout,
    assert_state_close,
    assert_state_similar,
    copy_script,
    definitions_of,
    files_in,
    finish,
    free_port,
    load_state,
    run,
    start,
    writers,
)

pytestmark = pytest.mark.slow

SPECS = all_specs("torch")
IDS = [s.name for s in SPECS]
#: The case trained by two simulated machines: small, unshuffled, one output.
MULTI_NODE_CASE = "torch/argparse_main"


@dataclass(frozen=True)
class Plan:
    """How one run is made: which script, batch and lr factors, how many processes."""

    script: str  # "input.py" or "converted.py"
    factor: int  # batch and lr are ``factor`` times the spec's
    processes: int = 1


PLANS = {
    "original_2b": Plan("input.py", 2),
    "original_1p": Plan("input.py", 1),
    "converted_1p": Plan("converted.py", 1),
    "converted_1p_2b": Plan("converted.py", 2),
    "converted_2p": Plan("converted.py", 1, processes=2),
}


@dataclass
class Run:
    dir: Path
    audit: Path
    proc: Proc
    script: str


class Runs:
    """Runs each (case, plan) once per session. All runs of a case go at once: ~6 processes that
    mostly import torch take about half the time together that they take one after another."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.done: dict[tuple[str, str], Run] = {}
        self.scripts: dict[str, Path] = {}

    def converted(self, spec: Spec) -> Path:
        if spec.name not in self.scripts:
            self.scripts[spec.name] = convert(spec, self.root / spec.case.name / "convert")
        return self.scripts[spec.name]

    def get(self, spec: Spec, name: str) -> Run:
        if (spec.name, name) not in self.done:
            names = [n for n in PLANS if spec.shuffle or n != "converted_1p_2b"]
            self._run(spec, [n for n in names if (spec.name, n) not in self.done])
        return self.done[(spec.name, name)]

    def _run(self, spec: Spec, names: list[str]) -> None:
        started = []
        for name in names:
            plan = PLANS[name]
            run_dir = self.root / spec.case.name / name
            source = spec.case / "input.py" if plan.script == "input.py" else self.converted(spec)
            copy_script(source, run_dir, plan.script)
            lr_factor = plan.factor if spec.scales_lr or plan.processes == 1 else plan.processes
            args, env = spec.command_line(spec.batch * plan.factor, spec.lr * lr_factor)
            if plan.processes == 1:
                cmd = [sys.executable, plan.script, *args]
            else:
                cmd = [SDP_RUN, "-n", str(plan.processes), plan.script, *args]
            audit = self.root / spec.case.name / f"{name}.audit"
            proc = start(cmd, run_dir, env, audit_dir=audit, timeout=spec.timeout)
            started.append((name, Run(run_dir, audit, proc, plan.script)))
        finish(*(r.proc for _, r in started))
        for name, r in started:
            self.done[(spec.name, name)] = r


def convert(spec: Spec, work: Path) -> Path:
    """Convert the case's input.py as a user does: ``sdp-convert converted.py`` (in place)."""
    script = copy_script(spec.case / "input.py", work, "converted.py")
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
    original, converted = (spec.case / "input.py").read_bytes(), script.read_bytes()
    if spec.unchanged:
        assert converted == original, f"{spec.name}: sdp-convert changed a finished script"
    else:
        assert converted != original, f"{spec.name}: sdp-convert left a training script unchanged"
    return script


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tmp_path_factory.mktemp("e2e_torch"))


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_two_processes_match_one_process_at_double_batch(spec: Spec, runs: Runs):
    two = runs.get(spec, "converted_2p")
    original = runs.get(spec, "original_2b")
    for out in spec.outputs:
        got = load_state(two.dir, out)
        what = f"{spec.name} {out.file}{f'[{out.key}]' if out.key else ''}"
        if spec.shuffle:
            same_sampler = load_state(runs.get(spec, "converted_1p_2b").dir, out)
            assert_state_close(got, same_sampler, f"{what}: 2 processes x B vs 1 process x 2B")
            assert_state_similar(got, load_state(original.dir, out), f"{what} vs the original")
        else:
            want = load_state(original.dir, out)
            assert_state_close(got, want, f"{what}: 2 processes x B vs the original at 2B, 2*lr")


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_one_converted_process_behaves_as_the_original(spec: Spec, runs: Runs):
    converted = runs.get(spec, "converted_1p")
    original = runs.get(spec, "original_1p")
    for out in spec.outputs:
        got, want = load_state(converted.dir, out), load_state(original.dir, out)
        what = f"{spec.name} {out.file}: converted vs original, one process"
        if spec.shuffle:
            assert_state_similar(got, want, what)
        else:
            assert_state_close(got, want, what, exact=True)


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_checkpoint_loads_into_the_original_model(spec: Spec, runs: Runs):
    two = runs.get(spec, "converted_2p")
    original = runs.get(spec, "original_2b")
    for out in spec.outputs:
        state = load_state(two.dir, out)
        assert not [k for k in state if k.startswith("module.")], f"{spec.name}: 'module.' prefix"
        assert_same_layout(state, load_state(original.dir, out), f"{spec.name} {out.file}")
        if out.model:
            defs = definitions_of(spec.case / "input.py")
            model = eval(out.model, defs.__dict__)  # noqa: S307 - the fixture's own expression
            model.load_state_dict(state, strict=True)


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_only_rank0_writes_files(spec: Spec, runs: Runs):
    two = runs.get(spec, "converted_2p")
    original = runs.get(spec, "original_2b")
    who = writers(two.audit)
    for path in dict.fromkeys([*(o.file for o in spec.outputs), *spec.writes]):
        assert (two.dir / path).is_file(), f"{spec.name}: {path} was not written"
        assert who.get(path) == ["0"], (
            f"{spec.name}: {path} must be written by one process, rank 0; written by ranks "
            f"{who.get(path)} (- = no RANK)"
        )
    others = {path: ranks for path, ranks in who.items() if set(ranks) != {"0"}}
    assert not others, f"{spec.name}: files written by processes other than rank 0: {others}"
    assert files_in(two.dir, two.script) == files_in(original.dir, original.script), (
        f"{spec.name}: the 2-process run left other files than the original"
    )


@pytest.mark.parametrize("spec", [s for s in SPECS if s.resume_args], ids=lambda s: s.name)
def test_converted_script_resumes_from_the_originals_checkpoint(spec: Spec, runs: Runs):
    """The original trains part of the way; the converted script, on 2 processes, finishes."""
    work = runs.root / spec.case.name / "resume"
    copy_script(spec.case / "input.py", work, "input.py")
    copy_script(runs.converted(spec), work, "converted.py")
    args, env = spec.command_line(spec.batch * 2, spec.lr * 2)
    run([sys.executable, "input.py", *args, *spec.resume_args], work, env, timeout=spec.timeout)
    args, env = spec.command_line(spec.batch, spec.lr if spec.scales_lr else spec.lr * 2)
    run([SDP_RUN, "-n", "2", "converted.py", *args], work, env, timeout=spec.timeout)
    full = runs.get(spec, "original_2b")
    for out in spec.outputs:
        assert_state_close(
            load_state(work, out), load_state(full.dir, out),
            f"{spec.name}: resumed on 2 processes vs trained through by the original",
        )


def test_two_simulated_machines_match_two_local_processes(runs: Runs):
    (spec,) = [s for s in SPECS if s.name == MULTI_NODE_CASE]
    endpoint = f"127.0.0.1:{free_port()}"
    args, env = spec.command_line(spec.batch, spec.lr)
    nodes = []
    for node_rank in (0, 1):
        node_dir = runs.root / spec.case.name / f"node{node_rank}"
        copy_script(runs.converted(spec), node_dir, "converted.py")
        cmd = [SDP_RUN, "--nnodes", "2", "--node-rank", str(node_rank),
               "--rdzv-endpoint", endpoint, "-n", "1", "converted.py", *args]
        nodes.append(start(cmd, node_dir, env, timeout=spec.timeout))
    finish(*nodes)
    local = runs.get(spec, "converted_2p")
    for out in spec.outputs:
        assert_state_close(
            load_state(nodes[0].cwd, out), load_state(local.dir, out),
            f"{spec.name}: 2 machines x 1 process vs 1 machine x 2 processes",
        )
        assert not (nodes[1].cwd / out.file).exists(), "the second machine (ranks != 0) wrote"
