"""Run Horovod's own parallel test suites against sdp_runtime and record what passes.

    python benchmarks/horovod_suites.py --label before            # all suites
    python benchmarks/horovod_suites.py --label after --suite test_torch.py

Horovod's tests are read from a Horovod git repository (``--git-dir``, bare or not; default
``$HOROVOD_GIT_DIR``) at its ``HEAD``, or from a source tree (``--src``), and extracted into a
temporary folder outside this repository: they are never copied into it. Each suite runs with
pytest under ``sdp-run -n 2`` on the CPU (Gloo), with ``benchmarks/horovod_shim`` mapping
``horovod.torch``, ``horovod.tensorflow``, ``horovod.tensorflow.keras`` and ``horovod.keras``
onto sdp_runtime through the migration's own module table (a missing API fails its test), a
per-test limit (``--test-timeout``) and a hard limit on the whole run (``--suite-timeout``),
after which every process the run started is killed.

The suites need pytest-timeout, ``mock``, ``cloudpickle`` and (for ``test_tensorflow2_keras``)
``parameterized`` in the Python that runs them (``pip install mock cloudpickle parameterized``).

Results: ``benchmarks/results/horovod_suites.md``, one section per ``--label`` (a rerun with
the same label replaces its section): per suite, passed / failed / skipped on rank 0 (rank 1's
counts when they differ), and the failures and skips grouped by reason (GPU-only, MPI-only,
process sets, elastic, Adasum, join, not provided, ...), with the machine and the Horovod commit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHIM = Path(__file__).resolve().parent / "horovod_shim"
RESULTS = REPO / "benchmarks" / "results" / "horovod_suites.md"
SUITES = ("test_torch.py", "test_tensorflow2_keras.py", "test_tensorflow.py",
          "test_tensorflow_keras.py")
#: What the suites import besides the suite files themselves.
SUPPORT = ("test/parallel/base_test_tensorflow.py", "test/utils/common.py")

# Why a test failed or was skipped: first the groups matched on the message alone (what the
# runtime did), then a name the runtime lacks, then the groups matched on test name and message
# (what the test is about); first match wins.
_MESSAGE_GROUPS: tuple[tuple[str, str], ...] = (
    ("init() a second time raised AlreadyInitializedError (Horovod's does nothing)",
     r"AlreadyInitializedError"),
    ("async calls finish at the call (poll() is always True)", r"poll\(\) always returns True"),
    ("the suite vs torch 2.13 / Keras 3 / TF 2.21 (its own calls fail)",
     r"Muon only supports|keras\.optimizers\.legacy|Argument\(s\) not recognized: \{'lr'|"
     r"has no attribute 'mean_squared_error'|object has no attribute 'ref'|"
     r"BaseOptimizer.__init__\(\) missing|ThresholdedReLU|experimental_run_tf_function|"
     r"object has no attribute 'lr'"),
    ("Horovod internals the suite reads (not an API)",
     r"_executing_eagerly|_parameter_names|mpi_ops|_handle_map|_basics|HOROVOD_DYNAMIC"),
    ("timed out (per-test limit)", r"Failed: Timeout >"),
    ("init after shutdown: Gloo could not connect", r"connectFullMesh|could not meet the other"),
)
# (group, pattern on "test name + message"), first match wins: why a test cannot pass here.
_GROUPS: tuple[tuple[str, str], ...] = (
    ("collectives are matched by order, not by name=", r"duplicate_name"),
    ("broadcast_optimizer_state takes no dummy step: gradients stay None",
     r"test_broadcast_state_no_grad"),
    ("GPU-only", r"No GPUs available|not gpu|cuda|GPU|_gpu|fp16_gpu|NCCL|nccl"),
    ("TF1 / graph mode", r"TensorFlow v1 tests|graph mode|tf\.Session|ConfigProto|"
                         r"placeholder|RefVariable|run_all_in_graph|test_session|Not a test"),
    ("MPI-only", r"\bMPI\b|mpi_|Gloo is not available|is_mpi|horovodrun|mpirun"),
    ("process sets", r"process_set|ProcessSet|process sets"),
    ("elastic", r"elastic"),
    ("Adasum", r"[Aa]dasum"),
    ("join", r"\bjoin\b|_join"),
    ("Product", r"Product"),
    ("timeline", r"timeline"),
    ("backward_passes_per_step > 1 (Keras 3: gradient_accumulation_steps)",
     r"backward_passes_per_step > 1"),
    ("an error of another type (MismatchError / ValueError where Horovod raises its own)",
     r"MismatchError|_error\b|not raised"),
    ("gradients through TF collectives (not provided)",
     r"gradient 0\.0 differs|None values not supported|'float' and 'NoneType'|_grad_cpu"),
)


@dataclass
class Outcome:
    name: str
    status: str  # passed / failed / skipped
    message: str = ""


@dataclass
class SuiteResult:
    suite: str
    seconds: float
    exit_status: int | None
    ranks: dict[int, list[Outcome]] = field(default_factory=dict)
    note: str = ""
    limits: str = ""
    runtime: str = ""  # where the runtime under test came from
    collected: int = 0  # tests the suite has


def extract(args: argparse.Namespace, into: Path) -> str:
    """Write Horovod's suites and helpers under ``into/test/...``; return the commit (or src)."""
    git_dir = args.git_dir or os.environ.get("HOROVOD_GIT_DIR")
    files = [f"test/parallel/{s}" for s in SUITES] + list(SUPPORT)
    if args.src:
        src = Path(args.src)
        for f in files:
            if (src / f).exists():
                (into / f).parent.mkdir(parents=True, exist_ok=True)
                (into / f).write_bytes((src / f).read_bytes())
        try:
            return subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], check=True,
                                  capture_output=True, text=True).stdout.strip()
        except (subprocess.CalledProcessError, FileNotFoundError):
            return f"source tree {src}"
    if not git_dir:
        sys.exit("horovod_suites.py: give --git-dir (a Horovod git repository, e.g. a clone of "
                 "github.com/horovod/horovod) or --src (a Horovod source tree)")
    git = ["git", f"--git-dir={git_dir}"]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True,
                            text=True).stdout.strip()
    for f in files:
        shown = subprocess.run([*git, "show", f"HEAD:{f}"], capture_output=True)
        if shown.returncode == 0:
            (into / f).parent.mkdir(parents=True, exist_ok=True)
            (into / f).write_bytes(shown.stdout)
    return commit


def run_suite(suite: Path, work: Path, args: argparse.Namespace) -> SuiteResult:
    """Run one suite under ``sdp-run -n 2``, again with the tests left whenever a test broke the
    job (``pytest_rank.py`` exits then); kill the whole run at ``--suite-timeout``."""
    reports = work / f"reports-{suite.stem}"
    reports.mkdir(parents=True, exist_ok=True)
    log = work / f"{suite.stem}.log"
    start = time.monotonic()
    note, status, attempts = "", None, 0
    left: list[str] | None = None  # None: the whole suite
    while True:
        attempts += 1
        remaining = args.suite_timeout - (time.monotonic() - start)
        if remaining <= 0:
            note = f"stopped at the {args.suite_timeout} s limit of the whole run"
            break
        status = _launch(suite, reports, log, left, remaining, args)
        if status is None:
            note = f"stopped at the {args.suite_timeout} s limit of the whole run"
            break
        collected = reports / "collected.json"
        if not collected.exists():
            break
        done = {o.name for o in read_outcomes(reports / "rank0.jsonl") if o.status != "unfinished"}
        todo = [t for t in json.loads(collected.read_text()) if t.replace("::", ".") not in done]
        if not todo or todo == left:  # finished, or no progress
            break
        left = todo
    if attempts > 1:
        note = (note + "; " if note else "") + (
            f"run in {attempts} launches: a test that left the job unusable (a collective timed "
            "out or lost its peer) ends a launch, and the next one starts with the tests left")
    limits = (f"{args.test_timeout} s per test, {args.suite_timeout} s for the suite, "
              f"{args.collective_timeout} s per collective (SDP_TIMEOUT); launch variables as "
              f"{'mpirun' if args.mode == 'mpi' else 'horovodrun --gloo'} sets them")
    result = SuiteResult(suite.name, time.monotonic() - start, status, note=note, limits=limits,
                         runtime=_runtime_commit(_runtime_file()))
    (reports / "meta.json").write_text(json.dumps(
        {"seconds": result.seconds, "exit_status": status, "note": note, "limits": limits,
         "runtime": result.runtime}))
    return collect(suite, reports, result, log)


def _launch(suite: Path, reports: Path, log: Path, tests: list[str] | None, limit: float,
            args: argparse.Namespace) -> int | None:
    """One ``sdp-run -n 2`` of the suite (or of ``tests``); its exit status, None if killed."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="2",
               TF_CPP_MIN_LOG_LEVEL="2", SDP_BACKEND="gloo", CUDA_VISIBLE_DEVICES="",
               SDP_TIMEOUT=str(args.collective_timeout), HOROVOD_SUITE_MODE=args.mode,
               HOROVOD_SUITE_TEST_TIMEOUT=str(args.test_timeout),
               PYTHONPATH=os.pathsep.join(filter(None, [str(SHIM),
                                                        env.get("PYTHONPATH", "")])))
    sdp_run = Path(sys.executable).with_name("sdp-run")
    command = [str(sdp_run), "-n", "2", "--master-port", str(args.port),
               "--local-ranks-filter", "0", "--output-dir", str(reports / "output"),
               str(SHIM / "pytest_rank.py"), str(suite), str(reports)]
    if tests is not None:
        listed = reports / "left.json"
        listed.write_text(json.dumps(tests))
        command.append(str(listed))
    with open(log, "ab") as out:
        proc = subprocess.Popen(command, env=env, cwd=suite.parent, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            return None
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def collect(suite: Path, reports: Path, result: SuiteResult, log: Path) -> SuiteResult:
    """Read every rank's outcomes of a suite's run into ``result``."""
    for rank in (0, 1):
        report = reports / f"rank{rank}.jsonl"
        if report.exists():
            result.ranks[rank] = read_outcomes(report)
    collected = reports / "collected.json"
    if collected.exists():
        result.collected = len(json.loads(collected.read_text()))
    if not result.ranks:
        tail = log.read_text(errors="replace")[-1500:]
        result.note = (result.note + "; " if result.note else "") + f"no report; log tail: {tail!r}"
    return result


def read_outcomes(path: Path) -> list[Outcome]:
    """Each test's outcome from a rank's JSON lines (``pytest_rank.py``): failed if a phase
    failed, skipped if one was skipped, passed if its call passed, else unfinished (the run was
    stopped while it ran)."""
    tests: dict[str, Outcome] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        name = record["test"].replace("::", ".")
        outcome = tests.setdefault(name, Outcome(name, "unfinished"))
        status = record["outcome"]
        if status == "failed" and outcome.status != "failed":
            outcome.status, outcome.message = "failed", record["message"]
        elif status == "skipped" and outcome.status == "unfinished":
            outcome.status, outcome.message = "skipped", record["message"]
        elif status == "passed" and outcome.status == "unfinished":
            outcome.status = "passed"
    return list(tests.values())


def group_of(outcome: Outcome) -> str:
    """The reason group of a failure or skip (see ``_GROUPS``); else what the message says."""
    if outcome.status == "unfinished":
        return "still running when the suite's time limit stopped it"
    text = f"{outcome.name} {outcome.message}"
    for group, pattern in _MESSAGE_GROUPS:
        if re.search(pattern, outcome.message):
            return group
    missing = re.search(r"module '(?:sdp_runtime|horovod)[\w.]*' has no attribute '(\w+)'|"
                        r"cannot import name '(\w+)' from '(?:sdp_runtime|horovod)",
                        outcome.message)
    if missing:
        return f"not provided: {missing.group(1) or missing.group(2)}"
    for group, pattern in _GROUPS:
        if re.search(pattern, text):
            return group
    if outcome.status == "skipped":
        return "skipped by the suite"
    return "other"


def short(message: str, limit: int = 160) -> str:
    message = message.replace("|", "\\|")
    return message if len(message) <= limit else message[: limit - 3] + "..."


def render(label: str, commit: str, r: SuiteResult, args: argparse.Namespace) -> str:
    """The section ``## label: suite``: counts per rank, then failures and skips by reason."""
    import sdp_runtime

    counts = {rank: Counter(o.status for o in outs) for rank, outs in r.ranks.items()}
    lines = [
        f"## {label}: test/parallel/{r.suite}",
        "",
        f"- Horovod commit `{commit}` (its `test/parallel/{r.suite}`, unmodified); sdp_runtime "
        f"{sdp_runtime.__version__} from {r.runtime}",
        f"- machine: {platform.node()} ({platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, {_versions()}); `sdp-run -n 2`, Gloo on the CPU; "
        f"limits {r.limits}; ran {r.seconds:.0f} s",
        "",
        "| rank | passed | failed | skipped | unfinished | never ran |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for rank, c in sorted(counts.items()):
        never = max(r.collected - sum(c.values()), 0)
        lines.append(f"| {rank} | {c['passed']} | {c['failed']} | {c['skipped']} | "
                     f"{c['unfinished']} | {never} |")
    lines.append("")
    if r.note:
        lines += [f"Note: {short(r.note, 2000)}", ""]
    outs = r.ranks.get(0) or next(iter(r.ranks.values()), [])
    by_group: dict[tuple[str, str], list[Outcome]] = defaultdict(list)
    for o in outs:
        if o.status != "passed":
            by_group[(o.status, group_of(o))].append(o)
    if not by_group:
        lines.append("Every test passed." if outs else "No test ran.")
        return "\n".join(lines) + "\n"
    lines += ["| status | reason | tests | first message |", "| --- | --- | --- | --- |"]
    for (status, group), members in sorted(by_group.items()):
        names = ", ".join(o.name.rpartition(".")[2] for o in members)
        lines.append(f"| {status} | {group} ({len(members)}) | {short(names, 1500)} | "
                     f"{short(members[0].message)} |")
    return "\n".join(lines) + "\n"


def _runtime_file() -> str:
    import sdp_runtime

    return str(sdp_runtime.__file__)


def _runtime_commit(init_file: str) -> str:
    """The commit of the checkout the runtime was imported from, and whether it had changes."""
    runtime = Path(init_file).resolve().parent
    git = ["git", "-C", str(runtime)]
    try:
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run([*git, "status", "--porcelain", "--", "."], check=True,
                               capture_output=True, text=True).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return f"`{runtime}` (not a git checkout)"
    return f"sdp-convert commit `{head}`" + (" with uncommitted changes" if dirty else "")


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for name in ("torch", "tensorflow-cpu", "tensorflow", "keras"):
        with contextlib.suppress(PackageNotFoundError):
            found.append(f"{name} {version(name)}")
    return ", ".join(found)


def write_section(title: str, text: str) -> None:
    """Put ``text`` in the results file as the section ``## title`` (replacing an older one)."""
    head = ("# Horovod's own test suites against sdp_runtime\n\n"
            "Written by `benchmarks/horovod_suites.py` (see its docstring). Counts are rank 0's; "
            "each failure and skip is grouped by its reason.\n")
    old = RESULTS.read_text() if RESULTS.exists() else head
    parts = re.split(r"(?m)^(?=## )", old)
    kept = [p for p in parts[1:] if not p.startswith(f"## {title}\n")]
    RESULTS.write_text(parts[0].rstrip() + "\n\n" + "\n".join(p.rstrip() + "\n" for p in
                                                              [*kept, text]))


def render_kept(args: argparse.Namespace, work: Path) -> int:
    """Write the sections of the runs kept in ``work`` again (after a change of the grouping)."""
    commit = (work / "commit.txt").read_text().strip()
    for name in args.suite or SUITES:
        suite = work / "test" / "parallel" / name
        reports = work / f"reports-{suite.stem}"
        if not (reports / "meta.json").exists():
            continue
        meta = json.loads((reports / "meta.json").read_text())
        result = SuiteResult(name, meta["seconds"], meta["exit_status"], note=meta["note"],
                             limits=meta["limits"], runtime=meta["runtime"])
        result = collect(suite, reports, result, work / f"{suite.stem}.log")
        write_section(f"{args.label}: test/parallel/{name}",
                      render(args.label, commit, result, args))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True, help="section name, e.g. before / after")
    parser.add_argument("--git-dir", help="a Horovod git repository (bare or not)")
    parser.add_argument("--src", help="a Horovod source tree, instead of --git-dir")
    parser.add_argument("--suite", action="append", choices=SUITES,
                        help="run only this suite (repeatable); default all")
    parser.add_argument("--test-timeout", type=int, default=120)
    parser.add_argument("--suite-timeout", type=int, default=2400)
    parser.add_argument("--collective-timeout", type=int, default=30)
    parser.add_argument("--port", type=int, default=29731)
    parser.add_argument("--mode", choices=("gloo", "mpi"), default="gloo",
                        help="launch variables as horovodrun --gloo sets them (the suites shut "
                             "down and init again around each test), or as mpirun does (one "
                             "init for the whole suite, the suites' MPI code paths)")
    parser.add_argument("--keep", help="keep the extracted suites and logs in this folder")
    parser.add_argument("--render-only", action="store_true",
                        help="do not run: write the results of the runs kept in --keep again")
    args = parser.parse_args()
    work = Path(args.keep or tempfile.mkdtemp(prefix="horovod-suites-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.render_only:
        return render_kept(args, work)
    commit = extract(args, work)
    (work / "commit.txt").write_text(commit)
    for name in args.suite or SUITES:
        suite = work / "test" / "parallel" / name
        if not suite.exists():
            print(f"{name}: not in this Horovod tree, skipped", file=sys.stderr)
            continue
        print(f"running {name} ...", file=sys.stderr, flush=True)
        result = run_suite(suite, work, args)
        write_section(f"{args.label}: test/parallel/{name}",
                      render(args.label, commit, result, args))
        counts = Counter(o.status for o in result.ranks.get(0, []))
        print(f"  {dict(counts)} in {result.seconds:.0f} s {result.note[:300]}", file=sys.stderr)
    print(f"wrote {RESULTS.relative_to(REPO)} (work files in {work})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
