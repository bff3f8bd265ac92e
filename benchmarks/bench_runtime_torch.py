"""sdp_runtime.torch against raw torch.distributed: allreduce, fusion, training steps/s, overhead.

    .venv/bin/python benchmarks/bench_runtime_torch.py            # full run, 2 processes, Gloo
    .venv/bin/python benchmarks/bench_runtime_torch.py --quick    # tiny sizes: a smoke test
    .venv/bin/python benchmarks/bench_runtime_torch.py [--quick] [--nproc 2] [--backend gloo|nccl]
        [--out benchmarks/results/runtime_torch.md] [--timeout SECONDS_PER_LAUNCH]

Everything runs side by side in one invocation, which starts its own worker processes. Each
launch has a hard time limit (``--timeout``, default 600 s, 150 s with ``--quick``); past it, and
in any case when it ends or the benchmark is interrupted, the launch's process group and those
of every process it started (torchrun starts each rank in a session of its own) are killed.

1. Allreduce of one float32 tensor of 1 MiB, 25 MiB and 100 MiB, op Sum and Average, in one pair
   of processes started by ``sdp-run``: raw ``torch.distributed.all_reduce`` (in place; Average
   is the Sum followed by ``div_``, as Gloo has no average) and raw out of place (``clone()``
   first), against ``sdp.allreduce_`` (in place), ``sdp.allreduce`` and ``sdp.grouped_allreduce``
   (out of place, as Horovod users call them), on the same process group. Each variant is
   warmed up, then timed N times with a barrier before each timing; the variants take turns
   within each repetition (so that a disturbance hits all of them alike), a repetition's time
   is the slowest rank's, and the table shows the median with the algorithm bandwidth
   (bytes / time). Each sdp call is compared with the raw call that does the same work.
2. Fusion: 200 tensors of 20 KiB (20 with ``--quick``), Average: ``sdp.grouped_allreduce`` (one
   fused call) against one raw ``all_reduce`` per tensor and one ``sdp.allreduce_`` per tensor;
   a raw allreduce of one preallocated flat buffer of the same total size is the floor.
3. Training steps/s on the processes: a single-process training script (an MLP of about 6.3 M
   parameters, batch 64 per process, SGD with momentum, synthetic data) converted by the real
   converter (``sdp-convert``) and run with ``sdp-run``, against the same model, batch and data
   written by hand with ``torch.distributed`` and ``torch.nn.parallel.DistributedDataParallel``
   and run with ``torchrun``. Launches alternate, and each side's median over the rounds counts.
4. World-size-1 overhead: the converted script run with plain ``python`` (one process, no
   launcher) against the original script; alternating runs, medians.

Targets, printed next to the results: sdp within 5% of raw at 25 MiB and above (every sdp
function and op); fused small tensors at least 5x faster than one raw allreduce per tensor;
converted script at least 0.97x the steps/s of hand-written DDP; world-size-1 overhead below 2%.

Every worker runs with ``OMP_NUM_THREADS=1``. With ``--backend gloo`` the GPUs are hidden from
the workers (everything runs on the CPU); with ``--backend nccl`` one process per GPU: with one
GPU only the single-process measurements mean anything (NCCL cannot put two ranks on one GPU),
and the file says so. The table is printed and written, with the machine, the date and the
command, to benchmarks/results/runtime_torch.md (``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "runtime_torch.md"
KIB = 1024
MIB = 1024 * KIB

ALLREDUCE_TOLERANCE = 1.05  # sdp time / raw time at judged sizes
FUSION_SPEEDUP = 5.0  # raw per-tensor time / fused time
TRAINING_RATIO = 0.97  # converted steps/s / native DDP steps/s
WS1_OVERHEAD = 0.02  # 1 - converted steps/s / original steps/s, one process
OPS = ("Sum", "Average")


@dataclass(frozen=True)
class Config:
    """Sizes and repetitions of one run (full or --quick)."""

    sizes: tuple[tuple[str, int, bool], ...]  # (label, float32 elements, judged against 5%)
    fusion_count: int
    fusion_numel: int
    warmup: int
    repeats: int
    repeats_large: int  # repetitions for tensors of 100 MiB and more
    width: int  # hidden width of the MLP
    batch: int
    train_warmup: int
    train_steps: int
    rounds: int  # launches of each training script


FULL = Config(
    sizes=(("1 MiB", MIB // 4, False), ("25 MiB", 25 * MIB // 4, True),
           ("100 MiB", 100 * MIB // 4, True)),
    fusion_count=200, fusion_numel=20 * KIB // 4,
    warmup=3, repeats=25, repeats_large=15,
    width=2048, batch=64, train_warmup=5, train_steps=40, rounds=3,
)  # fmt: skip
QUICK = Config(
    sizes=(("64 KiB", 64 * KIB // 4, False), ("256 KiB", 256 * KIB // 4, True),
           ("1 MiB", MIB // 4, True)),
    fusion_count=20, fusion_numel=20 * KIB // 4,
    warmup=1, repeats=3, repeats_large=3,
    width=256, batch=32, train_warmup=2, train_steps=5, rounds=1,
)  # fmt: skip


def config(quick: bool) -> Config:
    return QUICK if quick else FULL


def row_names(quick: bool) -> list[str]:
    """The first cell of every result row the report holds (the smoke test checks them)."""
    cfg = config(quick)
    rows = [f"allreduce {label} {op}" for label, _, _ in cfg.sizes for op in OPS]
    rows.append(f"fusion {cfg.fusion_count} x {cfg.fusion_numel * 4 // KIB} KiB Average")
    rows += ["training, converted (sdp-run)", "training, native DDP (torchrun)",
             "1 process, original script", "1 process, converted script (python)"]
    return rows


# ------------------------------------------------------------------------------------------
# Training scripts (written to a temporary folder; the converted one is made by sdp-convert)

ORIGINAL = '''\
"""Train an MLP classifier on synthetic data and report training steps per second."""
import json
import os
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

WIDTH = int(os.environ.get("BENCH_WIDTH", "2048"))
BATCH = int(os.environ.get("BENCH_BATCH", "64"))
WARMUP = int(os.environ.get("BENCH_WARMUP", "5"))
STEPS = int(os.environ.get("BENCH_STEPS", "40"))
RESULT = os.environ.get("BENCH_RESULT", "result.json")


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    inputs = torch.randn(BATCH * 16, 1024)
    labels = torch.randint(0, 10, (BATCH * 16,))
    loader = DataLoader(TensorDataset(inputs, labels), batch_size=BATCH, shuffle=True)
    model = nn.Sequential(
        nn.Linear(1024, WIDTH), nn.ReLU(),
        nn.Linear(WIDTH, WIDTH), nn.ReLU(),
        nn.Linear(WIDTH, 10),
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    model.train()
    step, start = 0, 0.0
    while step < WARMUP + STEPS:
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            step += 1
            if step == WARMUP:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
            if step == WARMUP + STEPS:
                break
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    params = sum(p.numel() for p in model.parameters())
    with open(RESULT, "w") as f:
        json.dump({"steps_per_s": STEPS / elapsed, "params": params, "loss": loss.item()}, f)


if __name__ == "__main__":
    main()
'''

NATIVE = '''\
"""The same training, written by hand with torch.distributed and DistributedDataParallel."""
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

WIDTH = int(os.environ.get("BENCH_WIDTH", "2048"))
BATCH = int(os.environ.get("BENCH_BATCH", "64"))
WARMUP = int(os.environ.get("BENCH_WARMUP", "5"))
STEPS = int(os.environ.get("BENCH_STEPS", "40"))
RESULT = os.environ.get("BENCH_RESULT", "result.json")


def main():
    backend = os.environ.get("BENCH_BACKEND", "gloo")
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    torch.manual_seed(0)
    inputs = torch.randn(BATCH * 16, 1024)
    labels = torch.randint(0, 10, (BATCH * 16,))
    dataset = TensorDataset(inputs, labels)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True)
    loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler)
    model = nn.Sequential(
        nn.Linear(1024, WIDTH), nn.ReLU(),
        nn.Linear(WIDTH, WIDTH), nn.ReLU(),
        nn.Linear(WIDTH, 10),
    ).to(device)
    model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * world, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    model.train()
    step, start = 0, 0.0
    while step < WARMUP + STEPS:
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            step += 1
            if step == WARMUP:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
            if step == WARMUP + STEPS:
                break
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    params = sum(p.numel() for p in model.parameters())
    if rank == 0:
        with open(RESULT, "w") as f:
            json.dump({"steps_per_s": STEPS / elapsed, "params": params, "loss": loss.item()}, f)
    # Leave together: a rank that destroys Gloo while its peer still finishes the last
    # collective can make that peer abort at exit ("terminate called without an active
    # exception"); a barrier alone does not prevent it, a count in the launcher's store does.
    dist.barrier()
    store = dist.distributed_c10d._get_default_store()
    store.add("bench/left", 1)
    deadline = time.monotonic() + 10
    while store.add("bench/left", 0) < world and time.monotonic() < deadline:
        time.sleep(0.01)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''


# ------------------------------------------------------------------------------------------
# Worker: allreduce and fusion, on the processes sdp-run starts


def _measure(variants: dict[str, Callable[[], object]], warmup: int, repeats: int,
             sync: Callable[[], None], barrier: Callable[[], None]) -> dict[str, list[float]]:
    """Seconds of each call of each variant, ``repeats`` times, variants taking turns."""
    for fn in variants.values():
        for _ in range(warmup):
            fn()
        sync()
    names = list(variants)
    times: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(repeats):
        shift = rep % len(names)  # rotate the order, the same on every rank
        for name in names[shift:] + names[:shift]:
            barrier()
            start = time.perf_counter()
            variants[name]()
            sync()
            times[name].append(time.perf_counter() - start)
    return times


def worker_comm(out: Path, quick: bool) -> None:
    import sdp_runtime.torch as sdp
    import torch
    import torch.distributed as dist

    cfg = config(quick)
    sdp.init()
    rank, n, dev = sdp.rank(), sdp.size(), sdp.device()
    ops = {"Sum": sdp.Sum, "Average": sdp.Average}

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def barrier() -> None:
        if n > 1:
            sdp.barrier()
        sync()

    # Correctness first: every function gives the right answer with the values 1..n.
    mine = torch.full((1000,), float(rank + 1), device=dev)
    total = n * (n + 1) / 2
    for op, expected in (("Sum", total), ("Average", total / n)):
        for got in (sdp.allreduce(mine, op=ops[op]), sdp.grouped_allreduce([mine], op=ops[op])[0],
                    sdp.allreduce_(mine.clone(), op=ops[op])):
            assert torch.all(got == expected), (op, got[:4], expected)

    timings: dict[str, dict[str, list[float]]] = {}
    for label, numel, _ in cfg.sizes:
        repeats = cfg.repeats_large if numel * 4 >= 100 * MIB else cfg.repeats
        # zeros: repeated in-place sums stay finite
        t = torch.zeros(numel, dtype=torch.float32, device=dev)
        for op_name, op in ops.items():
            avg = op_name == "Average"

            def raw(t: torch.Tensor = t, avg: bool = avg) -> None:
                dist.all_reduce(t)
                if avg:
                    t.div_(n)

            def raw_out(t: torch.Tensor = t, avg: bool = avg) -> torch.Tensor:
                o = t.clone()
                dist.all_reduce(o)
                if avg:
                    o.div_(n)
                return o

            variants = {
                "raw": raw,
                "sdp.allreduce_": lambda t=t, op=op: sdp.allreduce_(t, op=op),
                "raw clone": raw_out,
                "sdp.allreduce": lambda t=t, op=op: sdp.allreduce(t, op=op),
                "sdp.grouped_allreduce": lambda t=t, op=op: sdp.grouped_allreduce([t], op=op),
            }
            timings[f"allreduce {label} {op_name}"] = _measure(
                variants, cfg.warmup, repeats, sync, barrier)
        del t

    small = [torch.zeros(cfg.fusion_numel, device=dev) for _ in range(cfg.fusion_count)]
    flat = torch.zeros(cfg.fusion_numel * cfg.fusion_count, device=dev)

    def raw_each() -> None:
        for x in small:
            dist.all_reduce(x)
            x.div_(n)

    def raw_flat() -> None:
        dist.all_reduce(flat)
        flat.div_(n)

    fusion = {
        "raw, one per tensor": raw_each,
        "sdp.allreduce_, one per tensor": lambda: [sdp.allreduce_(x, op=sdp.Average)
                                                   for x in small],
        "sdp.grouped_allreduce (fused)": lambda: sdp.grouped_allreduce(small, op=sdp.Average),
        "raw, one flat buffer (floor)": raw_flat,
    }
    name = f"fusion {cfg.fusion_count} x {cfg.fusion_numel * 4 // KIB} KiB Average"
    timings[name] = _measure(fusion, cfg.warmup, cfg.repeats, sync, barrier)

    everyone = sdp.allgather_object(timings)
    if rank == 0:
        # A repetition lasts until the slowest rank is done; report the median repetition.
        result = {
            case: {
                variant: statistics.median(
                    max(ranks[case][variant][i] for ranks in everyone)
                    for i in range(len(per_rank))
                )
                for variant, per_rank in variants_.items()
            }
            for case, variants_ in timings.items()
        }
        # What the ranks really ran on, for the parent to check against what it asked for.
        info = {"world": n, "backend": str(dist.get_backend()).lower(), "device": str(dev),
                "torch": torch.__version__}
        if dev.type == "cuda":
            info["gpus"] = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(dev)}"
        (out / "comm.json").write_text(json.dumps({"timings": result, "info": info}))
    sdp.shutdown()


# ------------------------------------------------------------------------------------------
# Launching


def _clean_env(backend: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment minus any launcher's variables, one thread, this repo's runtime."""
    drop = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "GROUP_RANK", "ROLE_RANK", "SDP_RUN_PREFIXED", "MPI_LOCALRANKID"}
    prefixes = ("SLURM_", "OMPI_", "PMI_", "SM_", "TORCHELASTIC_")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(prefixes)}
    paths = [str(ROOT / "runtime"), str(ROOT / "rewriter")]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env.update({
        "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "SDP_BACKEND": backend,
        "BENCH_BACKEND": backend, "SDP_TIMEOUT": "120", "PYTHONPATH": os.pathsep.join(paths),
    })  # fmt: skip
    if backend == "gloo":
        env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU path, also on a machine with GPUs
    env.update(extra or {})
    return env


def _descendants(pid: int) -> list[int]:
    """Every live process below ``pid``, from /proc (Linux; elsewhere none are found)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _stop(proc: subprocess.Popen) -> None:
    """SIGKILL the launch's process group and the groups of everything it started.

    torchrun starts each rank in a session of its own, so killing the launcher's group alone
    would leave the ranks running; they are found (before anything dies) through /proc.
    """
    groups = {proc.pid}
    for pid in _descendants(proc.pid):
        with contextlib.suppress(OSError):
            groups.add(os.getpgid(pid))
    groups.discard(os.getpgrp())  # never this benchmark's own group
    for group in groups:
        with contextlib.suppress(OSError):
            os.killpg(group, signal.SIGKILL)


def _run(cmd: list[str], env: dict[str, str], timeout: float, what: str,
         cwd: Path | None = None) -> str:
    """Run ``cmd`` in a new session; past ``timeout`` s, and in any case afterwards, kill it all.

    Returns the output (stdout and stderr together); a failure or a timeout ends the benchmark
    with the end of that output.
    """
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(proc)
        output, _ = proc.communicate()
        sys.stdout.write(output[-4000:])
        raise SystemExit(f"{what} did not finish within {timeout:.0f} s; killed") from None
    finally:
        _stop(proc)  # ranks a launcher left behind; also when this benchmark is interrupted
    if proc.returncode != 0:
        sys.stdout.write(output[-4000:])
        raise SystemExit(f"{what} failed with exit status {proc.returncode}")
    print(f"  {what}: {time.monotonic() - start:.1f} s", flush=True)
    return output


def _command_of(script: str, module: str) -> list[str]:
    """The console script beside this Python, else the module it runs (repo on PYTHONPATH)."""
    cli = Path(sys.executable).with_name(script)
    return [str(cli)] if cli.exists() else [sys.executable, "-m", module]


def _sdp_run(nproc: int) -> list[str]:
    return [*_command_of("sdp-run", "sdp_runtime.launch"), "-n", str(nproc)]


def _torchrun(nproc: int) -> list[str]:
    return [*_command_of("torchrun", "torch.distributed.run"), "--standalone",
            "--nproc-per-node", str(nproc)]


def _convert(src: Path, dst: Path, env: dict[str, str], timeout: float) -> str:
    cmd = _command_of("sdp-convert", "sdp_convert.cli")
    _run([*cmd, "-q", "-o", str(dst), str(src)], env, timeout, "sdp-convert")
    text = dst.read_text()
    for needed in ("sdp.init()", "sdp.DistributedDataParallel(", "DistributedSampler("):
        if needed not in text:
            raise SystemExit(f"sdp-convert's output lacks {needed}:\n{text}")
    return text


def run_comm(tmp: Path, args: argparse.Namespace, nproc: int) -> dict:
    cmd = [*_sdp_run(nproc), str(Path(__file__).resolve()), "--worker", "comm", "--tmp", str(tmp)]
    if args.quick:
        cmd.append("--quick")
    _run(cmd, _clean_env(args.backend), args.timeout, "allreduce and fusion (sdp-run)")
    comm = json.loads((tmp / "comm.json").read_text())
    info = comm["info"]
    if (info["backend"], info["world"]) != (args.backend, nproc):
        raise SystemExit(f"the workers ran {info['backend']} on {info['world']} process(es), "
                         f"not {args.backend} on {nproc}: {info}")
    return comm


def run_training(tmp: Path, args: argparse.Namespace,
                 nproc: int) -> tuple[dict[str, list[float]], int]:
    """Steps/s of each launch (converted vs native on nproc, original vs converted on one
    process) and the model's number of parameters."""
    cfg = config(args.quick)
    original, native, converted = tmp / "original.py", tmp / "native.py", tmp / "converted.py"
    original.write_text(ORIGINAL)
    native.write_text(NATIVE)
    _convert(original, converted, _clean_env(args.backend), args.timeout)
    result = tmp / "result.json"
    base = {"BENCH_WIDTH": str(cfg.width), "BENCH_BATCH": str(cfg.batch),
            "BENCH_WARMUP": str(cfg.train_warmup), "BENCH_STEPS": str(cfg.train_steps),
            "BENCH_RESULT": str(result)}
    env = _clean_env(args.backend, base)
    runs = {
        "training, converted (sdp-run)": [*_sdp_run(nproc), str(converted)],
        "training, native DDP (torchrun)": [*_torchrun(nproc), str(native)],
        "1 process, original script": [sys.executable, str(original)],
        "1 process, converted script (python)": [sys.executable, str(converted)],
    }
    pairs = [list(runs)[:2], list(runs)[2:]]
    out: dict[str, list[float]] = {name: [] for name in runs}
    params = 0
    for r in range(cfg.rounds):
        for pair in pairs:
            for name in pair if r % 2 == 0 else pair[::-1]:  # alternate who goes first
                result.unlink(missing_ok=True)
                _run(runs[name], env, args.timeout, name, cwd=tmp)
                data = json.loads(result.read_text())
                out[name].append(data["steps_per_s"])
                params = data["params"]
    return out, params


# ------------------------------------------------------------------------------------------
# Report


def _machine(workers: dict[str, str]) -> dict[str, str]:
    """This machine, with the backend, torch and GPUs the allreduce workers reported."""
    cpu, ram = platform.processor() or platform.machine(), "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    info = {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "ram": ram,
        "python": platform.python_version(),
        "torch": workers["torch"],
        "backend": workers["backend"],
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
    }
    if "gpus" in workers:
        info["gpus"] = workers["gpus"]
    return info


def _load() -> str:
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "?"


def _command(argv: list[str]) -> str:
    def rel(p: str) -> str:
        path = Path(p)
        with contextlib.suppress(ValueError):
            return str(path.relative_to(ROOT)) if path.is_absolute() else p
        return p

    return shlex.join([rel(sys.executable), rel(str(Path(__file__).resolve())), *argv])


def _ms(t: float) -> str:
    return f"{t * 1e3:.2f} ms" if t < 0.01 else f"{t * 1e3:.1f} ms"


def _cell(t: float, nbytes: int) -> str:
    return f"{_ms(t)} ({nbytes / t / 1e9:.2f} GB/s)"


@dataclass
class Target:
    name: str
    value: str
    goal: str
    verdict: str  # PASS, MISS or n/a
    margin: str


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "MISS")


def build_report(comm: dict, train: dict[str, list[float]], params: int, cfg: Config,
                 nproc: int) -> tuple[list[str], list[Target]]:
    """The result tables (markdown lines) and the targets."""
    timings = comm["timings"]
    lines = [
        "### Allreduce, one float32 tensor (median time of the slowest rank; algorithm bandwidth)",
        "",
        "| case | raw in place | sdp.allreduce_ | raw clone + all_reduce | sdp.allreduce | "
        "sdp.grouped_allreduce | allreduce_ / raw | allreduce / raw clone | "
        "grouped / raw clone |",
        "|" + "---|" * 9,
    ]
    worst = (0.0, "")
    for label, numel, judged in cfg.sizes:
        for op in OPS:
            case = f"allreduce {label} {op}"
            r = timings[case]
            nbytes = numel * 4
            ratios = [r["sdp.allreduce_"] / r["raw"], r["sdp.allreduce"] / r["raw clone"],
                      r["sdp.grouped_allreduce"] / r["raw clone"]]
            if judged:
                for ratio, fn in zip(ratios, ("allreduce_", "allreduce", "grouped_allreduce"),
                                     strict=True):
                    if ratio > worst[0]:
                        worst = (ratio, f"sdp.{fn}, {label} {op}")
            cells = [_cell(r[v], nbytes) for v in ("raw", "sdp.allreduce_", "raw clone",
                                                     "sdp.allreduce", "sdp.grouped_allreduce")]
            lines.append(f"| {case} | " + " | ".join(cells) + " | "
                         + " | ".join(f"{x:.3f}x" for x in ratios) + " |")
    fusion_case = next(c for c in timings if c.startswith("fusion"))
    f = timings[fusion_case]
    fused = f["sdp.grouped_allreduce (fused)"]
    speedup = f["raw, one per tensor"] / fused
    fusion_bytes = cfg.fusion_count * cfg.fusion_numel * 4
    lines += [
        "",
        f"### Fusion: {cfg.fusion_count} tensors of {cfg.fusion_numel * 4 // KIB} KiB, Average",
        "",
        "| case | raw, one per tensor | sdp.allreduce_, one per tensor | "
        "sdp.grouped_allreduce (fused) | raw, one flat buffer (floor) | "
        "fused speed-up over raw per tensor |",
        "|" + "---|" * 6,
        f"| {fusion_case} | "
        + " | ".join(_cell(f[v], fusion_bytes) for v in (
            "raw, one per tensor", "sdp.allreduce_, one per tensor",
            "sdp.grouped_allreduce (fused)", "raw, one flat buffer (floor)"))
        + f" | {speedup:.1f}x |",
    ]
    med = {k: statistics.median(v) for k, v in train.items()}
    conv, nat = med["training, converted (sdp-run)"], med["training, native DDP (torchrun)"]
    orig, conv1 = med["1 process, original script"], med["1 process, converted script (python)"]
    lines += [
        "",
        f"### Training: MLP of {params / 1e6:.2f} M parameters, batch {cfg.batch} per process, "
        f"{cfg.train_steps} timed steps after {cfg.train_warmup} warm-up steps, "
        f"{cfg.rounds} launch(es) each (median)",
        "",
        "| case | processes | steps/s (median) | every launch | ratio |",
        "|---|---|---|---|---|",
    ]
    for name, procs, ratio in (
        ("training, native DDP (torchrun)", nproc, ""),
        ("training, converted (sdp-run)", nproc, f"{conv / nat:.3f}x of native"),
        ("1 process, original script", 1, ""),
        ("1 process, converted script (python)", 1, f"{conv1 / orig:.3f}x of original"),
    ):
        every = ", ".join(f"{x:.2f}" for x in train[name])
        lines.append(f"| {name} | {procs} | {med[name]:.2f} | {every} | {ratio} |")

    multi = nproc > 1
    overhead = 1 - conv1 / orig
    targets = [
        Target("sdp within 5% of raw at the judged sizes (worst case)",
               f"{worst[0]:.3f}x ({worst[1]})", f"<= {ALLREDUCE_TOLERANCE:.2f}x",
               _verdict(worst[0] <= ALLREDUCE_TOLERANCE if multi else None),
               f"{(ALLREDUCE_TOLERANCE - worst[0]) * 100:+.1f} points"),
        Target("fused small tensors vs one raw allreduce per tensor", f"{speedup:.1f}x faster",
               f">= {FUSION_SPEEDUP:.0f}x", _verdict(speedup >= FUSION_SPEEDUP if multi else None),
               f"{speedup - FUSION_SPEEDUP:+.1f}x"),
        Target("converted script vs hand-written DDP, steps/s", f"{conv / nat:.3f}x",
               f">= {TRAINING_RATIO:.2f}x", _verdict(conv / nat >= TRAINING_RATIO),
               f"{(conv / nat - TRAINING_RATIO) * 100:+.1f} points"),
        Target("world-size-1 overhead (converted with python vs original)",
               f"{overhead * 100:.1f}%", f"< {WS1_OVERHEAD * 100:.0f}%",
               _verdict(overhead < WS1_OVERHEAD),
               f"{(WS1_OVERHEAD - overhead) * 100:+.1f} points"),
    ]
    return lines, targets


def _targets_table(targets: list[Target]) -> list[str]:
    lines = ["| target | measured | goal | verdict | margin |", "|---|---|---|---|---|"]
    lines += [f"| {t.name} | {t.value} | {t.goal} | {t.verdict} | {t.margin} |" for t in targets]
    return lines


def write_report(path: Path, machine: dict[str, str], command: str, cfg: Config, nproc: int,
                 requested: int, lines: list[str], targets: list[Target], wall_s: float,
                 quick: bool) -> None:
    notes = []
    if nproc < requested:
        notes.append(
            f"**Only {nproc} process(es):** {requested} were asked for, but NCCL needs one GPU "
            f"per process and only {nproc} GPU(s) are visible (NCCL cannot put two ranks on one "
            "GPU). With one process sdp's collectives return at once (nothing to reduce) while "
            "raw NCCL still runs a one-rank collective, so the allreduce and fusion rows only "
            "show that shortcut and their targets are not judged (n/a); the training rows "
            "compare the converted script and hand-written DDP on one process.")
    if quick:
        notes.append("**--quick:** tiny sizes and few repetitions, a smoke test; the numbers "
                     "below judge nothing. The allreduce target is applied to the two largest "
                     "quick sizes.")
    over = ", Gloo over loopback TCP" if machine["backend"] == "gloo" else ""
    head = [
        "# sdp_runtime.torch vs raw torch.distributed",
        "",
        f"Command: `{command}`",
        "",
        f"Run {machine['date']}; wall time {wall_s:.0f} s.",
        "",
        "| machine | |",
        "|---|---|",
        f"| CPU | {machine['cpu']} |",
        f"| cores | {machine['cores']} |",
        f"| RAM | {machine['ram']} |",
        f"| load | {machine.get('load', '?')} |",
        *([f"| GPUs | {machine['gpus']} |"] if "gpus" in machine else []),
        f"| Python | {machine['python']} |",
        f"| torch | {machine['torch']} |",
        f"| backend | {machine['backend']} |",
        f"| processes | {nproc} on this one machine{over} |",
        "",
        f"Allreduce: warm-up {cfg.warmup}, median of {cfg.repeats} timed calls "
        f"({cfg.repeats_large} at 100 MiB and above), a barrier before each, variants taking "
        "turns; a call's time is the slowest rank's. Average on raw Gloo is all_reduce(SUM) + "
        "div_. Ratios compare each sdp call with the raw call that does the same work: in place "
        "with raw in place, out of place with raw clone() + all_reduce. GB/s = 10^9 bytes per "
        "second of the tensor's size (algorithm bandwidth). Every worker runs with "
        "OMP_NUM_THREADS=1.",
        "",
        *[n + "\n" for n in notes],
        "## Targets",
        "",
        *_targets_table(targets),
        "",
        "## Results",
        "",
        *lines,
        "",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(head))


def _nproc_for(backend: str, requested: int) -> int:
    if backend != "nccl":
        return requested
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("--backend nccl needs CUDA GPUs, and none is visible")
    return min(requested, torch.cuda.device_count())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    parser.add_argument("--nproc", type=int, default=2, help="processes (default 2)")
    parser.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the markdown result file")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds per launch before its process group is killed "
                        "(default 600, --quick 150)")
    parser.add_argument("--worker", choices=["comm"], help=argparse.SUPPRESS)
    parser.add_argument("--tmp", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker == "comm":
        worker_comm(args.tmp, args.quick)
        return 0
    if args.nproc < 1:
        parser.error("--nproc must be at least 1")
    args.timeout = args.timeout or (150 if args.quick else 600)
    # A SIGTERM (a test's time limit, a CI cancel) ends the benchmark through _run's cleanup.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    start = time.monotonic()
    load_before = _load()
    cfg = config(args.quick)
    nproc = _nproc_for(args.backend, args.nproc)
    with tempfile.TemporaryDirectory(prefix="bench-runtime-torch-") as tmp:
        print(f"allreduce and fusion on {nproc} process(es) ({args.backend}) ...", flush=True)
        comm = run_comm(Path(tmp), args, nproc)
        print("training runs ...", flush=True)
        train, params = run_training(Path(tmp), args, nproc)
    wall = time.monotonic() - start
    lines, targets = build_report(comm, train, params, cfg, nproc)
    table = [*lines, "", "### Targets", "", *_targets_table(targets)]
    print("\n".join(table))
    machine = _machine(comm["info"])
    machine["load"] = f"{load_before} before, {_load()} after (1-minute load average)"
    write_report(args.out, machine, _command(argv), cfg, nproc, args.nproc,
                 lines, targets, wall, args.quick)
    print(f"wall time {wall:.0f} s; written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
