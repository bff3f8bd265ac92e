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
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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

    0 when every rank succeeded; the failing rank's exit status (1 for a signal) when one
    failed; 2 for a usage error.

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
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    torchrun_argv = torchrun_args(p, args, _count_nproc(p), log_dir)
    try:
        torchrun.run(torchrun.get_args_parser().parse_args(torchrun_argv))
    except ChildFailedError as error:
        rank, failure = error.get_first_failure()
        if failure.exitcode < 0:
            why, status = f"was killed by signal {failure.signal_name()}", 1
        else:
            why, status = f"exited with status {failure.exitcode}", failure.exitcode or 1
        sys.stdout.flush()
        print(
            f"sdp-run: rank {rank} {why} (its output above shows why); the other ranks "
            "were stopped.",
            file=sys.stderr,
        )
        return status
    return 0


if __name__ == "__main__":
    sys.exit(main())
