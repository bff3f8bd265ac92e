"""Converter speed: sdp-convert against libcst's parse-only floor, start-up, memory, -j scaling.

Corpus: every ``fixtures/*/*/input.py`` plus generated variants of realistic ~200-line PyTorch
and Keras training scripts, at least 50 files. Project mode: a generated 20-module tree (5
experiments of train/data/models/utils modules), converted file by file and as one project.
Printed as a table and written, with the machine,
to ``benchmarks/results/convert.md``.

In-process timings are CPU time of this process (``time.process_time``), so that other work on a
shared machine disturbs them less; command-line timings are wall time. The cache rows run the
installed command with ``SDP_CONVERT_CACHE_DIR`` pointing at a fresh temporary directory (cold:
empty; warm: after one run): ``--check`` over a tree of 100 training scripts, and the pre-commit
check hook's command (``sdp-convert --check --diff --force-exclude FILE...``, all files in one
call, as pre-commit runs a ``require_serial`` hook) over a git repository of 1,000 Python files of
which 50 train. The other command-line rows use ``--no-cache``.

Usage: ``.venv/bin/python benchmarks/bench_convert.py [--variants N] [--repeats R]``;
``--only cache`` runs the command-line rows alone (``--version`` start-up and the cache rows) and
prints them, without writing ``convert.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import libcst as cst
from libcst.metadata import MetadataWrapper, QualifiedNameProvider, ScopeProvider
from sdp_convert import __version__
from sdp_convert.base import Options
from sdp_convert.engine import _convert_once, convert

ROOT = Path(__file__).resolve().parents[1]
SDP_CONVERT = str(Path(sys.executable).with_name("sdp-convert"))

TORCH_TEMPLATE = '''\
"""Train a {name} regressor on synthetic data ({i})."""
import argparse
import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import optim
from torch.utils.data import DataLoader, TensorDataset

{blocks}

class Net{i}(nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.inp = nn.Linear(16, width)
        self.blocks = nn.Sequential(*[Block0(width) for _ in range({depth})])
        self.out = nn.Linear(width, 1)

    def forward(self, x):
        return self.out(self.blocks(F.relu(self.inp(x))))


def evaluate(model, loader, device):
    model.eval()
    total = 0.0
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            total += F.mse_loss(model(x), y).item()
    return total / max(len(loader), 1)


def train_one_epoch(model, loader, opt, device, epoch, log_every=10):
    model.train()
    for step, (x, y) in enumerate(loader):
        x, y = x.to(device), y.to(device)
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if step % log_every == 0:
            print(f"epoch {{epoch}} step {{step}} loss {{loss.item():.4f}}")


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lr", type=float, default={lr})
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", default="out")
    args = parser.parse_args()
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    gen = torch.Generator().manual_seed({i})
    x = torch.randn(512, 16, generator=gen)
    y = x.sum(dim=1, keepdim=True)
    train_loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True)
    eval_loader = DataLoader(TensorDataset(x, y), batch_size=128)
    model = Net{i}().to(device)
    opt = optim.{optimizer}(model.parameters(), lr=args.lr)
    scheduler = optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    for epoch in range(args.epochs):
        train_one_epoch(model, train_loader, opt, device, epoch)
        scheduler.step()
        print("eval", evaluate(model, eval_loader, device))
    os.makedirs(args.out, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(args.out, "model.pt"))
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump({{"epochs": args.epochs}}, f)


{utils}

if __name__ == "__main__":
    main()
'''

KERAS_TEMPLATE = '''\
"""Keras {name} classifier ({i})."""
import os

import numpy as np
import tensorflow as tf
from tensorflow import keras

{utils}

def build_model(width={width}):
    inputs = keras.Input(shape=(20,))
    x = keras.layers.Dense(width, activation="relu")(inputs)
    x = keras.layers.Dense(width, activation="relu")(x)
    outputs = keras.layers.Dense(3, activation="softmax")(x)
    return keras.Model(inputs, outputs)


def make_dataset(n=1024, batch_size=32):
    rng = np.random.RandomState({i})
    x = rng.randn(n, 20).astype("float32")
    y = rng.randint(0, 3, size=(n,))
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    return ds.shuffle(1024).batch(batch_size)


def main():
    model = build_model()
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate={lr}),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    callbacks = [keras.callbacks.ModelCheckpoint(os.path.join("ckpt", "model.keras"))]
    model.fit(make_dataset(), epochs=2, steps_per_epoch=32, callbacks=callbacks, verbose=1)
    model.save_weights("final.weights.h5")


if __name__ == "__main__":
    main()
'''

BLOCK = '''\
class Block{k}(nn.Module):
    """Residual block {k}."""

    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.act = nn.GELU()

    def forward(self, x):
        # residual connection keeps gradients flowing
        return x + self.act(self.fc(x))
'''

UTIL = '''\
def util_{k}(a, b=3, *args, **kwargs):
    """Helper {k}: unrelated code a real script carries along."""
    values = [a * b for _ in range(3)]
    if kwargs.get("verbose"):
        print(values)
    return sum(values) + len(args)
'''


def corpus(tmp: Path, variants: int) -> list[Path]:
    files = sorted(ROOT.glob("fixtures/*/*/input.py"))
    out = tmp / "corpus"
    out.mkdir()
    paths = []
    for n, f in enumerate(files):
        dest = out / f"fixture_{n:03d}_{f.parent.parent.name}_{f.parent.name}.py"
        shutil.copy(f, dest)
        paths.append(dest)
    optimizers = ["SGD", "Adam", "AdamW", "RMSprop"]
    for i in range(variants):
        if i % 4 == 3:
            text = KERAS_TEMPLATE.format(
                name=f"k{i}", i=i, width=32 + i, lr=0.001 * (1 + i % 3),
                utils="\n\n".join(UTIL.format(k=k) for k in range(12)),
            )
        else:
            text = TORCH_TEMPLATE.format(
                name=f"t{i}", i=i, depth=2 + i % 3, lr=0.01 * (1 + i % 5),
                optimizer=optimizers[i % len(optimizers)],
                blocks="\n\n".join(BLOCK.format(k=k) for k in range(3 + i % 3)),
                utils="\n\n".join(UTIL.format(k=k) for k in range(4 + i % 4)),
            )
        dest = out / f"generated_{i:03d}.py"
        dest.write_text(text)
        paths.append(dest)
    return paths


PROJECT_DATA = '''\
"""Loaders of experiment {k}."""
import torch
from torch.utils.data import DataLoader, TensorDataset

from utils_{k} import seeded


def get_loaders(batch_size=32):
    seeded({k})
    train = TensorDataset(torch.randn(512, 16), torch.randn(512, 1))
    test = TensorDataset(torch.randn(128, 16), torch.randn(128, 1))
    return (DataLoader(train, batch_size=batch_size, shuffle=True),
            DataLoader(test, batch_size=batch_size))
'''
PROJECT_MODEL = '''\
"""Model of experiment {k}."""
import torch.nn as nn


def build_model(width=32):
    return nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, 1))
'''
PROJECT_UTILS = '''\
"""Helpers of experiment {k}."""
import random


def seeded(seed):
    random.seed(seed)
    return seed


def average(values):
    return sum(values) / max(len(values), 1)
'''
PROJECT_TRAIN = '''\
"""Train experiment {k}."""
import torch
import torch.nn.functional as F

import data_{k}
from models_{k} import build_model
from utils_{k} import average


def main():
    train_loader, test_loader = data_{k}.get_loaders(32)
    model = build_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(2):
        losses = []
        for x, y in train_loader:
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        print(epoch, average(losses))
    torch.save(model.state_dict(), "model_{k}.pt")


if __name__ == "__main__":
    main()
'''


def project_tree(root: Path, experiments: int = 5) -> list[Path]:
    """A project of 4 modules per experiment (train, data, models, utils): 20 for 5."""
    root.mkdir(parents=True)
    paths = []
    for k in range(experiments):
        for name, template in (("train", PROJECT_TRAIN), ("data", PROJECT_DATA),
                               ("models", PROJECT_MODEL), ("utils", PROJECT_UTILS)):
            path = root / f"{name}_{k}.py"
            path.write_text(template.format(k=k))
            paths.append(path)
    return paths


def project_mode(paths: list[Path], repeats: int) -> tuple[float, float, int, int]:
    """In-process, one core: every file converted alone (no project) against the same files as
    one project (``projects.project_options``, then each file with its facts). Also how many
    files each changes."""
    from sdp_convert.projects import project_options

    options = Options()
    sources = {p: p.read_bytes() for p in paths}

    def alone() -> int:
        return sum(convert(s, options).changed for s in sources.values())

    def together() -> int:
        chosen = project_options([(p, p.name) for p in paths], options)
        return sum(convert(s, chosen[p.resolve()]).changed for p, s in sources.items())

    return timed(alone, repeats), timed(together, repeats), alone(), together()


NOT_TRAINING = '''\
"""Utility module {i}: nothing here trains."""
import json
import os
from dataclasses import dataclass


@dataclass
class Record{i}:
    name: str
    value: float = 0.0


def load_{i}(path):
    with open(path) as f:
        return [Record{i}(**row) for row in json.load(f)]


def summarize_{i}(records):
    total = sum(r.value for r in records)
    return {{"count": len(records), "total": total, "cwd": os.getcwd()}}
'''


def timed(fn, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        samples.append(time.process_time() - start)
    return statistics.median(samples)


def run_cli(args: list[str], cwd: Path | None = None, env: dict | None = None) -> float:
    start = time.perf_counter()
    subprocess.run([SDP_CONVERT, *args], capture_output=True, timeout=1800, check=False,
                   cwd=cwd, env=env)
    return time.perf_counter() - start


def training_tree(tmp: Path, count: int) -> Path:
    """``count`` generated training scripts (PyTorch and Keras) in one directory."""
    tree = tmp / "scripts"
    tree.mkdir()
    (tmp / "gen").mkdir()
    for path in corpus(tmp / "gen", count)[-count:]:
        shutil.copy(path, tree / path.name)
    return tree


def hook_repository(tmp: Path, files: int, training: int) -> tuple[Path, list[str]]:
    """A git repository of ``files`` Python files, ``training`` of them training scripts."""
    repo = tmp / "repo"
    (tmp / "gen-hook").mkdir()
    generated = corpus(tmp / "gen-hook", training)[-training:]
    names = []
    for i in range(files):
        sub = repo / f"pkg{i % 20:02d}"
        sub.mkdir(parents=True, exist_ok=True)
        if i < training:
            dest = sub / f"train_{i:04d}.py"
            shutil.copy(generated[i], dest)
        else:
            dest = sub / f"util_{i:04d}.py"
            dest.write_text(NOT_TRAINING.format(i=i))
        names.append(str(dest.relative_to(repo)))
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True, timeout=60)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True, timeout=60)
    return repo, names


def cache_rows(tmp: Path, repeats: int) -> list[tuple[str, float]]:
    """Wall times of the cache rows (see the module docstring)."""
    rows = []
    tree = training_tree(tmp, 100)
    cache = tmp / "cache-check"
    env = {**os.environ, "SDP_CONVERT_CACHE_DIR": str(cache)}
    rows.append(("cold", run_cli(["--check", "-q", str(tree)], env=env)))
    rows.append(("warm", statistics.median(run_cli(["--check", "-q", str(tree)], env=env)
                                          for _ in range(max(repeats, 5)))))
    repo, names = hook_repository(tmp, 1000, 50)
    hook = ["--check", "--diff", "--force-exclude", *names]
    cold = []
    for n in range(repeats):
        env = {**os.environ, "SDP_CONVERT_CACHE_DIR": str(tmp / f"cache-hook-{n}")}
        cold.append(run_cli(hook, cwd=repo, env=env))
    rows.append(("hook cold", statistics.median(cold)))
    rows.append(("hook warm", statistics.median(run_cli(hook, cwd=repo, env=env)
                                               for _ in range(max(repeats, 5)))))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--variants", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=["cache"],
                        help="run only these rows and print them (convert.md is left as it is)")
    args = parser.parse_args()
    start_load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    if args.only == "cache":
        return only_cache_rows(args.repeats, start_load)

    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        paths = corpus(tmp, args.variants)
        sources = [p.read_bytes() for p in paths]
        lines = sum(s.count(b"\n") for s in sources)
        options = Options()
        changed = sum(convert(s, options).changed for s in sources)

        parse = timed(lambda: [cst.parse_module(s) for s in sources], args.repeats)
        trees = [cst.parse_module(s) for s in sources]
        metadata = timed(lambda: [resolve_names(t) for t in trees], args.repeats)
        once = timed(lambda: [_convert_once(s, options) for s in sources], args.repeats)
        total = timed(lambda: [convert(s, options) for s in sources], args.repeats)

        startup = statistics.median(run_cli(["--version"]) for _ in range(10))
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        single = statistics.median(
            run_cli(["--check", "-q", "--no-cache", "-j", "1", str(tmp / "corpus")])
            for _ in range(args.repeats)
        )
        peak_kib = max(before, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
        double = statistics.median(
            run_cli(["--check", "-q", "--no-cache", "-j", "2", str(tmp / "corpus")])
            for _ in range(args.repeats)
        )
        cached = dict(cache_rows(tmp, args.repeats))
        tree = project_tree(tmp / "project")
        per_file, as_project, changed_alone, changed_project = project_mode(tree, args.repeats)

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    rows = [
        ("files (changed by conversion)", f"{len(paths)} ({changed})", ""),
        ("lines", f"{lines}", ""),
        ("libcst parse only", f"{parse * 1000:.0f} ms", "1.00x"),
        ("libcst ScopeProvider + QualifiedNameProvider, resolve only",
         f"{metadata * 1000:.0f} ms", f"{metadata / parse:.2f}x"),
        ("sdp-convert, one pass (no verification)", f"{once * 1000:.0f} ms",
         f"{once / parse:.2f}x"),
        ("sdp-convert, total (with parse + fixed-point check)", f"{total * 1000:.0f} ms",
         f"{total / parse:.2f}x"),
        ("sdp-convert per 1,000 lines", f"{total / lines * 1e6:.0f} ms", ""),
        ("libcst parse per 1,000 lines", f"{parse / lines * 1e6:.0f} ms", ""),
        ("`sdp-convert --version` start-up", f"{startup * 1000:.0f} ms", "target < 300 ms"),
        ("directory mode -j 1 (wall)", f"{single:.2f} s", ""),
        ("directory mode -j 2 (wall)", f"{double:.2f} s", f"speed-up {single / double:.2f}x"),
        ("peak memory of one sdp-convert -j 1 process", f"{peak_kib / 1024:.0f} MiB", ""),
        (f"{len(tree)}-module project, each file alone (files changed: {changed_alone})",
         f"{per_file * 1000:.0f} ms", "1.00x"),
        (f"{len(tree)}-module project, project mode: analysis + conversion (files changed: "
         f"{changed_project})", f"{as_project * 1000:.0f} ms", f"{as_project / per_file:.2f}x"),
        ("`--check`, 100 training scripts, cold cache (wall, all cores)",
         f"{cached['cold']:.2f} s", ""),
        ("`--check`, 100 training scripts, warm cache (wall)", f"{cached['warm']:.3f} s", ""),
        ("pre-commit check hook, 1,000 files / 50 training, cold cache (wall, all cores)",
         f"{cached['hook cold']:.2f} s", ""),
        ("pre-commit check hook, 1,000 files / 50 training, warm cache (wall)",
         f"{cached['hook warm']:.3f} s", ""),
    ]
    table = ["| measure | value | ratio |", "| --- | ---: | ---: |",
             *[f"| {a} | {b} | {c} |" for a, b, c in rows]]
    targets = [
        ("total conversion <= 5x libcst parse-only (one core)", f"{total / parse:.2f}x",
         total / parse <= 5),
        ("`--check` of 100 unchanged training scripts, warm cache < 0.2 s",
         f"{cached['warm']:.3f} s", cached["warm"] < 0.2),
        ("pre-commit hook, 1,000 files / 50 training, warm < 1 s", f"{cached['hook warm']:.3f} s",
         cached["hook warm"] < 1),
        ("pre-commit hook, 1,000 files / 50 training, cold < 10 s (2 cores)",
         f"{cached['hook cold']:.2f} s", cached["hook cold"] < 10),
        ("directory mode -j 2 >= 1.7x faster than -j 1", f"{single / double:.2f}x",
         single / double >= 1.7),
        ("`sdp-convert --version` start-up < 0.3 s", f"{startup:.3f} s", startup < 0.3),
    ]
    table += ["", "| target | measured | verdict |", "| --- | ---: | --- |",
              *[f"| {a} | {b} | {'PASS' if ok else 'MISS'} |" for a, b, ok in targets]]
    header = [
        "# Converter benchmark",
        "",
        f"Run {time.strftime('%Y-%m-%d')} with `.venv/bin/python benchmarks/bench_convert.py"
        f" --variants {args.variants} --repeats {args.repeats}`.",
        f"Machine: {cpu}, {os.cpu_count()} cores; Python {platform.python_version()}, "
        f"libcst {cst_version()}, sdp-convert {__version__}. In-process timings are CPU time on"
        " one core; command lines are wall time; medians of the repeats."
        f" Load average at the start: {start_load}.",
        "",
    ]
    text = "\n".join(header + table) + "\n"
    print(text)
    (ROOT / "benchmarks" / "results").mkdir(parents=True, exist_ok=True)
    (ROOT / "benchmarks" / "results" / "convert.md").write_text(text)
    return 0


def only_cache_rows(repeats: int, start_load: str) -> int:
    """``--only cache``: the command-line rows (start-up and cache), printed."""
    with tempfile.TemporaryDirectory() as tmpdir:
        startup = statistics.median(run_cli(["--version"]) for _ in range(10))
        cached = dict(cache_rows(Path(tmpdir), repeats))
    end_load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    rows = [
        ("`sdp-convert --version` start-up", f"{startup * 1000:.0f} ms", startup < 0.3),
        ("`--check`, 100 training scripts, cold cache (wall, all cores)",
         f"{cached['cold']:.2f} s", None),
        ("`--check`, 100 training scripts, warm cache (wall), target < 0.2 s",
         f"{cached['warm']:.3f} s", cached["warm"] < 0.2),
        ("pre-commit check hook, 1,000 files / 50 training, cold cache (wall), target < 10 s",
         f"{cached['hook cold']:.2f} s", cached["hook cold"] < 10),
        ("pre-commit check hook, 1,000 files / 50 training, warm cache (wall), target < 1 s",
         f"{cached['hook warm']:.3f} s", cached["hook warm"] < 1),
    ]
    print(f"Cache rows, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, "
          f"repeats {repeats} (medians); load average at the start {start_load}, "
          f"at the end {end_load}.\n")
    print("| measure | value | verdict |\n| --- | ---: | --- |")
    for name, value, ok in rows:
        print(f"| {name} | {value} | {'' if ok is None else 'PASS' if ok else 'MISS'} |")
    return 0


def resolve_names(tree: cst.Module) -> None:
    """What matching on qualified names costs with libcst alone: the floor of one pass."""
    wrapper = MetadataWrapper(tree, unsafe_skip_copy=True)
    wrapper.resolve_many([ScopeProvider, QualifiedNameProvider])


def cst_version() -> str:
    from importlib.metadata import version

    return version("libcst")


if __name__ == "__main__":
    sys.exit(main())
