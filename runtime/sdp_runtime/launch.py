"""``sdp-run``: start a converted script on N processes per machine, through torchrun.

    sdp-run -n 4 train.py --epochs 3                    # 4 processes on this machine
    sdp-run -n 8 --nnodes 2 --node-rank 0 --rdzv-endpoint host0:29500 train.py   # on host0
    sdp-run -n 8 --nnodes 2 --node-rank 1 --rdzv-endpoint host0:29500 train.py   # on host1
    srun --ntasks-per-node=1 sdp-run train.py           # SLURM: nodes, node rank, host from SLURM

This is a thin front end to ``torch.distributed.run`` (torchrun): it works out the flags, hands
them to torchrun's own parser and ``run``, prefixes each output line with the rank
(``[rank3]: ``), and turns a failed rank into one short message and a non-zero exit status
(the failing rank's output, traceback included, is shown as it happens; torchrun stops the other
ranks). torch is imported only when launching, so ``sdp-run --help`` is quick.

Defaults: on one machine a free port is chosen automatically (torchrun's ``localhost:0``
rendezvous). Inside a SLURM job step the number of nodes, this node's rank and the rendezvous
host come from SLURM, and on SageMaker from ``SM_HOSTS``/``SM_CURRENT_HOST``. ``-n`` defaults to
the number of GPUs on this machine, else SLURM's tasks per node (``SM_NUM_GPUS`` on SageMaker),
else 1.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import _env

_PREFIX_TEMPLATE = "[rank${rank}]: "

EXIT_USAGE = 2


@dataclass(frozen=True)
class Plan:
    """What to start on this machine (the result of flags plus environment defaults)."""

    nproc: int | None  # None: one per GPU here, else ``nproc_without_gpus``
    nnodes: int
    node_rank: int
    endpoint: str | None  # HOST:PORT of node 0; None on one machine (automatic free port)
    nproc_without_gpus: int = 1


def build_parser() -> argparse.ArgumentParser:
    """The ``sdp-run`` command line."""
    parser = argparse.ArgumentParser(
        prog="sdp-run",
        description="Run a (converted) training script on several processes, on one machine or "
        "many, through torchrun. Each output line is prefixed with its rank; if a rank fails, "
        "the others are stopped and sdp-run exits with a non-zero status.",
        epilog="Environment: SDP_BACKEND (nccl|gloo), SDP_TIMEOUT (seconds, default 300), "
        "SDP_BUCKET_MB (default 25) are read by the processes. Under SLURM (inside srun, one "
        "sdp-run per node) and SageMaker the node flags default from the environment.",
    )
    parser.add_argument("-n", "--nproc-per-node", "--nproc_per_node", dest="nproc", type=int,
                        help="processes on this machine (default: GPUs here, else SLURM tasks "
                        "per node, else 1)")
    parser.add_argument("--nnodes", type=int, help="number of machines (default 1, or SLURM's)")
    parser.add_argument("--node-rank", "--node_rank", dest="node_rank", type=int,
                        help="this machine's index, 0 to nnodes-1 (default 0, or SLURM's)")
    parser.add_argument("--rdzv-endpoint", "--rdzv_endpoint", "--master", dest="endpoint",
                        metavar="HOST:PORT", help="address of machine 0, where the processes meet "
                        "(needed with --nnodes > 1 outside SLURM/SageMaker)")
    parser.add_argument("-m", "--module", action="store_true",
                        help="run SCRIPT as a module, like python -m")
    parser.add_argument("--no-prefix", action="store_true",
                        help="do not prefix output lines with [rankN]:")
    parser.add_argument("--log-dir", help="also keep each rank's stdout/stderr in this folder")
    parser.add_argument("--max-restarts", type=int, default=0,
                        help="restart all processes this many times after a failure (default 0)")
    parser.add_argument("script", metavar="SCRIPT", help="the training script (or module with -m)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="arguments for the script")
    return parser


def plan(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Plan:
    """Combine the flags with SLURM / SageMaker defaults; raise ValueError on nonsense.

    Example:
        >>> plan(build_parser().parse_args(["-n", "2", "train.py"]), {})
        Plan(nproc=2, nnodes=1, node_rank=0, endpoint=None, nproc_without_gpus=1)
    """
    env = os.environ if environ is None else environ
    defaults = _cluster_defaults(env)
    nnodes = args.nnodes if args.nnodes is not None else defaults.nnodes
    node_rank = args.node_rank if args.node_rank is not None else defaults.node_rank
    endpoint = args.endpoint or defaults.endpoint
    nproc = args.nproc if args.nproc is not None else defaults.nproc
    if nnodes < 1 or not 0 <= node_rank < nnodes:
        raise ValueError(f"--node-rank {node_rank} is not within --nnodes {nnodes}")
    if nproc is not None and nproc < 1:
        raise ValueError("-n must be at least 1")
    if nnodes > 1 and not endpoint:
        raise ValueError("several machines need --rdzv-endpoint HOST:PORT (the address of node 0)")
    if endpoint:
        host, _, port = endpoint.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"--rdzv-endpoint {endpoint!r} is not HOST:PORT")
    chosen = endpoint if nnodes > 1 or args.endpoint else None
    return Plan(nproc, nnodes, node_rank, chosen, defaults.nproc_without_gpus)


def _cluster_defaults(env: Mapping[str, str]) -> Plan:
    """Defaults from SLURM (inside a job step) or SageMaker; one machine otherwise."""
    if env.get("SLURM_STEP_NUM_TASKS") and env.get("SLURM_NODEID"):
        nnodes = int(env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_JOB_NUM_NODES") or 1)
        if int(env["SLURM_STEP_NUM_TASKS"]) != nnodes:
            raise ValueError(
                "under SLURM, start sdp-run once per node (srun --ntasks-per-node=1 sdp-run ...); "
                f"this step has {env['SLURM_STEP_NUM_TASKS']} tasks on {nnodes} nodes"
            )
        hosts = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "127.0.0.1"
        job = int(env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or 0)
        port = int(env.get("MASTER_PORT") or _env.DEFAULT_PORT + job % 1000)
        per_node = _env.tasks_per_node(env.get("SLURM_NTASKS_PER_NODE", "")) or [1]
        endpoint = f"{_env.expand_nodelist(hosts)[0]}:{port}"
        return Plan(None, nnodes, int(env["SLURM_NODEID"]), endpoint, per_node[0])
    hosts, current = _env.sagemaker_hosts(env)
    if hosts:
        gpus = int(env.get("SM_NUM_GPUS") or 0)
        port = int(env.get("MASTER_PORT") or _env.DEFAULT_PORT)
        return Plan(gpus or None, len(hosts), hosts.index(current), f"{hosts[0]}:{port}")
    return Plan(None, 1, 0, None)


def torchrun_args(p: Plan, args: argparse.Namespace, nproc: int, log_dir: str) -> list[str]:
    """The equivalent torchrun command line (without the program name).

    Example:
        >>> torchrun_args(Plan(2, 1, 0, None), build_parser().parse_args(["t.py"]), 2, "/tmp/l")[:4]
        ['--nproc-per-node', '2', '--nnodes', '1']
    """
    out = ["--nproc-per-node", str(nproc), "--nnodes", str(p.nnodes)]
    if p.nnodes == 1 and not p.endpoint:
        out += ["--standalone"]  # c10d rendezvous on a free port of this machine
    else:
        out += ["--rdzv-backend", "static", "--rdzv-endpoint", p.endpoint or "",
                "--node-rank", str(p.node_rank)]
        timeout = os.environ.get("SDP_TIMEOUT", "").strip()
        if timeout:
            out += ["--rdzv-conf", f"timeout={max(int(float(timeout)), 1)}"]
    out += ["--max-restarts", str(args.max_restarts), "--log-dir", log_dir]
    if not args.no_prefix:
        out += ["--tee", "3"]  # torchrun writes each rank's streams with the line prefix
    else:
        out += ["--redirects", "0"]
    if args.module:
        out += ["--module"]
    return [*out, args.script, *args.script_args]


def _count_nproc(p: Plan) -> int:
    if p.nproc is not None:
        return p.nproc
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return gpus or p.nproc_without_gpus


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``sdp-run``; returns the exit status.

    0 when every rank succeeded; the exit status of the rank that failed first (128 + N when it
    was killed by signal N) when one failed; 2 for a usage error.

    Example:
        >>> main(["-n", "2", "train.py"])
        0
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        p = plan(args)
    except ValueError as error:
        parser.print_usage(sys.stderr)
        print(f"sdp-run: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    if not args.module and not os.path.exists(args.script):
        print(f"sdp-run: error: no such script: {args.script}", file=sys.stderr)
        return EXIT_USAGE
    if not args.no_prefix:
        os.environ.setdefault("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", _PREFIX_TEMPLATE)
        os.environ["SDP_RUN_PREFIXED"] = "1"  # tells the ranks' sdp.init() not to add another
    if args.log_dir:
        return _launch(p, args, args.log_dir)
    with tempfile.TemporaryDirectory(prefix="sdp-run-") as log_dir:
        return _launch(p, args, log_dir)


def _launch(p: Plan, args: argparse.Namespace, log_dir: str) -> int:
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    torchrun_argv = torchrun_args(p, args, _count_nproc(p), log_dir)
    with tempfile.TemporaryDirectory(prefix="sdp-run-exits-") as reports:
        os.environ["SDP_RUN_REPORT_DIR"] = reports  # where a failing rank says why (sdp_runtime)
        try:
            torchrun.run(torchrun.get_args_parser().parse_args(torchrun_argv))
        except ChildFailedError as error:
            sys.stdout.flush()
            rank, why, status, trace = first_failure(error.failures, _read_reports(reports))
            print(f"sdp-run: rank {rank} failed first: {why}; the other ranks were stopped.",
                  file=sys.stderr)
            if trace:
                lines = trace.rstrip().splitlines()[-20:]
                print(f"sdp-run: rank {rank}'s traceback (end):", file=sys.stderr)
                print("\n".join(f"    {line}" for line in lines), file=sys.stderr)
            return status
        except SignalException as stop:  # Ctrl-C or SIGTERM: torchrun has stopped every rank
            sys.stdout.flush()
            name = signal.Signals(stop.sigval).name
            print(f"sdp-run: stopped by {name}; every rank was stopped.", file=sys.stderr)
            return 128 + int(stop.sigval)
    return 0


def first_failure(
    failures: Mapping[int, Any], reports: Mapping[int, Mapping[str, Any]]
) -> tuple[int, str, int, str]:
    """Which rank failed first, why, the exit status to return and its traceback ('' if none).

    ``failures`` are torchrun's (rank -> ProcessFailure: ``exitcode``, ``timestamp``,
    ``signal_name()``), ``reports`` the records failing ranks wrote (``sdp_runtime._exit``). A
    rank's own recorded error, or a rank that left without a record (``sys.exit``, killed by a
    signal such as SIGKILL), comes before errors that only followed from another rank's exit (a
    collective whose peer left) and ranks stopped with SIGTERM/SIGINT, which is how torchrun stops
    the survivors. Within each of the two classes the earliest wins.

    Example:
        >>> first_failure({1: failure}, {1: {"error": "ValueError: bad batch", "time": 5.0}})
        (1, 'ValueError: bad batch (exit status 1)', 1, '')
    """
    stopped = (-int(signal.SIGTERM), -int(signal.SIGINT))

    def order(rank: int) -> tuple[int, float]:
        report = reports.get(rank)
        when = float((report or {}).get("time", getattr(failures[rank], "timestamp", 0)))
        if report is not None:
            return int(bool(report.get("caused_by_peer"))), when
        return int(int(failures[rank].exitcode) in stopped), when

    rank = min(failures, key=order)
    failure, report = failures[rank], reports.get(rank) or {}
    code = int(failure.exitcode)
    if code < 0:
        how, status = f"killed by signal {failure.signal_name()}", 128 - code
    else:
        how, status = f"exit status {code}", code or 1
    error = report.get("error") or ""
    why = f"{error} ({how})" if error else how
    return rank, why, status, str(report.get("traceback") or "")


def _read_reports(folder: str) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for name in os.listdir(folder):
        if name.startswith("rank") and name.endswith(".json"):
            try:
                with open(os.path.join(folder, name)) as f:
                    record = json.load(f)
                out[int(record["rank"])] = record
            except (OSError, ValueError, KeyError):
                continue
    return out


if __name__ == "__main__":
    sys.exit(main())
