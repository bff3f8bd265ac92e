"""Converted PyTorch scripts on a real GPU: NCCL, the device pinning and the audit, for real.

CI has no GPU: these tests skip there (marker ``cuda``). On a machine with one CUDA GPU, every
PyTorch golden with an ``e2e.json`` is converted with the real ``sdp-convert`` and run twice at
batch B, as the converted script:

* ``gpu``: under ``sdp-run -n 1`` with the GPU visible and the audit on (strict): ``sdp.init()``
  must pick NCCL by itself, a script that uses CUDA must train on ``cuda:0`` (one written for the
  CPU stays on the CPU) and the launch must exit 0;
* ``cpu``: with plain ``python`` and no GPU visible.

and the tests assert where the GPU run trained (``SDP_E2E_GPU_LOG``, written by
``audit/sitecustomize.py`` as each process exits: device, memory allocated, backend) over NCCL,
and that what it saved equals the CPU run's weights within float tolerance (TF32 is turned off
with ``NVIDIA_TF32_OVERRIDE=0``, so only the order of float32 sums differs). Scripts whose GPU
run differs from their CPU run by design (dropout draws from the CUDA generator, ``autocast``
computes in float16 on the GPU only) are held to "finite and as big" (``assert_state_similar``).
Two ranks on one GPU are not possible (NCCL cannot put two ranks on one device): the 2-process
equivalence is tested on CPU processes (``test_torch_equivalence.py``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from .harness import (
    SDP_RUN,
    Spec,
    all_specs,
    assert_state_close,
    assert_state_similar,
    finish,
    load_state,
    start,
)
from .test_torch_equivalence import convert

pytestmark = [pytest.mark.cuda, pytest.mark.slow]

SPECS = [s for s in all_specs("torch") if not s.unchanged]
IDS = [s.name for s in SPECS]
#: float32 sums in another order on another device, over a few steps of tiny models.
GPU_RTOL, GPU_ATOL = 1e-3, 1e-4


def _differs_by_design(spec: Spec) -> bool:
    source = (spec.case / "input.py").read_text().lower()
    return "dropout" in source or "autocast" in source


def _gpus() -> int:
    torch = pytest.importorskip("torch")
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.fixture(scope="module")
def gpu_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Path]]:
    """Runs every case on the GPU and on the CPU, 8 cases at a time (each process mostly waits on
    the import of torch and the start of CUDA)."""
    if _gpus() < 1:
        pytest.skip("needs a CUDA GPU")
    root = tmp_path_factory.mktemp("e2e_gpu")
    done: dict[str, dict[str, Path]] = {}
    for start_at in range(0, len(SPECS), 8):
        procs = []
        for spec in SPECS[start_at:start_at + 8]:
            script = convert(spec, root / spec.case.name / "convert")
            args, env = spec.command_line(spec.batch, spec.lr)
            dirs = {}
            for name, cmd, extra in (
                ("gpu", [SDP_RUN, "-n", "1", "converted.py", *args],
                 {"CUDA_VISIBLE_DEVICES": "0", "NVIDIA_TF32_OVERRIDE": "0",
                  "SDP_E2E_GPU_LOG": str(root / spec.case.name / "gpu.jsonl")}),
                ("cpu", [sys.executable, "converted.py", *args], {}),
            ):
                run_dir = root / spec.case.name / name
                run_dir.mkdir(parents=True)
                (run_dir / "converted.py").write_bytes(script.read_bytes())
                procs.append(start(cmd, run_dir, {**env, **extra}, timeout=spec.timeout + 60))
                dirs[name] = run_dir
            done[spec.name] = dirs
        finish(*procs)
        for proc in procs:
            (proc.cwd.parent / f"{proc.cwd.name}.out").write_text(proc.output)
    return done


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_converted_script_trains_where_the_script_puts_it(spec: Spec, gpu_runs):
    """A script that uses CUDA trains on this rank's GPU over NCCL; a script written for the CPU
    (it never names CUDA) keeps its model and batches on the CPU of a GPU host, as it wrote them,
    and averages over Gloo: nothing moves its model to the GPU behind its back."""
    log = gpu_runs[spec.name]["gpu"].parent / "gpu.jsonl"
    assert log.is_file(), f"{spec.name}: the converted script never started CUDA (no set_device)"
    ranks = [json.loads(line) for line in log.read_text().splitlines()]
    trained = [r for r in ranks if r["rank"] == "0"]
    assert trained, f"{spec.name}: rank 0 never used CUDA: {ranks}"
    # NCCL for CUDA tensors, Gloo for CPU ones (torch's per-device "cpu:gloo,cuda:nccl")
    assert trained[0]["backends"] == ["cpu:gloo,cuda:nccl"], trained[0]["backends"]
    assert trained[0]["device"] == 0, trained
    if "cuda" in (spec.case / "input.py").read_text():
        assert trained[0]["max_memory_allocated"] > 0, f"{spec.name}: trained on the CPU"
    else:
        assert trained[0]["max_memory_allocated"] == 0, f"{spec.name}: moved to the GPU"
    output = (gpu_runs[spec.name]["gpu"].parent / "gpu.out").read_text()
    assert "sdp audit: " in output, f"{spec.name}: the audited GPU run printed no audit line"


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_gpu_weights_equal_cpu_weights(spec: Spec, gpu_runs):
    for out in spec.outputs:
        got = load_state(gpu_runs[spec.name]["gpu"], out)
        want = load_state(gpu_runs[spec.name]["cpu"], out)
        what = f"{spec.name} {out.file}: GPU vs CPU"
        if _differs_by_design(spec):
            assert_state_similar(got, want, what)
        else:
            assert_state_close(got, want, what, rtol=GPU_RTOL, atol=GPU_ATOL)
