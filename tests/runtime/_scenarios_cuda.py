"""What the GPU smoke test runs: NCCL in one process, started without a launcher."""

from __future__ import annotations

from typing import Any

import sdp_runtime.torch as sdp
import torch
from sdp_runtime import _comm


def nccl_smoke() -> dict[str, Any]:
    _comm._SHORTCUT_ALONE = False  # run real NCCL collectives although the group has one process
    sdp.init()
    out: dict[str, Any] = {"backend": _comm.backend(), "device": str(sdp.device()),
                           "torch_backend": str(torch.distributed.get_backend())}
    on_cpu, on_gpu = torch.arange(4.0), torch.arange(4.0, device="cuda") * 2
    ints, bf16 = torch.tensor([3, -3]), torch.ones(2, dtype=torch.bfloat16, device="cuda")
    _comm.allreduce_([on_cpu, on_gpu, ints, bf16], "sum")
    out["allreduce"] = [on_cpu.tolist(), on_gpu.tolist(), ints.tolist(), bf16.float().tolist(),
                        on_cpu.device.type, on_gpu.device.type]
    compressed = torch.full((5,), 0.101)
    _comm.allreduce_([compressed], "average", compression="fp16")
    out["fp16"] = compressed.tolist()
    _comm.broadcast_([on_cpu, on_gpu, torch.tensor([True])])
    gathered = _comm.allgather(torch.ones(2, 3, device="cuda"))
    out["allgather"] = [list(gathered.shape), gathered.device.type]
    out["objects"] = [_comm.broadcast_object({"a": 1}), _comm.allgather_object(2)]
    _comm.barrier()

    model = torch.nn.Linear(4, 1)  # still on the CPU: DDP moves it to this process's GPU
    ddp = sdp.DistributedDataParallel(model, compression=sdp.Compression.fp16)
    opt = sdp.DistributedOptimizer(torch.optim.SGD(ddp.parameters(), lr=0.1))
    out["ddp"] = [str(next(ddp.parameters()).device), ddp.device_ids]
    before = ddp.module.weight.detach().clone()
    ddp(torch.randn(8, 4, device="cuda")).pow(2).mean().backward()
    opt.step()
    weight = ddp.module.weight
    out["stepped"] = bool(not torch.equal(before, weight) and torch.isfinite(weight).all())
    sdp.shutdown()
    return out
