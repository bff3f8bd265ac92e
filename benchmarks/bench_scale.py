"""Converter speed and scale (issue 39): growth with the length of a file, peak memory, the
corpus against libcst's parse, and before/after in one interleaved run.

    .venv/bin/python benchmarks/bench_scale.py [--tree before=/tmp/old/rewriter] \\
        [--sizes 1000,5000,20000,100000] [--rounds 3] [--limit 600]

Every measurement runs in a fresh process (``--child``) with ``PYTHONPATH`` at the tree measured
(``after`` is this checkout's ``rewriter/``; ``--tree NAME=PATH`` adds another, e.g. a ``git
archive`` of main), so that peak memory is that of one conversion, and the trees alternate
(round by round, in turns first) on the same inputs: on a shared machine the load changes over
minutes, and measuring one tree after the other would put that change into the comparison.

Rows:

* ``blocks`` / ``helpers``: ``scale_inputs.training_blocks`` / ``flat_helpers`` at each size,
  converted by ``runner.convert_bytes`` (what the command line runs for a file, cache aside):
  CPU time of the conversion (``time.process_time``; the machine is shared), wall time, and the
  process's peak resident memory (``ru_maxrss``, imports included). A conversion still running
  after ``--limit`` seconds is stopped and recorded as "over N s".
* ``appended``: ``scale_inputs.appended_functions(1000)``, a real script with its docstring.
* ``corpus``: every ``fixtures/*/*/input.py``, the modules of the project fixtures and the
  public-style scripts of ``tests/e2e/real/scripts``, each converted alone, cold (no cache), in
  one process: the conversions' CPU time against libcst's ``parse_module`` of the same files in
  the same process (medians of ``--repeats``).

Each child also returns the sha256 of every output and report, so one run says whether the
trees convert every input identically. Writes ``benchmarks/results/scale.md`` (``--out``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import scale_inputs  # noqa: E402

WARM = (b"import torch\nm = torch.nn.Linear(1, 1)\no = torch.optim.SGD(m.parameters(), lr=1)\n"
        b"for x in range(3):\n    m(x).backward()\n    o.step()\n")


def corpus_files() -> list[Path]:
    return sorted(
        [*ROOT.glob("fixtures/*/*/input.py"), *ROOT.glob("fixtures/projects/*/input/**/*.py"),
         *ROOT.glob("tests/e2e/real/scripts/*.py")]
    )


def _digest(result) -> str:
    report = "\n".join(c.format("x.py") for c in result.changes)
    return hashlib.sha256(result.output + b"\0" + report.encode()).hexdigest()


def child(args: argparse.Namespace) -> None:
    """One measurement in this process; prints one JSON line."""
    import resource

    from sdp_convert.changes import ConversionError
    from sdp_convert.options import Options
    from sdp_convert.runner import convert_bytes

    options = Options()
    convert_bytes(WARM, "warm.py", options)  # imports and first-use costs
    out: dict = {"tree": __import__("sdp_convert").__file__}
    if args.child == "file":
        data = Path(args.path).read_bytes()
        out["base_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            result = convert_bytes(data, "long.py", options)
            out["changed"], out["digest"] = result.changed, _digest(result)
            out["manual"] = len(result.manual)
        except ConversionError as err:
            out["error"] = err.message
        out["cpu"], out["wall"] = time.process_time() - cpu, time.perf_counter() - wall
        out["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    else:
        import libcst as cst

        sources = [p.read_bytes() for p in corpus_files()]
        digests, parse, conv = [], [], []
        for _ in range(args.repeats):
            start = time.process_time()
            for s in sources:
                cst.parse_module(s)
            parse.append(time.process_time() - start)
            digests = []
            start = time.process_time()
            for s in sources:
                try:
                    digests.append(_digest(convert_bytes(s, "input.py", options)))
                except ConversionError as err:
                    digests.append("error: " + err.message)
            conv.append(time.process_time() - start)
        out.update(files=len(sources), lines=sum(s.count(b"\n") for s in sources),
                   parse=statistics.median(parse), convert=statistics.median(conv),
                   digest=hashlib.sha256("\n".join(digests).encode()).hexdigest(),
                   digests=digests)
    print(json.dumps(out))


def run_child(tree: Path, kind: str, path: Path | None, limit: float, repeats: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, __file__, "--child", kind, "--repeats", str(repeats)]
    if path is not None:
        cmd += ["--path", str(path)]
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return {"over": limit}
    if done.returncode != 0:
        return {"failed": done.stderr.strip().splitlines()[-1:],
                "wall": time.perf_counter() - start}
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(found["tree"]).is_relative_to(tree), (found["tree"], tree)
    return found


def fmt_time(sample: dict) -> str:
    if "over" in sample:
        return f"over {sample['over']:.0f} s"
    if "failed" in sample:
        return "crashed"
    text = f"{sample['cpu']:.2f} s"
    return text + " (failed)" if "error" in sample else text


def median_of(samples: list[dict], key: str) -> float | None:
    values = [s[key] for s in samples if key in s and "error" not in s]
    return statistics.median(values) if len(values) == len(samples) and values else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", choices=["file", "corpus"], help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--tree", action="append", default=[],
                        help="NAME=PATH of another tree's rewriter/ to measure (before)")
    parser.add_argument("--sizes", default="1000,5000,20000,100000")
    parser.add_argument("--shapes", default="blocks,helpers")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3, help="corpus passes per child")
    parser.add_argument("--limit", type=float, default=600.0,
                        help="seconds a conversion may take before it is stopped")
    parser.add_argument("--skip-limit", type=float, default=None,
                        help="stop measuring a tree at larger sizes of a shape once one "
                             "conversion took longer than this (default: --limit)")
    parser.add_argument("--only-given", action="store_true",
                        help="measure only the --tree trees, not this checkout")
    parser.add_argument("--no-corpus", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "scale.md"))
    args = parser.parse_args()
    if args.child:
        child(args)
        return 0

    given = dict(spec.partition("=")[::2] for spec in args.tree)
    trees = {name: Path(path).resolve() for name, path in given.items()}
    if args.only_given:
        assert trees, "--only-given needs --tree"
    else:
        trees.setdefault("after", ROOT / "rewriter")
    sizes = [int(s) for s in args.sizes.split(",")]
    shapes = args.shapes.split(",")
    skip_limit = args.skip_limit or args.limit
    loads = [os.getloadavg()[0]]
    samples: dict[tuple[str, str, int], list[dict]] = {}
    corpus: dict[str, list[dict]] = {name: [] for name in trees}
    started = time.strftime("%Y-%m-%d %H:%M")
    with tempfile.TemporaryDirectory() as tmp:
        inputs: dict[tuple[str, int], Path] = {}
        for shape in shapes:
            for size in sizes:
                path = Path(tmp) / f"{shape}-{size}.py"
                path.write_text(scale_inputs.SHAPES[shape](size))
                inputs[shape, size] = path
        appended = Path(tmp) / "appended.py"
        appended.write_text(scale_inputs.appended_functions(1000))
        inputs["appended", 1000] = appended
        counts = {key: path.read_text().count("\n") for key, path in inputs.items()}
        given_up: set[tuple[str, str]] = set()
        for round_ in range(args.rounds):
            order = list(trees.items())
            if round_ % 2:
                order.reverse()
            for (shape, size), path in inputs.items():
                for name, tree in order:
                    if (name, shape) in given_up:
                        samples.setdefault((name, shape, size), []).append({"over": skip_limit})
                        continue
                    sample = run_child(tree, "file", path, args.limit, 1)
                    samples.setdefault((name, shape, size), []).append(sample)
                    if sample.get("cpu", sample.get("over", 0)) > skip_limit:
                        given_up.add((name, shape))
                    print(f"round {round_ + 1} {name:>8} {shape:>8} {size:>7}: "
                          f"{fmt_time(sample)}, {sample.get('peak_mib', 0):.0f} MiB, "
                          f"load {os.getloadavg()[0]:.1f}", flush=True)
                    loads.append(os.getloadavg()[0])
            if not args.no_corpus:
                for name, tree in order:
                    sample = run_child(tree, "corpus", None, 3600, args.repeats)
                    corpus[name].append(sample)
                    print(f"round {round_ + 1} {name:>8} corpus: convert "
                          f"{sample.get('convert', 0):.2f} s, parse {sample.get('parse', 0):.2f} s",
                          flush=True)
                    loads.append(os.getloadavg()[0])
    text = report(args, trees, sizes, shapes, counts, samples, corpus, loads, started)
    Path(args.out).write_text(text)
    print(text)
    return 0


def report(args, trees, sizes, shapes, inputs, samples, corpus, loads, started) -> str:
    """The tables; ``inputs``: the line count of each (shape, size)."""
    names = list(trees)
    cpu_model = platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    lines = [
        f"# Converter speed and scale ({started})",
        "",
        f"`benchmarks/bench_scale.py --sizes {args.sizes} --rounds {args.rounds}"
        f" --limit {args.limit:.0f}"
        + "".join(f" --tree {t}" for t in args.tree) + "`.",
        f"Machine: {cpu_model}, {os.cpu_count()} cores, shared; Python "
        f"{platform.python_version()}. Load average (1 min) during the run: "
        f"{min(loads):.1f}-{max(loads):.1f}, median {statistics.median(loads):.1f}.",
        "Times are CPU seconds of one conversion (`runner.convert_bytes`) in a fresh process, "
        f"medians of {args.rounds} rounds with the trees alternating; memory is the process's "
        "peak resident set (imports included, about 100 MiB of it). Trees: "
        + ", ".join(f"{n} = `{p}`" for n, p in trees.items()) + ".",
        "",
        "| shape | lines | " + " | ".join(f"{n} CPU | {n} peak" for n in names)
        + (" | speed-up |" if len(names) > 1 else " |"),
        "| --- | ---: | " + " | ".join("---: | ---:" for _ in names)
        + (" | ---: |" if len(names) > 1 else " |"),
    ]
    for (shape, size), count in inputs.items():
        cells = []
        medians = {}
        for name in names:
            got = samples.get((name, shape, size), [])
            cpu = median_of(got, "cpu")
            peak = median_of(got, "peak_mib")
            medians[name] = cpu
            if cpu is None:
                worst = next((s for s in got if "cpu" not in s or "error" in s), {})
                cells.append(fmt_time(worst) if "error" not in worst
                             else f"failed: {worst['error'][:60]}")
                cells.append("")
            else:
                cells += [f"{cpu:.2f} s", f"{peak:.0f} MiB"]
        row = f"| {shape} | {count:,} | " + " | ".join(cells)
        if len(names) > 1:
            first, last = medians[names[0]], medians[names[-1]]
            row += f" | {first / last:.1f}x |" if first and last else " | |"
        else:
            row += " |"
        lines.append(row)
    lines += ["", "Growth (CPU time of each size over the 1,000-line file's, same tree):", "",
              "| shape | tree | " + " | ".join(f"{s:,}" for s in sizes) + " |",
              "| --- | --- | " + " | ".join("---:" for _ in sizes) + " |"]
    for shape in shapes:
        for name in names:
            base = median_of(samples.get((name, shape, sizes[0]), []), "cpu")
            cells = []
            for size in sizes:
                cpu = median_of(samples.get((name, shape, size), []), "cpu")
                cells.append(f"{cpu / base:.1f}x" if cpu and base else "-")
            lines.append(f"| {shape} | {name} | " + " | ".join(cells) + " |")
    same = []
    for key in inputs:
        digests = {n: {s.get("digest") for s in samples.get((n, *key), [])} for n in names}
        if all(len(d) == 1 and None not in d for d in digests.values()):
            same.append(len({next(iter(d)) for d in digests.values()}) == 1)
    if len(names) > 1:
        lines += ["", f"Outputs and reports identical between the trees (sha256): "
                  f"{sum(same)} of {len(same)} inputs both trees converted."]
    if any(corpus.values()):
        lines += ["", "## Corpus: cold conversion against libcst's parse", "",
                  "| tree | files | lines | libcst parse | conversion | ratio |",
                  "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for name in names:
            got = [s for s in corpus[name] if "convert" in s]
            if not got:
                continue
            parse = statistics.median(s["parse"] for s in got)
            conv = statistics.median(s["convert"] for s in got)
            lines.append(f"| {name} | {got[0]['files']} | {got[0]['lines']:,} | "
                         f"{parse:.2f} s | {conv:.2f} s | {conv / parse:.2f}x |")
        digests = {n: {s["digest"] for s in corpus[n] if "digest" in s} for n in names}
        if len(names) > 1:
            firsts = [next(iter(d)) for d in digests.values() if len(d) == 1]
            verdict = "identical" if len(firsts) == len(names) and len(set(firsts)) == 1 else (
                "DIFFERENT")
            lines += ["", f"Corpus outputs and reports between the trees: {verdict} "
                      f"(sha256 of every file's output and report)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
