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

    model = torch.nn.Linear(4, 1).cuda()
    ddp = sdp.DistributedDataParallel(model, compression=sdp.Compression.fp16)
    opt = sdp.DistributedOptimizer(torch.optim.SGD(ddp.parameters(), lr=0.1))
    out["ddp"] = [str(next(ddp.parameters()).device), ddp.device_ids]
    before = ddp.module.weight.detach().clone()
    ddp(torch.randn(8, 4, device="cuda")).pow(2).mean().backward()
    opt.step()
    weight = ddp.module.weight
    out["stepped"] = bool(not torch.equal(before, weight) and torch.isfinite(weight).all())
    # A script written for the CPU, run on a GPU host: the model stays where the script put it
    # (its inputs are CPU tensors) and its gradients go over Gloo.
    on_host = sdp.DistributedDataParallel(torch.nn.Linear(4, 1))
    host_opt = torch.optim.SGD(on_host.parameters(), lr=0.1)
    on_host(torch.randn(8, 4)).pow(2).mean().backward()
    host_opt.step()
    out["cpu_ddp"] = [str(next(on_host.parameters()).device), on_host.device_ids]
    sdp.shutdown()
    return out


class _Plain(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(64, 256), torch.nn.Linear(256, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def compiled_ddp() -> dict[str, Any]:
    """Issue 30 on the GPU: the runtime's DDP around ``torch.compile`` (inductor, Triton kernels)
    and ``torch.compile`` around it train as the uncompiled wrapper does, over NCCL."""
    _comm._SHORTCUT_ALONE = False
    torch.backends.cuda.matmul.allow_tf32 = False
    sdp.init()

    def train(order: str) -> list[float]:
        torch.manual_seed(0)
        model: Any = _Plain().cuda()
        if order == "compile then wrap":
            model = sdp.DistributedDataParallel(torch.compile(model))
        elif order == "wrap then compile":
            model = torch.compile(sdp.DistributedDataParallel(model))
        else:
            model = sdp.DistributedDataParallel(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(5):
            g = torch.Generator(device="cuda").manual_seed(step)
            loss = model(torch.randn(512, 64, generator=g, device="cuda")).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        return torch.cat([p.detach().flatten() for p in model.parameters()]).cpu().tolist()

    eager = torch.tensor(train("eager"))
    out: dict[str, Any] = {"backend": _comm.backend()}
    for order in ("compile then wrap", "wrap then compile"):
        got = torch.tensor(train(order))
        out[order] = float((got - eager).abs().max())
    sdp.shutdown()
    return out
