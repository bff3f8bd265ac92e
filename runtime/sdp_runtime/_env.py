"""Who am I: this process's place in the job, read from the launcher's environment variables.

Launchers are tried in order, and the first one whose variables are set wins:

1. torchrun / ``sdp-run``: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
   ``MASTER_ADDR``, ``MASTER_PORT``.
2. SLURM's ``srun``: ``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS`` (or ``SLURM_NTASKS``),
   ``SLURM_LOCALID``, ``SLURM_NTASKS_PER_NODE`` / ``SLURM_STEP_TASKS_PER_NODE``, and the first host
   of ``SLURM_STEP_NODELIST`` / ``SLURM_JOB_NODELIST``. Only inside a job step: in the batch script
   itself those variables describe the allocation, not the processes that are running.
3. Open MPI's ``mpirun`` (``OMPI_COMM_WORLD_*``), then MPICH / Intel MPI (``PMI_RANK``,
   ``PMI_SIZE``, ``MPI_LOCALRANKID``, ``MPI_LOCALNRANKS``).
4. SageMaker: ``SM_HOSTS`` and ``SM_CURRENT_HOST`` (JSON), one process per host.

With none of them set the process is alone: rank 0 of 1, and no launcher is needed.

The rendezvous address, where a launcher gives none, is ``MASTER_ADDR`` / ``MASTER_PORT`` when
set, else the first host of the job and port 29500 (SLURM: 29500 plus the job id modulo 1000, so
that two jobs sharing a node do not collide).

Nothing here imports torch.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_PORT = 29500


@dataclass(frozen=True)
class Placement:
    """Where this process sits in the job.

    ``launcher`` names the environment the numbers came from: ``"torchrun"``, ``"slurm"``,
    ``"mpi"``, ``"sagemaker"`` or ``"none"`` (a single process started without a launcher).
    ``store_from_env`` is true when the launcher already set ``MASTER_ADDR``/``MASTER_PORT`` and
    ``RANK``/``WORLD_SIZE`` for torch's ``env://`` rendezvous (torchrun also hosts the store).
    """

    rank: int
    size: int
    local_rank: int
    local_size: int
    master_addr: str
    master_port: int
    launcher: str
    store_from_env: bool = False

    @property
    def node_rank(self) -> int:
        """Index of this process's machine (Horovod's ``cross_rank``), assuming equal nodes."""
        return self.rank // max(self.local_size, 1)

    @property
    def num_nodes(self) -> int:
        """Number of machines (Horovod's ``cross_size``), assuming equal nodes."""
        return max(self.size // max(self.local_size, 1), 1)


def detect(environ: Mapping[str, str] | None = None) -> Placement:
    """Read this process's placement from ``environ`` (default ``os.environ``).

    Arguments:
        environ: the environment variables to read.

    Example:
        >>> detect({"RANK": "1", "WORLD_SIZE": "2"}).rank
        1
    """
    env = os.environ if environ is None else environ
    for reader in (_torchrun, _slurm, _openmpi, _pmi, _sagemaker):
        placement = reader(env)
        if placement is not None:
            _check(placement)
            return placement
    return Placement(0, 1, 0, 1, "127.0.0.1", DEFAULT_PORT, "none")


def _int(env: Mapping[str, str], *names: str, default: int | None = None) -> int | None:
    """The first of ``names`` that is set, as an int (a clear error when it is not a number)."""
    for name in names:
        value = env.get(name, "").strip()
        if value:
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"environment variable {name}={value!r} is not an integer") \
                    from None
    return default


def _master(env: Mapping[str, str], host: str, port: int = DEFAULT_PORT) -> tuple[str, int]:
    return env.get("MASTER_ADDR") or host, _int(env, "MASTER_PORT", default=port) or port


def _torchrun(env: Mapping[str, str]) -> Placement | None:
    rank, size = _int(env, "RANK"), _int(env, "WORLD_SIZE")
    if rank is None or size is None:
        return None
    local_rank = _int(env, "LOCAL_RANK", default=rank)
    local_size = _int(env, "LOCAL_WORLD_SIZE", default=size)
    addr, port = _master(env, "127.0.0.1")
    from_env = "MASTER_ADDR" in env and "MASTER_PORT" in env
    return Placement(rank, size, local_rank, local_size, addr, port, "torchrun", from_env)  # type: ignore[arg-type]


def _slurm(env: Mapping[str, str]) -> Placement | None:
    rank = _int(env, "SLURM_PROCID")
    size = _int(env, "SLURM_STEP_NUM_TASKS")
    if size is None and (env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID")):
        size = _int(env, "SLURM_NTASKS", "SLURM_NPROCS")
    if rank is None or size is None:
        return None
    node = _int(env, "SLURM_NODEID", default=0) or 0
    local_size = _int(env, "SLURM_NTASKS_PER_NODE")
    if local_size is None:
        spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", "")
        per_node = tasks_per_node(spec)
        local_size = per_node[node] if node < len(per_node) else size
    hosts = (env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
             or env.get("SLURM_NODELIST", ""))
    first = expand_nodelist(hosts)[0] if hosts else "127.0.0.1"
    job = _int(env, "SLURM_JOB_ID", "SLURM_JOBID", default=0) or 0
    addr, port = _master(env, first, DEFAULT_PORT + job % 1000)
    local_rank = _int(env, "SLURM_LOCALID", default=0)
    return Placement(rank, size, local_rank, local_size, addr, port, "slurm")  # type: ignore[arg-type]


def _openmpi(env: Mapping[str, str]) -> Placement | None:
    rank, size = _int(env, "OMPI_COMM_WORLD_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE")
    if rank is None or size is None:
        return None
    local_rank = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK", default=0)
    local_size = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", default=size)
    return _mpi_placement(env, rank, size, local_rank, local_size)  # type: ignore[arg-type]


def _pmi(env: Mapping[str, str]) -> Placement | None:
    rank, size = _int(env, "PMI_RANK"), _int(env, "PMI_SIZE")
    if rank is None or size is None:
        return None
    local_rank = _int(env, "MPI_LOCALRANKID", "PMI_LOCAL_RANK", default=0)
    local_size = _int(env, "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE", default=size)
    return _mpi_placement(env, rank, size, local_rank, local_size)  # type: ignore[arg-type]


def _mpi_placement(
    env: Mapping[str, str], rank: int, size: int, local_rank: int, local_size: int
) -> Placement:
    # mpirun says nothing about where rank 0 runs: on one machine it is here, on several the
    # user must say (MASTER_ADDR), as with Horovod's Gloo mode.
    if local_size < size and "MASTER_ADDR" not in env:
        raise ValueError(
            "started by MPI on several machines: set MASTER_ADDR (and MASTER_PORT) to the address "
            "of rank 0's machine, e.g. mpirun -x MASTER_ADDR=host0 ..."
        )
    addr, port = _master(env, "127.0.0.1")
    return Placement(rank, size, local_rank, local_size, addr, port, "mpi")


def _sagemaker(env: Mapping[str, str]) -> Placement | None:
    hosts, current = sagemaker_hosts(env)
    if not hosts:
        return None
    addr, port = _master(env, hosts[0])
    return Placement(hosts.index(current), len(hosts), 0, 1, addr, port, "sagemaker")


def sagemaker_hosts(env: Mapping[str, str]) -> tuple[list[str], str]:
    """SageMaker's host list and this host (``([], "")`` outside SageMaker).

    Example:
        >>> sagemaker_hosts({"SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_HOST": "algo-2"})
        (['algo-1', 'algo-2'], 'algo-2')
    """
    raw, current = env.get("SM_HOSTS"), env.get("SM_CURRENT_HOST")
    if not raw or not current:
        return [], ""
    try:
        hosts = json.loads(raw)
    except json.JSONDecodeError:
        raise ValueError(f"SM_HOSTS is not a JSON list of host names: {raw!r}") from None
    if not isinstance(hosts, list) or current not in hosts:
        raise ValueError(f"SM_CURRENT_HOST={current!r} is not in SM_HOSTS={raw!r}")
    return [str(h) for h in hosts], current


def _check(p: Placement) -> None:
    if not (p.size >= 1 and 0 <= p.rank < p.size):
        raise ValueError(f"{p.launcher}: rank {p.rank} is not within a world of size {p.size}")
    if not (p.local_size >= 1 and 0 <= p.local_rank < p.local_size):
        raise ValueError(
            f"{p.launcher}: local rank {p.local_rank} is not within a local size of {p.local_size}"
        )


_BRACKET = re.compile(r"^(?P<prefix>[^\[]*)\[(?P<ranges>[^\]]+)\](?P<suffix>.*)$")


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand a SLURM host list such as ``node[01-03,07],gpu5`` into host names.

    One bracket group per name is understood (the common form); zero padding is kept.

    Arguments:
        nodelist: the value of ``SLURM_JOB_NODELIST``.

    Example:
        >>> expand_nodelist("node[01-03],gpu5")
        ['node01', 'node02', 'node03', 'gpu5']
    """
    hosts: list[str] = []
    for item in _split_outside_brackets(nodelist.strip()):
        match = _BRACKET.match(item)
        if not match:
            hosts.append(item)
            continue
        prefix, suffix = match["prefix"], match["suffix"]
        for part in match["ranges"].split(","):
            lo, _, hi = part.partition("-")
            if not hi:
                hosts.append(f"{prefix}{lo}{suffix}")
                continue
            width = len(lo)
            hosts.extend(f"{prefix}{n:0{width}d}{suffix}" for n in range(int(lo), int(hi) + 1))
    if not hosts:
        raise ValueError(f"empty SLURM node list: {nodelist!r}")
    return hosts


def _split_outside_brackets(text: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item for item in items if item]


def tasks_per_node(spec: str) -> list[int]:
    """Expand SLURM's tasks-per-node form ``2(x3),1`` into ``[2, 2, 2, 1]``.

    Example:
        >>> tasks_per_node("2(x3),1")
        [2, 2, 2, 1]
    """
    counts: list[int] = []
    for part in filter(None, spec.split(",")):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            raise ValueError(f"cannot read SLURM tasks per node {spec!r}")
        counts.extend([int(match[1])] * int(match[2] or 1))
    return counts
