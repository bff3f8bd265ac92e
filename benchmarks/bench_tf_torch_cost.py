"""What torch costs a TensorFlow user of sdp_runtime: install size, import time, memory.

    .venv/bin/python benchmarks/bench_tf_torch_cost.py            # about 1-2 minutes here
    .venv/bin/python benchmarks/bench_tf_torch_cost.py --repeats 3 --no-write

The ``tensorflow`` extra installs torch because the runtime communicates through
``torch.distributed``. This measures, in the installed environment:

* install size: the files (from each distribution's RECORD) of torch and of the distributions
  only torch needs (not needed by tensorflow-cpu, keras or numpy), against tensorflow-cpu's own
  closure;
* import time and memory, each in a fresh process, median of ``--repeats``: ``import
  tensorflow``; ``import tensorflow`` then ``import torch``; ``import sdp_runtime.tensorflow``
  (which imports both); peak resident memory (``ru_maxrss``) of the same processes.

The speed of TensorFlow's own collectives against the torch path is measured by
``bench_tf_allreduce.py`` (its "TF op" column). Every process has a time limit.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata as md
import json
import os
import platform
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "tf_torch_cost.md"
MIB = 1024 * 1024

#: Each measured in a fresh process: the seconds the imports took and the peak memory.
PROBE = """
import json, resource, sys, time
start = time.perf_counter()
for name in sys.argv[1:]:
    __import__(name)
took = time.perf_counter() - start
print(json.dumps([took, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024]))
"""
IMPORTS = {
    "import tensorflow": ["tensorflow"],
    "import tensorflow, torch": ["tensorflow", "torch"],
    "import sdp_runtime.tensorflow": ["sdp_runtime.tensorflow"],
}


def _closure(name: str, seen: set[str] | None = None) -> set[str]:
    seen = set() if seen is None else seen
    key = re.sub(r"[-_.]+", "-", name).lower()
    if key in seen:
        return seen
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        return seen
    seen.add(key)
    for requirement in dist.requires or []:
        if "extra ==" not in requirement:
            _closure(re.split(r"[ ;<>=!~\[(]", requirement, maxsplit=1)[0], seen)
    return seen


def _size(name: str) -> int:
    dist = md.distribution(name)
    total = 0
    for file in dist.files or []:
        with contextlib.suppress(OSError):
            total += os.path.getsize(dist.locate_file(file))
    return total


def install_sizes() -> tuple[dict[str, int], int]:
    """Bytes of each distribution only torch needs, and of tensorflow-cpu's closure."""
    tf_side = _closure("tensorflow-cpu") | _closure("keras") | _closure("numpy")
    only_torch = sorted(_closure("torch") - tf_side)
    return {n: _size(n) for n in only_torch}, sum(_size(n) for n in tf_side)


def import_costs(repeats: int, timeout: float) -> dict[str, tuple[float, float]]:
    """Median (seconds, peak bytes) of each import line, each run in a fresh process."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    results = {}
    for label, modules in IMPORTS.items():
        runs = []
        for _ in range(repeats):
            out = subprocess.run(
                [sys.executable, "-c", PROBE, *modules],
                env=env, capture_output=True, text=True, timeout=timeout, check=True,
            )  # fmt: skip
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        results[label] = (
            statistics.median(r[0] for r in runs),
            statistics.median(r[1] for r in runs),
        )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="fresh processes per import line")
    parser.add_argument("--timeout", type=float, default=120, help="seconds per process")
    parser.add_argument("--no-write", action="store_true", help=f"do not write {RESULTS.name}")
    args = parser.parse_args(argv)

    sizes, tf_total = install_sizes()
    imports = import_costs(args.repeats, args.timeout)
    torch_total = sum(sizes.values())
    lines = [
        "| install size | MiB |",
        "|---|---|",
        *(f"| {name} | {size / MIB:.1f} |" for name, size in sizes.items()),
        f"| **torch and what only it needs** | **{torch_total / MIB:.0f}** |",
        f"| tensorflow-cpu and its dependencies (for comparison) | {tf_total / MIB:.0f} |",
        "",
        "| in a fresh process | import time | peak memory |",
        "|---|---|---|",
        *(
            f"| `{label}` | {took:.2f} s | {peak / MIB:.0f} MiB |"
            for label, (took, peak) in imports.items()
        ),
    ]
    tf_time, tf_peak = imports["import tensorflow"]
    both_time, both_peak = imports["import tensorflow, torch"]
    lines += [
        "",
        f"torch adds {both_time - tf_time:.2f} s ({both_time / tf_time - 1:.0%}) to the import "
        f"and {(both_peak - tf_peak) / MIB:.0f} MiB to the peak memory of a TensorFlow process, "
        f"and {torch_total / MIB:.0f} MiB ({torch_total / tf_total:.0%} of TensorFlow's) to the "
        "install.",
    ]
    print("\n".join(lines))
    if not args.no_write:
        cpu = platform.machine()
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
        RESULTS.write_text(
            "\n".join(
                [
                    "# What torch costs a TensorFlow user",
                    "",
                    f"Run {datetime.date.today().isoformat()} with `.venv/bin/python "
                    f"benchmarks/bench_tf_torch_cost.py` (median of {args.repeats} fresh "
                    "processes per import line).",
                    "",
                    f"Machine: {cpu}, {os.cpu_count()} cores; Python "
                    f"{platform.python_version()}, torch {md.version('torch')}, tensorflow-cpu "
                    f"{md.version('tensorflow-cpu')}; load average at the end {load} (shared "
                    "cores: import times include waiting for one).",
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
