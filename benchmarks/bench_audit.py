"""What ``sdp-run --audit`` costs: nothing when off, little when on (issue 29).

    .venv/bin/python benchmarks/bench_audit.py                   # 2 processes, Gloo, CPU
    .venv/bin/python benchmarks/bench_audit.py [--rounds 3] [--steps 80] [--hidden 1024]
        [--base REV] [--out benchmarks/results/audit.md] [--timeout SECONDS_PER_LAUNCH]
        [--keras-rounds 6]

One training script (an MLP, batch 64 per process, SGD with momentum, synthetic data, the runtime's
``DistributedDataParallel`` and a ``DistributedSampler``: what the converter writes) runs under
``sdp-run -n 2`` in three ways, taking turns round after round so that the machine's load hits
all of them alike:

* ``before``: the runtime of commit ``--base`` (default: the parent of the commit that added
  ``sdp_runtime/_audit``), exported
  with ``git archive`` and put first on ``PYTHONPATH``: the code without the audit;
* ``off``: this tree's runtime, audit off (the default);
* ``on``: this tree's runtime under ``sdp-run --audit``.

Each rank times every step (``time.perf_counter`` around forward, backward and step); rank 0
writes its times. The table shows per variant the median step time of the first K steps
(``SDP_AUDIT_STEPS``, 5: where the audit fingerprints gradients and weights) and of the steps
after them (the steady state), the median over rounds of each, and the bytes of audit records
rank 0 wrote per step. Targets: ``off`` within noise of ``before`` (no cost at all: nothing is
patched when the audit is off); ``on`` below 5% over ``off`` after the first K steps.
Each launch has a hard time limit; its whole process tree is killed past it and afterwards.

Launches on a shared 2-core machine spread by far more than these costs, so three measurements
that do not depend on the load come with them: the audit's per-step work timed call by call in
one process; with the audit off, the calls into ``sdp_runtime._audit`` during training steps,
counted with ``sys.setprofile`` (0 is "no cost at all"); and Keras ``fit`` with the audit's two
patches on its path put in and taken out in turns in one process (``--keras-rounds``).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "audit.md"
AUDIT_INIT = "runtime/sdp_runtime/_audit/__init__.py"
K = 5

TRAIN = """\
import json, os, sys, time
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
import sdp_runtime.torch as sdp

steps, hidden, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
sdp.init()
torch.manual_seed(0)
n = 64 * sdp.size() * steps
data = TensorDataset(torch.randn(n, 512), torch.randint(0, 10, (n,)))
loader = DataLoader(data, batch_size=64, sampler=DistributedSampler(data, shuffle=True))
model = sdp.DistributedDataParallel(torch.nn.Sequential(
    torch.nn.Linear(512, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
    torch.nn.ReLU(), torch.nn.Linear(hidden, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01 * sdp.size(), momentum=0.9)
times = []
for x, y in loader:
    t0 = time.perf_counter()
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    times.append(time.perf_counter() - t0)
records = 0
folder = os.environ.get("SDP_AUDIT_DIR")
if folder and os.path.exists(os.path.join(folder, f"rank{sdp.rank()}.jsonl")):
    records = os.path.getsize(os.path.join(folder, f"rank{sdp.rank()}.jsonl"))
if sdp.rank() == 0:
    params = sum(p.numel() for p in model.parameters())
    with open(out, "w") as f:
        json.dump({"times": times, "record_bytes": records, "params": params}, f)
"""

INPROCESS = r'''
import json, os, sys, time, timeit
from sdp_runtime import _audit
rec = _audit.install()
assert rec is not None, "audit not installed"
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from sdp_runtime._audit import _files, _torch
hidden, out = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", rank=0, world_size=1)
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(512, hidden), torch.nn.ReLU(),
                                torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                                torch.nn.Linear(hidden, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
data = TensorDataset(torch.randn(64 * 40, 512), torch.randint(0, 10, (64 * 40,)))
times = []
for x, y in DataLoader(data, batch_size=64):
    t0 = time.perf_counter()
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    times.append(time.perf_counter() - t0)
state = _torch._get.current()
assert state.steps[0] > state.k and not state.hooks[0]
n = 2000
x = torch.randn(64, 512)
per_step = {
    "optimizer step hooks (pre + post)": timeit.timeit(
        lambda: (_torch._before_step(state, opt), _torch._after_step(state, opt)), number=n) / n,
    "DDP forward pre-hook": timeit.timeit(
        lambda: _torch._forward(state, 0, model, (x,), {}), number=n) / n,
    "audit hook, one event (x10 per step, a generous count)": 10 * timeit.timeit(
        lambda: _files._hook("builtins.id", (1,)), number=n) / n,
}
def per_batch(first_pass):
    """A DataLoader batch with the audit's wrappers (__next__, _next_index) minus without."""
    it = iter(DataLoader(TensorDataset(torch.zeros(3 * n, 1)), batch_size=1))
    if not first_pass:
        it._sdp_collect = None  # as after its first pass: the indices are no longer kept
    cls = type(it).__mro__[1]
    wrapped = (cls.__next__, cls._next_index)
    t_wrapped = timeit.timeit(lambda: cls.__next__(it), number=n) / n
    cls.__next__, cls._next_index = wrapped[0].__wrapped__, wrapped[1].__wrapped__
    try:
        t_plain = timeit.timeit(lambda: cls.__next__(it), number=n) / n
    finally:
        cls.__next__, cls._next_index = wrapped
    return max(t_wrapped - t_plain, 0.0)


per_step["DataLoader batch (wrapped - plain)"] = per_batch(False)
first_epoch = {"DataLoader batch in its first pass (indices kept)": per_batch(True)}
json.dump({"times": times, "k": state.k, "per_step": per_step, "first_epoch": first_epoch},
          open(out, "w"))
'''


OFFPROCESS = r'''
import json, os, sys, time
import sdp_runtime.torch as sdp
import torch
from torch.utils.data import DataLoader, TensorDataset
from sdp_runtime import _audit
hidden, out = int(sys.argv[1]), sys.argv[2]
sdp.init()
torch.manual_seed(0)
model = sdp.DistributedDataParallel(torch.nn.Sequential(
    torch.nn.Linear(512, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
    torch.nn.ReLU(), torch.nn.Linear(hidden, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
data = TensorDataset(torch.randn(64 * 30, 512), torch.randint(0, 10, (64 * 30,)))
audit_dir = os.path.dirname(os.path.abspath(_audit.__file__)) + os.sep
calls = [0]
def profile(frame, event, arg):
    if event == "call" and frame.f_code.co_filename.startswith(audit_dir):
        calls[0] += 1
sys.setprofile(profile)
steps = 0
for x, y in DataLoader(data, batch_size=64):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    steps += 1
sys.setprofile(None)
json.dump({"active": _audit.active(), "calls": calls[0], "steps": steps}, open(out, "w"))
'''


KERAS = r'''
import json, os, statistics, sys, time
import keras
import numpy as np
import tensorflow as tf
import sdp_runtime.tensorflow as sdp
from keras.src.backend.tensorflow import trainer
from keras.src.optimizers import base_optimizer
from sdp_runtime import _audit

rounds, steps, hidden, out = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
sdp.init()
assert _audit.active(), "audit not installed"
# The audit's two Keras patches in the training path, and what they wrap: the same process
# runs fit with each, in turns (same load, same libraries, a fresh model and trace each time).
audited = (base_optimizer.BaseOptimizer.apply, trainer.TFEpochIterator.__init__)
plain = tuple(f.__wrapped__ for f in audited)
rng = np.random.default_rng(0)
x = rng.normal(size=(64 * steps, 512)).astype("float32")
y = rng.integers(0, 10, size=(64 * steps,))
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(64)


def fit() -> list[float]:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((512,)), keras.layers.Dense(hidden, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(optimizer=sdp.keras.DistributedOptimizer(keras.optimizers.SGD(0.01)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    times = []

    class Timer(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.t0 = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            times.append(time.perf_counter() - self.t0)

    model.fit(data, epochs=1, verbose=0, callbacks=[Timer()])
    return times


runs = {"off": [], "on": []}
for _ in range(rounds):
    for name, patches in (("off", plain), ("on", audited)):
        base_optimizer.BaseOptimizer.apply, trainer.TFEpochIterator.__init__ = patches
        runs[name].append({"times": fit()})
json.dump(runs, open(out, "w"))
'''


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _bench() -> object:
    spec = importlib.util.spec_from_file_location("bench_runtime_torch",
                                                  ROOT / "benchmarks" / "bench_runtime_torch.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _base_rev(requested: str | None) -> str:
    """``--base``, else the parent of the commit that added the audit (the runtime just before
    it existed)."""
    if requested:
        return requested
    added = subprocess.run(
        ["git", "log", "--diff-filter=A", "--format=%H", "--", AUDIT_INIT], cwd=ROOT,
        capture_output=True, text=True).stdout.split()
    if not added:
        raise SystemExit(f"no commit added {AUDIT_INIT} here: give --base REV")
    return subprocess.run(["git", "rev-parse", added[-1] + "^"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout.strip()


def _export(rev: str, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    archive = dest / "base.tar"
    subprocess.run(["git", "archive", "-o", str(archive), rev, "runtime"], cwd=ROOT, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=80, help="training steps per launch")
    parser.add_argument("--hidden", type=int, default=1024, help="width of the MLP")
    parser.add_argument("--base", help="the commit without the audit (default: merge base "
                        "with main)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--keras-rounds", type=int, default=6,
                        help="rounds of the one-process Keras fit comparison (0: none)")
    args = parser.parse_args(argv)
    bench = _bench()
    rev = _base_rev(args.base)
    started = time.monotonic()
    load_before = bench._load()
    with tempfile.TemporaryDirectory(prefix="bench-audit-") as tmp_name:
        tmp = Path(tmp_name)
        _export(rev, tmp / "base")
        script = tmp / "train.py"
        script.write_text(TRAIN)
        env = bench._clean_env("gloo")
        before_env = {**env, "PYTHONPATH": os.pathsep.join(
            [str(tmp / "base" / "runtime"), env["PYTHONPATH"]])}
        variants = {
            "before": (bench._sdp_run(2), before_env),
            "off": (bench._sdp_run(2), env),
            "on": ([*bench._command_of("sdp-run", "sdp_runtime.launch"), "--audit", "-n", "2"],
                   env),
        }
        inproc = tmp / "inprocess.py"
        inproc.write_text(INPROCESS)
        inproc_env = {**env, "SDP_AUDIT": "1", "SDP_AUDIT_DIR": str(tmp / "records"),
                      "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                      "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
        bench._run([sys.executable, str(inproc), str(args.hidden), str(tmp / "inproc.json")],
                   inproc_env, args.timeout, "in-process hook costs", cwd=tmp)
        own = json.loads((tmp / "inproc.json").read_text())
        offproc = tmp / "offprocess.py"
        offproc.write_text(OFFPROCESS)
        bench._run([sys.executable, str(offproc), str(args.hidden), str(tmp / "off.json")],
                   {k: v for k, v in env.items() if k != "SDP_AUDIT"}, args.timeout,
                   "audit off, calls per step", cwd=tmp)
        own["off"] = json.loads((tmp / "off.json").read_text())
        keras_runs: dict[str, list[dict]] = {}
        if args.keras_rounds and importlib.util.find_spec("tensorflow") is not None:
            kscript = tmp / "keras_fit.py"
            kscript.write_text(KERAS)
            kenv = {**env, "TF_CPP_MIN_LOG_LEVEL": "2", "SDP_AUDIT": "1",
                    "SDP_AUDIT_DIR": str(tmp / "krecords")}
            bench._run([sys.executable, str(kscript), str(args.keras_rounds), str(args.steps),
                        str(args.hidden // 4), str(tmp / "keras.json")], kenv, args.timeout,
                       "keras fit, audit on and off in one process", cwd=tmp)
            keras_runs = json.loads((tmp / "keras.json").read_text())
            own["keras_hidden"] = args.hidden // 4
        own["keras"] = keras_runs
        results: dict[str, list[dict]] = {name: [] for name in variants}
        for r in range(args.rounds):
            for name, (launcher, variant_env) in variants.items():
                out = tmp / f"{name}{r}.json"
                bench._run([*launcher, str(script), str(args.steps), str(args.hidden), str(out)],
                           variant_env, args.timeout, f"round {r + 1} {name}", cwd=tmp)
                results[name].append(json.loads(out.read_text()))
    wall = time.monotonic() - started
    text = report(results, args, rev, argv if argv is not None else sys.argv[1:], wall,
                  load_before, bench) + in_process_report(own)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    return 0


def _median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def report(results: dict[str, list[dict]], args: argparse.Namespace, rev: str,
           argv: list[str], wall: float, load_before: str, bench: object) -> str:
    # The best round of each variant: on 2 cores shared with other jobs a round's median moves
    # by 2x with the load; the best round is the code's cost with the least interference.
    first = {n: min(_median_ms(r["times"][:K]) for r in rs) for n, rs in results.items()}
    steady = {n: min(_median_ms(r["times"][K:]) for r in rs) for n, rs in results.items()}
    per_round = {n: [round(_median_ms(r["times"][K:]), 2) for r in rs] for n, rs in results.items()}
    params = results["off"][0]["params"]
    record = results["on"][0]["record_bytes"]
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    spread = max(max(v) / min(v) - 1 for v in per_round.values())
    off_cost = steady["off"] / steady["before"] - 1
    on_cost = steady["on"] / steady["off"] - 1
    pairs_off = _ratios(results, "off", "before")
    pairs_on = _ratios(results, "on", "off")
    lines = [
        "# sdp-run --audit: what it costs",
        "",
        f"Command: `{shlex.join(['.venv/bin/python', 'benchmarks/bench_audit.py', *argv])}`",
        "",
        f"Run {datetime.datetime.now():%Y-%m-%d %H:%M}; wall time {wall:.0f} s. "
        f"`before` = the runtime of commit {rev[:10]} (no audit).",
        "",
        "| machine | |",
        "|---|---|",
        f"| CPU | {cpu} |",
        f"| cores | {os.cpu_count()} |",
        f"| load | {load_before} before, {bench._load()} after (1-minute load average) |",
        f"| Python | {platform.python_version()} |",
        f"| torch | {torch.__version__} |",
        "| processes | 2 on this machine, Gloo over loopback TCP, OMP_NUM_THREADS=1 |",
        "",
        f"Model: MLP 512-{args.hidden}-{args.hidden}-10 ({params / 1e6:.2f} M parameters), batch "
        f"64 per process, SGD with momentum, sdp.DistributedDataParallel, DistributedSampler; "
        f"{args.steps} steps per launch, {args.rounds} rounds, variants taking turns. A step's "
        "time is rank 0's, forward + backward + step. Median within a launch, then the best "
        "(lowest) round: the machine is shared, and a round's median moves with the load.",
        "",
        "| variant | steps 1-5 (ms/step) | steps 6+ (ms/step) | steps 6+ per round | "
        "vs off, steps 6+ |",
        "|---|---|---|---|---|",
    ]
    for n in results:
        lines.append(f"| {n} | {first[n]:.2f} | {steady[n]:.2f} | {per_round[n]} | "
                     f"{steady[n] / steady['off']:.3f}x |")
    lines += [
        "",
        "## Launch-level comparison",
        "",
        f"The same variant's rounds spread by up to {spread:.0%} (slowest round over fastest) on "
        "this shared machine. The variants take turns within a round, so each round also gives "
        "a paired ratio (one variant over the other, launched seconds apart); a difference whose "
        "paired ratios straddle 1.0 is one these launches cannot resolve. What shows that the "
        "audit off costs nothing is the count of its code run per step, below.",
        "",
        "| comparison | best rounds | paired by round: median [min, max] | goal | verdict |",
        "|---|---|---|---|---|",
        f"| audit off vs before (no audit in the code) | {off_cost:+.1%} | "
        f"{_paired(pairs_off)} | no cost | {_verdict(pairs_off, 0.0)} |",
        f"| audit on vs off after the first {K} steps | {on_cost:+.1%} | "
        f"{_paired(pairs_on)} | < 5% | {_verdict(pairs_on, 0.05)} |",
        f"| audit on vs off in the first {K} steps | "
        f"{first['on'] / first['off'] - 1:+.1%} | | (recorded only) | |",
        f"| audit records rank 0 wrote | {record} bytes in all, {record / args.steps:.0f} "
        "bytes per step on average; no collective | | (recorded only) | |",
        "",
    ]
    return "\n".join(lines)


def _ratios(results: dict[str, list[dict]], a: str, b: str) -> list[float]:
    """Per round: a's median step (after the first K) over b's."""
    return [statistics.median(x["times"][K:]) / statistics.median(y["times"][K:])
            for x, y in zip(results[a], results[b], strict=True)]


def _paired(ratios: list[float]) -> str:
    return (f"{statistics.median(ratios) - 1:+.1%} [{min(ratios) - 1:+.1%}, "
            f"{max(ratios) - 1:+.1%}]")


def _verdict(ratios: list[float], goal: float) -> str:
    median = statistics.median(ratios) - 1
    if min(ratios) - 1 <= goal and max(ratios) - 1 >= -goal and median <= goal:
        return "PASS within noise" if max(ratios) - 1 > goal else "PASS"
    if median > goal and min(ratios) - 1 > goal:
        return "MISS (every round)"
    return "not resolved (noise)"


def in_process_report(own: dict) -> str:
    """The audit's own work per step, timed call by call in one process (load-proof: each
    piece is microseconds, timed over thousands of calls, against the step it runs in)."""
    k = own["k"]
    steady = statistics.median(own["times"][k + 1:]) * 1e3
    first = statistics.median(own["times"][:k]) * 1e3
    lines = [
        "",
        "## The audit's own work per step, in one process",
        "",
        "One process (torch DDP on a one-rank Gloo group, the same MLP, batch 64) with the audit "
        "installed as `sdp-run --audit` installs it; after the first K steps each piece of work "
        "the audit still does per step is timed over 2,000 calls (`timeit`) and compared with the "
        f"median step of that process ({steady:.1f} ms after step {k}; {first:.1f} ms in steps "
        f"1-{k}, where gradients and weights are fingerprinted).",
        "",
        "| per step after the first K steps | time | of a step |",
        "|---|---|---|",
    ]
    total = 0.0
    for name, seconds in own["per_step"].items():
        total += seconds
        lines.append(f"| {name} | {seconds * 1e6:.2f} us | {seconds * 1e3 / steady:.4%} |")
    lines += [f"| total | {total * 1e6:.2f} us | {total * 1e3 / steady:.4%} |", "",
              f"Target: < 5% of step time after the first K steps: "
              f"{'PASS' if total * 1e3 / steady < 0.05 else 'MISS'}.", ""]
    for name, seconds in (own.get("first_epoch") or {}).items():
        lines += [f"During a DataLoader's first pass (recorded only): {name.lower()}, "
                  f"{seconds * 1e6:.2f} us more per batch ({seconds * 1e3 / steady:.4%} of a "
                  "step); the indices are kept for the overlap over the epoch, 8 bytes each.", ""]
    off = own.get("off")
    if off:
        lines += [
            "## Audit off: what runs per step",
            "",
            "One process, the audit off (no `SDP_AUDIT`), the same MLP under the runtime's "
            "DistributedDataParallel: every function call during its training steps is counted "
            "with `sys.setprofile`, and those whose code lies in `sdp_runtime/_audit/` are "
            "reported (tests/audit/test_off.py asserts the same, and that nothing is patched).",
            "",
            f"Audit active: {off['active']}; calls into `sdp_runtime._audit` in {off['steps']} "
            f"training steps: {off['calls']} "
            f"({'PASS: no cost at all' if off['calls'] == 0 and not off['active'] else 'MISS'}).",
            "",
        ]
    keras_runs = own.get("keras") or {}
    if keras_runs.get("on"):
        k = K
        med = {n: [statistics.median(r["times"][k + 1:]) * 1e3 for r in rs]
               for n, rs in keras_runs.items()}
        ratios = [a / b for a, b in zip(med["on"], med["off"], strict=True)]
        best = min(med["on"]) / min(med["off"]) - 1
        lines += [
            "## Keras fit, audit on vs off, in one process",
            "",
            f"`model.fit` of an MLP 512-{own.get('keras_hidden')}-10 (Keras 3, TF backend, "
            "batch 64, the runtime's "
            "Keras DistributedOptimizer, one process with the audit installed). The audit's two "
            "patches on fit's path (the optimizers' `apply`, fit's data iterator) are put in "
            "and taken out in turns in that process, each round a fresh model and trace, so "
            "both variants run under the same load. A step is timed between "
            "`on_train_batch_begin` and `on_train_batch_end`; median of the steps after "
            "K + 1 (step K + 1 still reads the weights after step K). On, after those each step "
            "still runs one `tf.cond` on the optimizer's step counter and each batch one "
            "`tf.cond` in the data pipeline.",
            "",
            "| variant | median step per round (ms) | best round |",
            "|---|---|---|",
            *(f"| {n} | {[round(v, 3) for v in med[n]]} | {min(med[n]):.3f} |" for n in med),
            "",
            f"On vs off: best rounds {best:+.1%}; paired by round {_paired(ratios)}; goal < 5%: "
            f"{'PASS' if best < 0.05 else 'MISS'} on the best rounds, "
            f"{_verdict(ratios, 0.05)} on the paired ones.",
            "",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
