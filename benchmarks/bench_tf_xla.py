"""Keras ``fit`` on 2 processes with XLA requested: the split step against XLA turned off.

    .venv/bin/python benchmarks/bench_tf_xla.py            # about 3-4 minutes here
    .venv/bin/python benchmarks/bench_tf_xla.py --steps 20 --no-write

With ``compile(jit_compile=True)`` on several processes the runtime either splits the training
step (forward/backward and the update compiled by XLA, the gradient allreduce between them:
what ``sdp_runtime.tensorflow.keras.prepare_train_function`` does for Keras' own ``train_step``) or
runs the step without XLA (what it does for a ``train_step`` of the user's). This measures both,
in the same pair of processes started by ``sdp-run``, and, as the reference for what XLA is worth
on this machine, one process with and without XLA (no communication at all).

Models: an MLP (512 -> 3 x Dense(1024, relu) -> 10, 3.7 M parameters, batch 128 per process) and
a small CNN (32x32x3 -> 2 x Conv(32/64, 3x3) + pooling -> Dense(128) -> 10, batch 64 per
process). Per case: the median time of one step over ``--steps`` steps, after ``--warmup`` steps
(compilation) that are not timed; ``model.fit`` with ``steps_per_epoch=1`` so that a callback
can time every step; the modes of a model take turns (``--rounds``), so that a shared machine's
load falls on each alike. "XLA split" on one process is the split step built directly (the
runtime only splits on several processes): its ratio to "XLA" is what splitting itself costs.
Every process has a time limit and is killed past it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "tf_xla.md"
MODES = ("off", "split")


def _models():
    import keras

    def mlp() -> keras.Model:
        return keras.Sequential(
            [keras.Input((512,))]
            + [keras.layers.Dense(1024, activation="relu") for _ in range(3)]
            + [keras.layers.Dense(10)]
        )

    def cnn() -> keras.Model:
        return keras.Sequential(
            [
                keras.Input((32, 32, 3)),
                keras.layers.Conv2D(32, 3, activation="relu"),
                keras.layers.MaxPooling2D(),
                keras.layers.Conv2D(64, 3, activation="relu"),
                keras.layers.MaxPooling2D(),
                keras.layers.Flatten(),
                keras.layers.Dense(128, activation="relu"),
                keras.layers.Dense(10),
            ]
        )

    return {"MLP 3.7M, batch 128": (mlp, (512,), 128), "CNN, batch 64": (cnn, (32, 32, 3), 64)}


class _Clock:
    """Times every training step of a model's ``fit`` (one step per epoch)."""

    def __init__(self) -> None:
        import keras

        times: list[float] = []
        self.times = times

        class Clock(keras.callbacks.Callback):
            def on_train_batch_begin(self, batch, logs=None):
                self.start = time.perf_counter()

            def on_train_batch_end(self, batch, logs=None):
                float(logs["loss"])  # wait for the step
                times.append(time.perf_counter() - self.start)

        self.callback = Clock()


def worker(out: Path, warmup: int, steps: int, rounds: int) -> None:
    import keras
    import numpy as np
    import sdp_runtime.tensorflow.keras as sdp
    import sdp_runtime.tensorflow.keras.xla as xla_module
    import tensorflow as tf

    warnings.simplefilter("ignore", sdp.XlaWarning)
    # One core per process (2 processes share the 2 cores here); XLA's CPU code uses this pool.
    tf.config.threading.set_intra_op_parallelism_threads(1)
    sdp.init()
    modes = MODES if sdp.size() > 1 else ("no XLA", "XLA", "XLA split")
    results: dict[str, dict[str, float]] = {}
    for name, (build, shape, batch) in _models().items():
        rng = np.random.default_rng(0)
        x = rng.normal(size=(batch, *shape)).astype("float32")
        y = rng.integers(0, 10, size=(batch,))
        models, clocks = {}, {}
        for mode in modes:
            keras.utils.set_random_seed(0)
            model = build()
            model.compile(
                optimizer=sdp.DistributedOptimizer(keras.optimizers.Adam(1e-3)),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                jit_compile=mode in ("split", "XLA", "XLA split"),
            )
            if mode == "XLA split":  # what the runtime does on several processes, on one
                xla_module._rebuild(model, xla_module.SplitTrainStep(model))
            models[mode], clocks[mode] = model, _Clock()
        # The modes take turns, ``steps / rounds`` steps at a time, so that the load of a shared
        # machine falls on all of them alike; the first ``warmup`` steps of each (compiling) are
        # not counted.
        chunks = [warmup] + [max(1, steps // rounds)] * rounds
        for i, chunk in enumerate(chunks):
            for mode in modes:
                models[mode].fit(
                    x, y, batch_size=batch, epochs=chunk, steps_per_epoch=1, verbose=0,
                    callbacks=[sdp.callbacks.BroadcastGlobalVariablesCallback(0),
                               clocks[mode].callback],
                )  # fmt: skip
                if i == 0:
                    clocks[mode].times.clear()
        results[name] = {mode: statistics.median(clocks[mode].times) for mode in modes}
        if sdp.size() > 1:
            split = models["split"]
            assert getattr(split, "_sdp_xla_train_function", None) is split.train_function
    if sdp.rank() == 0:
        (out / f"size{sdp.size()}.json").write_text(json.dumps(results))
    sdp.shutdown()


def _launch(out: Path, nproc: int, args: argparse.Namespace) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    cmd = [
        sys.executable, "-m", "sdp_runtime.launch", "-n", str(nproc), __file__, "--worker",
        "--out", str(out), "--warmup", str(args.warmup), "--steps", str(args.steps),
        "--rounds", str(args.rounds),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        proc.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{nproc} process(es) did not finish in {args.timeout:.0f} s") from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc.returncode != 0:
        raise SystemExit(f"the run on {nproc} process(es) failed ({proc.returncode})")
    return json.loads((out / f"size{nproc}.json").read_text())


def _machine() -> str:
    import tensorflow as tf

    model = platform.machine()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return (
        f"{model}, {os.cpu_count()} cores; Python {platform.python_version()}, "
        f"TensorFlow {tf.__version__}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="timed steps per case")
    parser.add_argument("--rounds", type=int, default=5, help="turns the modes take")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--timeout", type=float, default=500, help="seconds per launch")
    parser.add_argument("--no-write", action="store_true", help=f"do not write {RESULTS.name}")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.out, args.warmup, args.steps, args.rounds)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        two = _launch(Path(tmp), 2, args)
        one = _launch(Path(tmp), 1, args)
    lines = [
        "| model | 1 process: no XLA | XLA | XLA split | XLA / no XLA | split / XLA | "
        "2 processes: XLA off | split | split / off |",
        "|" + "---|" * 9,
    ]
    for name in two:
        o, t = one[name], two[name]
        lines.append(
            f"| {name} | {o['no XLA'] * 1e3:.1f} ms | {o['XLA'] * 1e3:.1f} ms | "
            f"{o['XLA split'] * 1e3:.1f} ms | {o['XLA'] / o['no XLA']:.2f}x | "
            f"{o['XLA split'] / o['XLA']:.2f}x | {t['off'] * 1e3:.1f} ms | "
            f"{t['split'] * 1e3:.1f} ms | {t['split'] / t['off']:.2f}x |"
        )
    print("\n".join(lines))
    if not args.no_write:
        RESULTS.write_text(
            "\n".join(
                [
                    "# Keras fit with XLA on 2 processes: split step vs XLA off",
                    "",
                    f"Run {datetime.date.today().isoformat()} with `.venv/bin/python "
                    f"benchmarks/bench_tf_xla.py` (warm-up {args.warmup} steps, median of "
                    f"{args.steps} steps, the modes taking turns {args.rounds} times). Load "
                    "average (1/5/15 min) at the end: "
                    + " / ".join(f"{x:.1f}" for x in os.getloadavg())
                    + " (2 shared cores: above about 2, the timings include waiting).",
                    "",
                    f"Machine: {_machine()}. Median time of one training step (Adam, "
                    "`model.fit`), rank 0; 2 processes: Gloo over loopback, batch per process "
                    "as named.",
                    "",
                    *lines,
                    "",
                ]
            )
        )
        print(f"written to {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
