"""SageMaker model parallelism's (SMP's) configuration and the process layout it implies.

SMP scripts get their configuration from ``smp.init(config)`` or, on SageMaker, from the
``modelparallel`` parameters of the estimator, which reach the process as the JSON of
``SM_HP_MP_PARAMETERS``. Both are read here (an explicit ``config`` wins key by key). Keys
(SMP v1 names; the v2 names in parentheses are accepted too):

* ``partitions`` (``pipeline_parallel_degree``): pipeline partitions of one model replica;
* ``tensor_parallel_degree``; ``sharded_data_parallel_degree``;
* ``microbatches``: how many pieces ``@smp.step`` splits each batch into (default 1);
* ``ddp``, ``horovod``, ``auto_partition``, ``default_partition``, ``pipeline``, ``optimize``,
  ``placement_strategy``, ``fp16``, ``bf16``, ...: accepted; the layout does not depend on them.

The layout: ``mp_size = partitions * tensor_parallel_degree`` consecutive ranks hold one model
replica (SMP's MP_GROUP), ``dp_size = size // mp_size`` replicas train on different data.
``mp_rank = rank % mp_size``, ``dp_rank = rank // mp_size``; with one partition that is plain data
parallelism (``mp_rank() == 0``, ``dp_rank() == rank()``). The ranks of one MP_GROUP (or of one
sharded-data-parallel group) shard the model's parameters with FSDP instead of splitting it into
pipeline stages: ``shard_size`` ranks, ``replicas = size // shard_size`` groups.

Nothing here imports torch or TensorFlow.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ENV_VAR = "SM_HP_MP_PARAMETERS"

_ALIASES = {"pipeline_parallel_degree": "partitions"}


@dataclass(frozen=True)
class Config:
    """The SMP settings the runtime acts on, and the rest as given."""

    partitions: int = 1
    tensor_parallel_degree: int = 1
    sharded_data_parallel_degree: int = 1
    microbatches: int = 1
    raw: Mapping[str, Any] | None = None

    @property
    def mp_size(self) -> int:
        return self.partitions * self.tensor_parallel_degree

    @property
    def sharded(self) -> bool:
        """Whether the model is sharded (FSDP) rather than replicated on every rank."""
        return self.mp_size > 1 or self.sharded_data_parallel_degree > 1


def read(config: Mapping[str, Any] | None = None,
         environ: Mapping[str, str] | None = None) -> Config:
    """The configuration: ``SM_HP_MP_PARAMETERS`` (JSON), then ``config`` over it.

    Arguments:
        config: the dict given to ``smp.init(config)``, or None.
        environ: the environment (default ``os.environ``).

    Raises:
        ValueError: ``SM_HP_MP_PARAMETERS`` is not a JSON object, or a degree is not a positive
            integer.

    Example:
        >>> read({"partitions": 2, "microbatches": 4}).mp_size
        2
    """
    env = os.environ if environ is None else environ
    merged: dict[str, Any] = {}
    text = env.get(ENV_VAR, "").strip()
    if text:
        try:
            loaded = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{ENV_VAR} is not JSON: {error}") from None
        if not isinstance(loaded, dict):
            raise ValueError(f"{ENV_VAR} must be a JSON object, not {type(loaded).__name__}")
        merged.update(loaded)
    if config:
        merged.update(config)
    for old, new in _ALIASES.items():
        if old in merged:
            merged.setdefault(new, merged[old])
    return Config(
        partitions=_positive(merged, "partitions"),
        tensor_parallel_degree=_positive(merged, "tensor_parallel_degree"),
        sharded_data_parallel_degree=_positive(merged, "sharded_data_parallel_degree"),
        microbatches=_positive(merged, "microbatches"),
        raw=merged,
    )


def _positive(values: Mapping[str, Any], key: str) -> int:
    value = values.get(key, 1)
    if value is None:
        return 1
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"SMP configuration: {key}={value!r} is not an integer") from None
    if number < 1 or number != float(value):
        raise ValueError(f"SMP configuration: {key}={value!r} must be a positive integer")
    return number


@dataclass(frozen=True)
class Layout:
    """Ranks of one job under a configuration (see the module docstring)."""

    rank: int
    size: int
    config: Config

    def __post_init__(self) -> None:
        for what, degree in (("partitions x tensor_parallel_degree", self.config.mp_size),
                             ("sharded_data_parallel_degree", self.shard_size)):
            if self.size % degree:
                raise ValueError(
                    f"SMP configuration: {what} = {degree} does not divide the number of "
                    f"processes ({self.size}); launch a multiple of it (sdp-run -n N)"
                )

    @property
    def mp_size(self) -> int:
        return self.config.mp_size

    @property
    def mp_rank(self) -> int:
        return self.rank % self.mp_size

    @property
    def dp_size(self) -> int:
        return self.size // self.mp_size

    @property
    def dp_rank(self) -> int:
        return self.rank // self.mp_size

    @property
    def tp_size(self) -> int:
        return self.config.tensor_parallel_degree

    @property
    def tp_rank(self) -> int:
        return self.mp_rank % self.tp_size

    @property
    def pp_size(self) -> int:
        return self.config.partitions

    @property
    def pp_rank(self) -> int:
        return self.mp_rank // self.tp_size

    @property
    def rdp_size(self) -> int:
        """SMP's reduced data parallelism: the ranks holding the same tensor-parallel slice."""
        return self.size // self.tp_size

    @property
    def rdp_rank(self) -> int:
        return self.rank // self.tp_size

    @property
    def shard_size(self) -> int:
        """Ranks that shard one copy of the parameters (FSDP); 1 when nothing is sharded."""
        return self.config.mp_size * self.config.sharded_data_parallel_degree

    @property
    def replicas(self) -> int:
        return self.size // self.shard_size

    def mp_group(self) -> list[int]:
        """The ranks holding the same model replica as this one (SMP's ``get_mp_group()``)."""
        first = self.dp_rank * self.mp_size
        return list(range(first, first + self.mp_size))

    def dp_group(self) -> list[int]:
        """The ranks holding the same partition as this one (SMP's ``get_dp_group()``)."""
        return list(range(self.mp_rank, self.size, self.mp_size))
