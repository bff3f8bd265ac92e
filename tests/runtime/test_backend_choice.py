"""Which torch.distributed backend ``sdp.init()`` asks for: per-device on a GPU host, Gloo without.

The GPU host is simulated (``torch.cuda.is_available`` patched, ``init_process_group`` recorded):
the string given to torch is what matters, and this machine has no NCCL to run it with. The real
NCCL path runs in ``test_cuda.py`` where a GPU is present.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from sdp_runtime import _comm, _env


def placement(size: int = 1) -> _env.Placement:
    return _env.Placement(
        rank=0, size=size, local_rank=0, local_size=size, master_addr="127.0.0.1",
        master_port=29500, launcher="test", store_from_env=False,
    )


def given_backend(monkeypatch, name: str) -> str:
    seen: dict[str, object] = {}
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: seen.update(kw))
    _comm._rendezvous(name, placement(), 5.0)
    return str(seen["backend"])


def test_a_gpu_host_reduces_cpu_tensors_with_gloo_and_cuda_tensors_with_nccl(monkeypatch):
    monkeypatch.delenv("SDP_BACKEND", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    name = _comm._choose_backend(None)
    assert name == "nccl"  # sdp.backend() still says which one carries the GPU tensors
    assert given_backend(monkeypatch, name) == "cpu:gloo,cuda:nccl"


def test_a_cpu_machine_uses_gloo_alone(monkeypatch):
    monkeypatch.delenv("SDP_BACKEND", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    name = _comm._choose_backend(None)
    assert name == "gloo"
    assert given_backend(monkeypatch, name) == "gloo"


def test_gloo_asked_for_on_a_gpu_host_stays_gloo(monkeypatch):
    monkeypatch.setenv("SDP_BACKEND", "gloo")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert given_backend(monkeypatch, _comm._choose_backend(None)) == "gloo"


def test_nccl_without_a_gpu_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        _comm._choose_backend("nccl")
