"""``sdp-run``: start a converted script on N processes per machine, through torchrun.

    sdp-run -n 4 train.py --epochs 3                    # 4 processes on this machine
    sdp-run -n 2 train.ipynb                            # a notebook's code cells (_notebook)
    sdp-run -np 4 train.py                              # the same, as horovodrun/mpirun write it
    sdp-run -n 8 --nnodes 2 --node-rank 0 --rdzv-endpoint host0:29500 train.py   # on host0
    sdp-run -n 8 --nnodes 2 --node-rank 1 --rdzv-endpoint host0:29500 train.py   # on host1
    sdp-run -np 16 -H host0:8,host1:8 train.py          # the same, on each of the two hosts
    srun --ntasks-per-node=1 sdp-run train.py           # SLURM: nodes, node rank, host from SLURM

This is a thin front end to ``torch.distributed.run`` (torchrun): it works out the flags, hands
them to torchrun's own parser and ``run``, prefixes each output line with the rank
(``[rank3]: ``), and turns a failed rank into one short message and a non-zero exit status
(the failing rank's output, traceback included, is shown as it happens; torchrun stops the other
ranks). torch is imported only when launching, so ``sdp-run --help`` is quick, and a machine
without torch gets one line naming the extra to install. While the machines of a ``--nnodes N``
job meet, a line every few seconds names the missing ones, and one line ends a job whose
machines never all came (``_rollcall``); each rank is started through a bootstrap that ends it,
and what it started, if ``sdp-run`` is killed with SIGKILL (``_lifeline``).

Defaults: on one machine a free port is chosen automatically (torchrun's ``localhost:0``
rendezvous). Inside a SLURM job step the number of nodes, this node's rank and the rendezvous
host come from SLURM, and on SageMaker from ``SM_HOSTS``/``SM_CURRENT_HOST``. ``-n`` defaults to
the number of GPUs on this machine, else SLURM's tasks per node (``SM_NUM_GPUS`` on SageMaker),
else 1. ``OMP_NUM_THREADS``, when not set, is the machine's cores divided by the processes on it
(at least 1), instead of torchrun's warning and 1.

Unlike ``horovodrun``, ``sdp-run`` starts processes on this machine only: with ``-H``/``--hostfile``
it is run once on every host (by hand, ``pdsh``, ``srun`` or ``mpirun`` with one task per host),
finds which host it is on, and takes that host's share of the processes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import sys
import tempfile
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import _cells, _env, _lifeline, _rollcall

_PREFIX_TEMPLATE = "[rank${rank}]: "

EXIT_USAGE = 2
#: The machines of a multi-machine job never all met (one line names the missing ones).
EXIT_RENDEZVOUS = 1
#: The torchrun.logs_specs entry point (pyproject.toml) that writes --output-dir's files.
_RANK_FILES_SPEC = "sdp-rank-files"
#: The torch loggers whose lines on a failed rank repeat what sdp-run says itself.
_QUIET_LOGGERS = (
    "torch.distributed.elastic.multiprocessing.api",
    "torch.distributed.elastic.agent.server.api",
    "torch.multiprocessing.spawn",  # notebook_launcher's processes
)


@dataclass(frozen=True)
class Plan:
    """What to start on this machine (the result of flags plus environment defaults)."""

    nproc: int | None  # None: one per GPU here, else ``nproc_without_gpus``
    nnodes: int  # with ``max_nodes``: the fewest machines the job starts with
    node_rank: int
    endpoint: str | None  # HOST:PORT of node 0; None on one machine (automatic free port)
    nproc_without_gpus: int = 1
    #: ``--nnodes MIN:MAX``: an elastic job of MIN to MAX machines, whose node ranks the
    #: rendezvous assigns (torchrun's c10d rendezvous); None for a fixed number.
    max_nodes: int | None = None


def build_parser() -> argparse.ArgumentParser:
    """The ``sdp-run`` command line."""
    parser = argparse.ArgumentParser(
        prog="sdp-run",
        description="Run a (converted) training script on several processes, on one machine or "
        "many, through torchrun. Each output line is prefixed with its rank; if a rank fails, "
        "the others are stopped and sdp-run exits with a non-zero status.",
        epilog="Environment: SDP_BACKEND (nccl|gloo), SDP_TIMEOUT (seconds, default 300), "
        "SDP_BUCKET_MB (default 25) are read by the processes; OMP_NUM_THREADS defaults to the "
        "cores here divided by the processes here. Under SLURM (inside srun, one sdp-run per "
        "node) and SageMaker the node flags default from the environment. Exit status: 0, the "
        "status of the rank that failed first, 1 when the machines never all met, 130/143 when "
        "sdp-run is stopped by SIGINT/SIGTERM, 2 for a usage error, 3 when --audit=strict found "
        "a problem.",
    )
    parser.add_argument("-n", "--nproc-per-node", "--nproc_per_node", dest="nproc", type=int,
                        metavar="N", help="processes on this machine (default: GPUs here, else "
                        "SLURM tasks per node, else 1)")
    parser.add_argument("-np", dest="total", type=int, metavar="N",
                        help="processes in all, as horovodrun and mpirun count them: with -H or "
                        "--hostfile filled host by host up to each host's slots, with --nnodes K "
                        "N/K per machine")
    hosts = parser.add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", dest="hosts", metavar="HOST:SLOTS,...",
                       help="the machines of the job and their processes (slots), horovodrun's "
                       "syntax; run sdp-run on each of them")
    hosts.add_argument("--hostfile", metavar="FILE",
                       help="the machines, one a line: 'host slots=N' or 'host:N' (# comments)")
    parser.add_argument("--nnodes", metavar="N|MIN:MAX",
                        help="number of machines (default 1, or SLURM's); MIN:MAX for an elastic "
                        "job whose node ranks the rendezvous assigns")
    parser.add_argument("--node-rank", "--node_rank", dest="node_rank", type=int,
                        help="this machine's index, 0 to nnodes-1 (default 0, SLURM's, or this "
                        "host's place in -H)")
    parser.add_argument("--rdzv-endpoint", "--rdzv_endpoint", "--master", dest="endpoint",
                        metavar="HOST:PORT", help="address of machine 0, where the processes meet "
                        "(needed with --nnodes > 1 outside SLURM/SageMaker/-H)")
    parser.add_argument("--master-addr", "--master_addr", dest="master_addr", metavar="HOST",
                        help="torchrun's spelling of the endpoint's host (port: --master-port)")
    parser.add_argument("--master-port", "--master_port", dest="master_port", type=int,
                        metavar="PORT", help=f"the endpoint's port (default {_env.DEFAULT_PORT})")
    parser.add_argument("-m", "--module", action="store_true",
                        help="run SCRIPT as a module, like python -m")
    parser.add_argument("--no-python", "--no_python", dest="no_python", action="store_true",
                        help="run SCRIPT as a program (not with python), like torchrun "
                        "--no-python")
    parser.add_argument("--no-prefix", action="store_true",
                        help="do not prefix output lines with [rankN]:")
    parser.add_argument("--local-ranks-filter", "--local_ranks_filter", dest="ranks_filter",
                        metavar="RANKS", help="show only these local ranks' output on the "
                        "console, e.g. 0 for rank 0's only on one machine (torchrun's flag)")
    parser.add_argument("--output-dir", metavar="DIR",
                        help="also write each rank's output to DIR/rank<N>.stdout and "
                        "DIR/rank<N>.stderr (N: the global rank), as it happens")
    parser.add_argument("--log-dir", help="also keep each rank's stdout/stderr in this folder, "
                        "in torchrun's layout (<run id>/attempt_<k>/<local rank>/)")
    parser.add_argument("--max-restarts", type=int, default=0,
                        help="restart all processes this many times after a failure (default 0)")
    parser.add_argument("--audit", dest="audit", action="store_const", const="on",
                        help="check while the job trains that the ranks train one model on "
                        "different data (gradients, weights, steps, files; see docs/audit.md, 'The "
                        "audit'); --audit=strict also exits with status 3 when it finds a problem")
    for value in ("on", "strict"):  # --audit=strict (argparse matches the whole string first)
        parser.add_argument(f"--audit={value}", dest="audit", action="store_const", const=value,
                            help=argparse.SUPPRESS)
    parser.add_argument("--audit-report", metavar="FILE",
                        help="with --audit: also write the audit's report to FILE as JSON")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("script", metavar="SCRIPT", help="the training script (or module with "
                        "-m); a notebook (.ipynb) runs its code cells in order")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="arguments for the script")
    return parser


def _version() -> str:
    from . import __version__

    return str(__version__)


def plan(
    args: argparse.Namespace,
    environ: Mapping[str, str] | None = None,
    local_names: Collection[str] | None = None,
) -> Plan:
    """Combine the flags with -H / SLURM / SageMaker defaults; raise ValueError on nonsense.

    ``local_names`` are this machine's names and addresses (found when None), to find it in -H.

    Example:
        >>> plan(build_parser().parse_args(["-n", "2", "train.py"]), {})
        Plan(nproc=2, nnodes=1, node_rank=0, endpoint=None, nproc_without_gpus=1, max_nodes=None)
    """
    env = os.environ if environ is None else environ
    _check_flags(args)
    rendezvous_timeout(env)  # SDP_TIMEOUT=abc is a usage error here, not a traceback later
    if args.nproc is not None and args.total is not None:
        raise ValueError("give -n (per machine) or -np (in all), not both")
    if args.endpoint and (args.master_addr or args.master_port):
        raise ValueError("give --rdzv-endpoint or --master-addr/--master-port, not both")
    min_nodes, max_nodes = _nnodes(args.nnodes)
    if args.hosts or args.hostfile:
        return _plan_hosts(args, min_nodes, local_names)
    defaults = _cluster_defaults(env)
    nnodes = min_nodes if min_nodes is not None else defaults.nnodes
    node_rank = args.node_rank if args.node_rank is not None else defaults.node_rank
    endpoint = _endpoint(args) or defaults.endpoint
    nproc = args.nproc if args.nproc is not None else defaults.nproc
    elastic = max_nodes is not None and max_nodes != nnodes
    if args.total is not None:
        if elastic:
            raise ValueError("-np needs a fixed number of machines; use -n with --nnodes MIN:MAX")
        if args.total < 1 or args.total % nnodes:
            raise ValueError(f"-np {args.total} is not a multiple of --nnodes {nnodes}")
        nproc = args.total // nnodes
    if elastic:
        if args.node_rank is not None:
            raise ValueError("with --nnodes MIN:MAX the rendezvous assigns node ranks: "
                             "leave out --node-rank")
        if not endpoint:
            raise ValueError("--nnodes MIN:MAX needs --rdzv-endpoint HOST:PORT (or "
                             "--master-addr), where the machines meet")
    elif nnodes < 1 or not 0 <= node_rank < nnodes:
        raise ValueError(f"--node-rank {node_rank} is not within --nnodes {nnodes}")
    if nproc is not None and nproc < 1:
        raise ValueError("-n must be at least 1")
    if (nnodes > 1 or elastic) and not endpoint:
        raise ValueError("several machines need --rdzv-endpoint HOST:PORT (the address of node 0)")
    if endpoint:
        _check_endpoint(endpoint)
    explicit = _endpoint(args)
    chosen = endpoint if nnodes > 1 or elastic or explicit else None
    return Plan(nproc, nnodes, 0 if elastic else node_rank, chosen, defaults.nproc_without_gpus,
                max_nodes if elastic else None)


def _check_flags(args: argparse.Namespace) -> None:
    if args.max_restarts < 0:
        raise ValueError(f"--max-restarts {args.max_restarts}: give 0 or more restarts")
    if args.module and args.no_python:
        raise ValueError("--module and --no-python cannot be combined")
    if args.ranks_filter and not re.fullmatch(r"\d+(,\d+)*", args.ranks_filter):
        raise ValueError(f"--local-ranks-filter {args.ranks_filter!r} is not a list like 0 or 0,1")
    if args.no_prefix and args.output_dir:
        # torchrun shows a tee'd stream with a prefix of its own when none is set.
        raise ValueError("--output-dir shows the output with its [rankN]: prefix; "
                         "leave out --no-prefix")


def _nnodes(text: str | None) -> tuple[int | None, int | None]:
    if text is None:
        return None, None
    low, sep, high = text.partition(":")
    try:
        first, last = int(low), int(high) if sep else int(low)
    except ValueError:
        raise ValueError(f"--nnodes {text!r} is not N or MIN:MAX") from None
    if not 1 <= first <= last:
        raise ValueError(f"--nnodes {text!r}: need 1 <= MIN <= MAX")
    return first, (last if sep else None)


def _endpoint(args: argparse.Namespace) -> str | None:
    if args.endpoint:
        return str(args.endpoint)
    if args.master_addr:
        return f"{args.master_addr}:{args.master_port or _env.DEFAULT_PORT}"
    if args.master_port:
        return f"127.0.0.1:{args.master_port}"
    return None


def _check_endpoint(endpoint: str) -> None:
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--rdzv-endpoint {endpoint!r} is not HOST:PORT")


def parse_hosts(spec: str) -> list[tuple[str, int]]:
    """horovodrun's ``-H host1:4,host2:4`` (``host`` alone: 1 slot).

    Example:
        >>> parse_hosts("node1:4,node2")
        [('node1', 4), ('node2', 1)]
    """
    hosts = []
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        host, sep, slots = item.rpartition(":") if ":" in item else (item, "", "1")
        if sep and not slots.isdigit():
            raise ValueError(f"-H {item!r}: slots must be a number (HOST:SLOTS)")
        if not host or int(slots) < 1:
            raise ValueError(f"-H {item!r}: need HOST:SLOTS with at least one slot")
        hosts.append((host, int(slots)))
    if not hosts:
        raise ValueError("-H names no host")
    return hosts


def read_hostfile(path: str) -> list[tuple[str, int]]:
    """A hostfile as horovodrun and Open MPI read it: ``host slots=N`` (or ``host:N``) a line.

    Example:
        >>> read_hostfile("hosts.txt")   # "node1 slots=4\\nnode2 slots=4  # spare\\n"
        [('node1', 4), ('node2', 4)]
    """
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as err:
        raise ValueError(f"--hostfile {path}: {err.strerror}") from None
    items = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"(\S+)(?:\s+slots\s*=\s*(\d+))?", line)
        if match is None:
            raise ValueError(f"--hostfile {path}:{number}: expected 'host slots=N', got {raw!r}")
        host, slots = match.groups()
        items.append(f"{host}:{slots}" if slots else host)
    if not items:
        raise ValueError(f"--hostfile {path} names no host")
    return parse_hosts(",".join(items))


def _local_names() -> set[str]:
    names = {"localhost", "127.0.0.1", "::1"}
    for name in (socket.gethostname(), socket.getfqdn()):
        names |= {name, name.split(".")[0]}
        with contextlib.suppress(OSError):  # a name that does not resolve
            names |= set(socket.gethostbyname_ex(name)[2])
    return names


def _plan_hosts(
    args: argparse.Namespace, min_nodes: int | None, local_names: Collection[str] | None
) -> Plan:
    hosts = parse_hosts(args.hosts) if args.hosts else read_hostfile(args.hostfile)
    if args.nproc is not None:
        raise ValueError("with -H/--hostfile each host's slots say how many processes it runs; "
                         "use -np for the total")
    slots = [n for _, n in hosts]
    total = args.total if args.total is not None else sum(slots)
    if not 1 <= total <= sum(slots):
        raise ValueError(f"-np {total} is more than the {sum(slots)} slots of the hosts")
    shares, left = [], total  # hosts are filled in order, as horovodrun does
    for n in slots:
        shares.append(min(n, left))
        left -= shares[-1]
    used = [(host, share) for (host, _), share in zip(hosts, shares, strict=True) if share]
    if min_nodes is not None and min_nodes != len(used):
        raise ValueError(f"--nnodes {min_nodes} disagrees with the {len(used)} hosts used")
    if args.node_rank is not None:
        node_rank = args.node_rank
        if not 0 <= node_rank < len(used):
            raise ValueError(f"--node-rank {node_rank} is not within the {len(used)} hosts used")
    else:
        names = _local_names() if local_names is None else set(local_names)
        mine = [i for i, (host, _) in enumerate(used) if host in names]
        if len(mine) != 1:
            listed = ", ".join(host for host, _ in used)
            what = "none" if not mine else "more than one"
            raise ValueError(f"this machine ({socket.gethostname()}) is {what} of the hosts "
                             f"used ({listed}): give --node-rank")
        node_rank = mine[0]
    # The first host is machine 0, where the others meet, unless the flags name another.
    first = f"{used[0][0]}:{args.master_port or _env.DEFAULT_PORT}"
    endpoint = _endpoint(args) if args.endpoint or args.master_addr else first
    _check_endpoint(endpoint)
    return Plan(used[node_rank][1], len(used), node_rank,
                endpoint if len(used) > 1 or _endpoint(args) else None)


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
    nnodes = f"{p.nnodes}:{p.max_nodes}" if p.max_nodes is not None else str(p.nnodes)
    out = ["--nproc-per-node", str(nproc), "--nnodes", nnodes]
    if p.max_nodes is not None:
        # Elastic: the c10d rendezvous admits MIN to MAX machines and numbers them itself; the
        # id is the same on every machine because they all name the same endpoint.
        out += ["--rdzv-backend", "c10d", "--rdzv-endpoint", p.endpoint or "",
                "--rdzv-id", f"sdp-run-{p.endpoint}"]
    elif p.nnodes == 1 and not p.endpoint:
        out += ["--standalone"]  # c10d rendezvous on a free port of this machine
    else:
        out += ["--rdzv-backend", "static", "--rdzv-endpoint", p.endpoint or "",
                "--node-rank", str(p.node_rank)]
    timeout = rendezvous_timeout(os.environ)
    if timeout is not None and "--standalone" not in out:
        out += ["--rdzv-conf", f"timeout={max(int(timeout), 1)}"]
    out += ["--max-restarts", str(args.max_restarts), "--log-dir", log_dir]
    if args.output_dir:
        out += ["--logs-specs", _RANK_FILES_SPEC, "--redirects", "3"]
    if not args.no_prefix:
        out += ["--tee", "3"]  # torchrun writes each rank's streams with the line prefix
    else:
        out += ["--redirects", "0"]
    if args.ranks_filter:
        out += ["--local-ranks-filter", args.ranks_filter]
    if args.no_python:
        out += ["--no-python"]
    if args.module:
        out += ["--module"]
    return [*out, args.script, *args.script_args]


def rendezvous_timeout(env: Mapping[str, str]) -> float | None:
    """``SDP_TIMEOUT`` in seconds (None when not set); ValueError when it is not a positive number.

    Example:
        >>> rendezvous_timeout({"SDP_TIMEOUT": "30"})
        30.0
    """
    raw = env.get("SDP_TIMEOUT", "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"SDP_TIMEOUT={raw!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise ValueError(f"SDP_TIMEOUT={raw!r} must be a positive number of seconds")
    return value


def _count_nproc(p: Plan) -> int:
    if p.nproc is not None:
        return p.nproc
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return gpus or p.nproc_without_gpus


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``sdp-run``; returns the exit status.

    0 when every rank succeeded; the exit status of the rank that failed first (128 + N when it
    was killed by signal N) when one failed; 1 when the machines of a ``--nnodes N`` job never
    all met; 130 / 143 when stopped by SIGINT / SIGTERM; 2 for a usage error or a machine without
    torch; 3 when ``--audit=strict`` found a problem in a job that otherwise succeeded.

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
    if not args.module and not args.no_python and not os.path.exists(args.script):
        print(f"sdp-run: error: no such script: {args.script}", file=sys.stderr)
        return EXIT_USAGE
    if is_notebook(args):
        try:
            _cells.read(args.script)  # a broken notebook is one line here, not N tracebacks
        except (OSError, ValueError) as error:
            print(f"sdp-run: error: {error}", file=sys.stderr)
            return EXIT_USAGE
        args = run_notebook(args)
    quiet = "TORCH_CPP_LOG_LEVEL" not in os.environ
    if quiet:  # sdp-run's own process only: the store client's retry warnings, every second
        os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"
    try:
        import torch  # noqa: F401 - only to say clearly when it is missing
    except ImportError as error:
        missing = getattr(error, "name", None) == "torch"
        why = "torch is not installed" if missing else f"torch cannot be imported ({error})"
        print(f"sdp-run: error: {why}; sdp-run and the runtime need it: "
              "pip install torch (from a checkout: pip install -e '.[torch]')", file=sys.stderr)
        return EXIT_USAGE
    finally:
        if quiet:  # read once, when torch loads: the ranks keep torch's default
            os.environ.pop("TORCH_CPP_LOG_LEVEL", None)
    if not args.no_prefix:
        os.environ.setdefault("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", _PREFIX_TEMPLATE)
        os.environ["SDP_RUN_PREFIXED"] = "1"  # tells the ranks' sdp.init() not to add another
    if args.output_dir:
        os.makedirs(args.output_dir, exist_ok=True)
        os.environ["SDP_RUN_OUTPUT_DIR"] = os.path.abspath(args.output_dir)
    if args.audit or args.audit_report or os.environ.get("SDP_AUDIT"):
        from ._audit import launcher

        return launcher.run_audited(args, lambda: _launch_in_log_dir(p, args))
    return _launch_in_log_dir(p, args)


def is_notebook(args: argparse.Namespace) -> bool:
    """Whether SCRIPT is a Jupyter notebook (``.ipynb``) to run as a program."""
    return not args.module and not args.no_python and args.script.endswith(".ipynb")


def run_notebook(args: argparse.Namespace) -> argparse.Namespace:
    """The same flags, each rank running the notebook's code cells (``sdp_runtime._notebook``).

    Example:
        >>> run_notebook(build_parser().parse_args(["train.ipynb", "--lr", "1"])).script_args
        ['train.ipynb', '--lr', '1']
    """
    return argparse.Namespace(**{**vars(args), "module": True, "script": "sdp_runtime._notebook",
                                 "script_args": [args.script, *args.script_args]})


def _launch_in_log_dir(p: Plan, args: argparse.Namespace) -> int:
    if args.log_dir:
        return _launch(p, args, args.log_dir)
    with tempfile.TemporaryDirectory(prefix="sdp-run-") as log_dir:
        return _launch(p, args, log_dir)


def _launch(p: Plan, args: argparse.Namespace, log_dir: str) -> int:
    from torch.distributed import DistError
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError

    nproc = _count_nproc(p)
    # torchrun would warn and use 1; the cores shared among this machine's processes is the
    # sensible default (PyTorch and TensorFlow size their thread pools from it).
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, _cores() // nproc)))
    # Each rank through a bootstrap that ends it (and what it started) if sdp-run is killed.
    torchrun_argv = _lifeline.wrap(torchrun_args(p, args, nproc, log_dir), len(args.script_args),
                                   module=args.module, no_python=args.no_python)
    roll_call = _roll_call(p, nproc)
    with tempfile.TemporaryDirectory(prefix="sdp-run-exits-") as reports:
        os.environ["SDP_RUN_REPORT_DIR"] = reports  # where a failing rank says why (sdp_runtime)
        try:
            if roll_call is not None:
                roll_call.start()
            with quiet_torch_logs():
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
        except (DistError, RendezvousError) as error:  # the machines did not (all) meet
            sys.stdout.flush()
            if roll_call is not None:
                roll_call.stop()
                print(roll_call.failure_line(error), file=sys.stderr)
            else:
                first = (str(error).strip().splitlines() or [type(error).__name__])[0]
                where = f" at {p.endpoint}" if p.endpoint else ""
                print(f"sdp-run: error: the rendezvous{where} failed: {first}", file=sys.stderr)
            return EXIT_RENDEZVOUS
        finally:
            if roll_call is not None:
                roll_call.stop()
    return 0


@contextlib.contextmanager
def quiet_torch_logs() -> Iterator[None]:
    """Without torch's own log lines on a failure (``E1128 ... elastic/multiprocessing/api.py:
    failed (exitcode: 1) ...`` and the SIGTERM sent to the other ranks): the launcher says it in
    one line of its own. ``LOGLEVEL`` set (torchrun's variable) leaves torch's logging alone."""
    if os.environ.get("LOGLEVEL"):
        yield
        return
    import logging

    loggers = [logging.getLogger(name) for name in _QUIET_LOGGERS]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for log, level in zip(loggers, levels, strict=True):
            log.setLevel(level)


def _roll_call(p: Plan, nproc: int) -> _rollcall.RollCall | None:
    """The thread that says which machine is missing, for a fixed number of machines > 1."""
    if p.nnodes < 2 or p.max_nodes is not None or not p.endpoint:
        return None
    timeout = rendezvous_timeout(os.environ)
    return _rollcall.RollCall(p.endpoint, p.nnodes, p.node_rank, nproc,
                              timeout or _rollcall.TORCHRUN_DEFAULT_TIMEOUT_S,
                              timeout_set=timeout is not None)


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
    if code in stopped and report.get("error") and not report.get("caused_by_peer"):
        # It raised first, then torchrun stopped it while it was still exiting (every rank
        # raised at about the same time): its status is an uncaught exception's, 1, not 143,
        # which is reserved for sdp-run itself stopped by SIGTERM.
        how, status = f"exit status 1; stopped by {failure.signal_name()} as it exited", 1
    elif code < 0:
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
