"""Allreduce throughput of sdp_runtime.tensorflow on 2 processes, against raw Gloo and TF's own.

    .venv/bin/python benchmarks/bench_tf_allreduce.py            # about 2-4 minutes here
    .venv/bin/python benchmarks/bench_tf_allreduce.py --repeats 5 --no-write

Cases: one float32 gradient of 1 MiB, 25 MiB and 100 MiB, and 100 gradients of 40 KiB. For each,
the median time of one averaging allreduce after warm-up, measured on rank 0 of 2 processes:

* raw Gloo: ``torch.distributed.all_reduce`` of one preallocated flat float32 buffer of the same
  total size (the floor: no TF, no copies, no fusion);
* sdp eager / sdp tf.function: ``sdp_runtime.tensorflow.grouped_allreduce`` of the TF tensors,
  the path ``DistributedGradientTape.gradient`` takes (one fused call per dtype);
* MWMS: ``tf.distribute.MultiWorkerMirroredStrategy`` (RING, the CPU implementation), replica
  context ``all_reduce(MEAN)`` of the same tensors inside ``tf.function``;
* TF op: TensorFlow's own collective op, ``CollectiveReduceV2`` (ring, over TF's gRPC server:
  ``enable_collective_ops``), inside ``tf.function``, the tensors of a call concatenated into one
  (fused, as the sdp path fuses): what a TF-native transport for this runtime would run, without
  MWMS around it. Also tried once per run: the same op in an XLA-compiled function.

The sdp and raw cases run in one pair of processes started by ``sdp-run``; MWMS and the TF op run
in two more pairs on localhost ports, because TF's collectives must be set up before any other TF
op. Every process has a time limit and is killed past it. The table is printed and written
to benchmarks/results/tf_allreduce.md with the machine and the date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "tf_allreduce.md"
MIB = 1024 * 1024
# name -> list of gradient sizes in float32 elements
CASES = {
    "1 MiB": [MIB // 4],
    "25 MiB": [25 * MIB // 4],
    "100 MiB": [100 * MIB // 4],
    "100 x 40 KiB": [40 * 1024 // 4] * 100,
}


def _time_calls(fn: Callable[[], object], warmup: int, repeats: int) -> float:
    """Median seconds of one call, calls back to back (each call is a collective)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _repeats_for(sizes: list[int], repeats: int) -> int:
    return max(3, repeats // 2) if sum(sizes) * 4 >= 100 * MIB else repeats


# ------------------------------------------------------------------------------------------
# Workers


def worker_sdp(out: Path, warmup: int, repeats: int) -> None:
    import sdp_runtime.tensorflow as sdp
    import tensorflow as tf
    import torch
    import torch.distributed as dist

    sdp.init()
    rank = sdp.rank()
    fused = tf.function(lambda grads: sdp.grouped_allreduce(grads))
    results = {}
    for name, sizes in CASES.items():
        reps = _repeats_for(sizes, repeats)
        flat = torch.full((sum(sizes),), float(rank + 1))
        grads = [tf.fill([n], float(rank + 1)) for n in sizes]
        expected = 1.5  # mean of 1 and 2
        out_eager = sdp.grouped_allreduce(grads)
        out_fn = fused(grads)
        for reduced in (out_eager, out_fn):
            assert all(float(g[0]) == expected and float(g[-1]) == expected for g in reduced)

        def raw(flat: torch.Tensor = flat) -> None:
            dist.all_reduce(flat)
            flat.div_(2)

        def eager(grads: list = grads) -> None:
            sdp.grouped_allreduce(grads)

        def compiled(grads: list = grads) -> None:
            fused(grads)

        results[name] = {
            "raw": _time_calls(raw, warmup, reps),
            "eager": _time_calls(eager, warmup, reps),
            "function": _time_calls(compiled, warmup, reps),
        }
    if rank == 0:
        (out / "sdp.json").write_text(json.dumps(results))
    sdp.shutdown()


def worker_mwms(out: Path, warmup: int, repeats: int) -> None:
    import tensorflow as tf

    # MWMS must exist before any other TF op runs in this process.
    comm = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING,
        timeout_seconds=120,
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=comm)
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]

    @tf.function
    def reduce(grads):
        def replica(grads):
            # Identity (no copy) places the inputs on the replica's device, as gradients
            # computed in the replica are; tensors made outside have none and MWMS refuses them.
            ctx = tf.distribute.get_replica_context()
            return ctx.all_reduce(tf.distribute.ReduceOp.MEAN, [tf.identity(g) for g in grads])

        return strategy.run(replica, args=(grads,))

    results = {}
    for name, sizes in CASES.items():
        reps = _repeats_for(sizes, repeats)
        grads = [tf.fill([n], float(index + 1)) for n in sizes]
        reduced = reduce(grads)
        assert float(reduced[0][0]) == 1.5 and float(reduced[-1][-1]) == 1.5
        results[name] = {"mwms": _time_calls(lambda grads=grads: reduce(grads), warmup, reps)}
    if index == 0:
        (out / "mwms.json").write_text(json.dumps(results))


def worker_tfop(out: Path, warmup: int, repeats: int) -> None:
    import tensorflow as tf
    from tensorflow.core.protobuf import tensorflow_server_pb2
    from tensorflow.python.eager import context
    from tensorflow.python.ops import collective_ops

    config = json.loads(os.environ["TF_CONFIG"])
    index = config["task"]["index"]
    server = tensorflow_server_pb2.ServerDef(
        cluster=tf.train.ClusterSpec(config["cluster"]).as_cluster_def(),
        job_name="worker", task_index=index, protocol="grpc",
    )  # fmt: skip
    leader = "/job:worker/replica:0/task:0"
    server.default_session_config.experimental.collective_group_leader = leader
    context.context().enable_collective_ops(server)
    device = f"/job:worker/replica:0/task:{index}/device:CPU:0"

    def allreduce(flat, key: int, final: str = "Div", hint: str = "ring"):
        return collective_ops.all_reduce_v2(
            flat, group_size=2, group_key=1, instance_key=key, merge_op="Add", final_op=final,
            communication_hint=hint,
        )  # fmt: skip

    def reducer(key: int):
        # One instance key per shape: an instance of a collective has one shape on all ranks.
        @tf.function
        def reduce(grads):
            with tf.device(device):
                flat = grads[0] if len(grads) == 1 else tf.concat(grads, 0)
                flat = allreduce(flat, key)
                if len(grads) == 1:
                    return [flat]
                return tf.split(flat, [int(g.shape[0]) for g in grads])

        return reduce

    results: dict = {}
    for key, (name, sizes) in enumerate(CASES.items(), start=10):
        reduce = reducer(key)
        reps = _repeats_for(sizes, repeats)
        with tf.device(device):
            grads = [tf.fill([n], float(index + 1)) for n in sizes]
        reduced = reduce(grads)
        assert float(reduced[0][0]) == 1.5 and float(reduced[-1][-1]) == 1.5
        call = lambda grads=grads, reduce=reduce: reduce(grads)  # noqa: E731
        results[name] = {"tfop": _time_calls(call, warmup, reps)}
    # XLA lowers only the identity final op with the "auto" (NCCL) implementation.
    xla = tf.function(lambda t: allreduce(t, 2, final="Id", hint="auto"), jit_compile=True)
    try:
        with tf.device(device):
            xla(tf.ones([4]))
        results["xla"] = "compiled and ran"
    except (tf.errors.OpError, RuntimeError) as error:
        results["xla"] = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
    if index == 0:
        (out / "tfop.json").write_text(json.dumps(results))


# ------------------------------------------------------------------------------------------
# Launcher


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _wait(procs: list[subprocess.Popen], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    try:
        for proc in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{what} did not finish within {timeout:.0f} s; killed") from None
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    for proc in procs:
        if proc.returncode != 0:
            raise SystemExit(f"{what} failed with exit status {proc.returncode}")


def _env() -> dict[str, str]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS="1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TF_CONFIG"):
        env.pop(name, None)
    return env


def run_sdp(out: Path, args: argparse.Namespace) -> dict:
    cmd = [
        sys.executable, "-m", "sdp_runtime.launch", "-n", "2", __file__, "--worker", "sdp",
        "--out", str(out), "--warmup", str(args.warmup), "--repeats", str(args.repeats),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, env=_env(), start_new_session=True)
    _wait([proc], "the sdp/raw Gloo run", args.timeout)
    return json.loads((out / "sdp.json").read_text())


def run_tf_pair(out: Path, args: argparse.Namespace, worker: str, what: str) -> dict:
    """Run ``worker`` (mwms or tfop) on 2 processes that find each other through TF_CONFIG."""
    workers = [f"127.0.0.1:{port}" for port in _free_ports(2)]
    procs = []
    for index in range(2):
        config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        env = dict(_env(), TF_CONFIG=json.dumps(config))
        cmd = [
            sys.executable, __file__, "--worker", worker, "--out", str(out),
            "--warmup", str(args.warmup), "--repeats", str(args.repeats),
        ]  # fmt: skip
        procs.append(subprocess.Popen(cmd, env=env, start_new_session=True))
    _wait(procs, what, args.timeout)
    return json.loads((out / f"{worker}.json").read_text())


def _machine() -> dict[str, str]:
    import tensorflow as tf
    import torch

    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": model,
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "tensorflow": tf.__version__,
        "date": datetime.date.today().isoformat(),
        "load": " / ".join(f"{x:.1f}" for x in os.getloadavg()),
    }


def _table(results: dict) -> list[str]:
    head = (
        "| case | raw Gloo | sdp eager | sdp tf.function | MWMS | TF op | eager / raw | "
        "tf.function / raw | MWMS / sdp tf.function | TF op / sdp tf.function |"
    )
    lines = [head, "|" + "---|" * 10]
    for name, sizes in CASES.items():
        r = results[name]
        mib = sum(sizes) * 4 / MIB

        def cell(t: float, mib: float = mib) -> str:
            return f"{t * 1e3:.1f} ms ({mib / 1024 / t:.2f} GiB/s)"

        lines.append(
            f"| {name} | {cell(r['raw'])} | {cell(r['eager'])} | {cell(r['function'])} | "
            f"{cell(r['mwms'])} | {cell(r['tfop'])} | {r['eager'] / r['raw']:.2f}x | "
            f"{r['function'] / r['raw']:.2f}x | {r['mwms'] / r['function']:.2f}x | "
            f"{r['tfop'] / r['function']:.2f}x |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15, help="timed calls per case")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per case first")
    parser.add_argument("--timeout", type=float, default=400, help="seconds per process pair")
    parser.add_argument("--no-write", action="store_true", help=f"do not write {RESULTS.name}")
    parser.add_argument("--worker", choices=["sdp", "mwms", "tfop"], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker == "sdp":
        worker_sdp(args.out, args.warmup, args.repeats)
        return 0
    if args.worker == "mwms":
        worker_mwms(args.out, args.warmup, args.repeats)
        return 0
    if args.worker == "tfop":
        worker_tfop(args.out, args.warmup, args.repeats)
        return 0

    with tempfile.TemporaryDirectory() as tmp:
        results = run_sdp(Path(tmp), args)
        mwms = run_tf_pair(Path(tmp), args, "mwms", "the MultiWorkerMirroredStrategy run")
        tfop = run_tf_pair(Path(tmp), args, "tfop", "the CollectiveReduceV2 run")
    xla = tfop.pop("xla")
    for name in CASES:
        results[name].update(mwms[name], **tfop[name])
    machine = _machine()
    table = _table(results)
    print("\n".join(table))
    print(f"CollectiveReduceV2 under XLA (jit_compile=True) on the CPU: {xla}")
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(_report(machine, table, args, xla))
        print(f"written to {RESULTS.relative_to(ROOT)}")
    return 0


def _report(machine: dict[str, str], table: list[str], args: argparse.Namespace, xla: str) -> str:
    return "\n".join(
        [
            "# TF allreduce: sdp_runtime.tensorflow vs raw Gloo vs TensorFlow's own collectives",
            "",
            f"Run {machine['date']} with `.venv/bin/python benchmarks/bench_tf_allreduce.py` "
            f"(warm-up {args.warmup}, median of {args.repeats} calls; 100 MiB: "
            f"{max(3, args.repeats // 2)}).",
            "",
            f"Machine: {machine['cpu']}, {machine['cores']} cores; Python {machine['python']}, "
            f"torch {machine['torch']}, TensorFlow {machine['tensorflow']}. Two processes on this "
            "one machine, Gloo over loopback TCP; float32 averaging allreduce; time per call "
            "on rank 0 (algorithm bandwidth in brackets). Load average (1/5/15 min) at the end of "
            f"the run: {machine['load']} (the 2 cores are shared with other work; a load above "
            "about 2 means the timings include waiting for a core).",
            "",
            *table,
            "",
            "TF op in an XLA-compiled function (`jit_compile=True`, final op `Id`, "
            f"implementation `auto`): {xla}",
            "",
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
