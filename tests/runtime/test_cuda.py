"""GPU smoke test: NCCL chosen by itself, collectives on CPU and GPU tensors, a DDP step."""

from __future__ import annotations

import pytest

from ._spawn import results, spawn

pytestmark = [pytest.mark.cuda, pytest.mark.slow]


@pytest.mark.timeout(300)
def test_nccl_in_one_process(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    (out,) = results(spawn("_scenarios_cuda:nccl_smoke", 1, tmp_path, launcher=False,
                           env={"SDP_BACKEND": ""}))
    # NCCL for CUDA tensors, Gloo for CPU ones (torch's per-device backends, README "The GPU path")
    assert out["backend"] == "nccl" and out["torch_backend"] == "cpu:gloo,cuda:nccl"
    assert out["device"] == "cuda:0"
    assert out["allreduce"] == [[0.0, 1.0, 2.0, 3.0], [0.0, 2.0, 4.0, 6.0], [3, -3], [1.0, 1.0],
                                "cpu", "cuda"]
    assert all(abs(v - 0.101) < 1e-3 for v in out["fp16"])
    assert out["allgather"] == [[2, 3], "cuda"]
    assert out["objects"] == [{"a": 1}, [2]]
    assert out["ddp"] == ["cuda:0", [0]]
    assert out["stepped"] is True
    assert out["cpu_ddp"] == ["cpu", None]


@pytest.mark.timeout(300)
def test_ddp_and_torch_compile_on_the_gpu_in_both_orders(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    (out,) = results(spawn("_scenarios_cuda:compiled_ddp", 1, tmp_path, launcher=False,
                           env={"SDP_BACKEND": ""}, timeout=280))
    assert out["backend"] == "nccl"
    # inductor fuses and reorders float32 work: equal to the eager wrapper within float error
    assert out["compile then wrap"] < 1e-4 and out["wrap then compile"] < 1e-4, out
