"""Option values that need no conversion are taken as they are, without loading pydantic.

typer 0.29 converts every option's value through a pydantic ``TypeAdapter``, built on first use
(``typer._coercion.build_runtime_param``), and click hands it every option of the command, given
or not: a plain ``sdp-convert --check DIR`` built 20 adapters, and importing pydantic to build
them was 0.12 s of a 0.28 s warm run (``benchmarks/results/cli_speed.md``). Only a ``bool``
option whose value is already a bool is spared, so no way of declaring the options avoids it.

``Command`` (the command's class, ``app.command(cls=Command)``) gives each option a stand-in for
typer's converter that answers, as typer's would, for the values whose conversion is the
identity: an absent value (None, or ``()`` for a list), a string for a ``str`` option, a list or
tuple of strings for a ``list[str]`` one, a member of the option's Enum (a default). Any other
value (what the user typed for ``--jobs`` or ``--lr-scaling``, say) goes to typer's own
converter, built then: its checks and its error messages are typer's.

It reads two private names of typer 0.27-0.29 (``_runtime_param`` and ``type_descriptor`` of a
parameter); with a typer that has neither (0.16-0.26: click converts) it does nothing.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, get_args, get_origin

import typer.core


class _IdentityFirst:
    """Stands in for typer's ``RuntimeParam`` of one parameter until a value needs it."""

    def __init__(self, annotation: Any) -> None:
        self.annotation = annotation

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        if value is None:  # as typer's RuntimeParam.coerce
            return () if param.multiple or param.nargs == -1 else None
        if _identity(self.annotation, value):
            return list(value) if isinstance(value, (list, tuple)) else value
        from typer._coercion import build_runtime_param

        param._runtime_param = build_runtime_param(param.type_descriptor)
        return param._runtime_param.coerce(value, param=param, ctx=ctx)


def _identity(annotation: Any, value: Any) -> bool:
    """Whether typer's conversion of ``value`` to ``annotation`` gives ``value`` back (a list
    for a tuple of strings)."""
    if annotation is str:
        return type(value) is str
    if get_origin(annotation) is list and get_args(annotation) == (str,):
        return isinstance(value, (list, tuple)) and all(type(v) is str for v in value)
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return type(value) is annotation
    return False


class Command(typer.core.TyperCommand):
    """typer's command, whose options convert their values without pydantic where they can."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        params: list[Any] = self.get_params(ctx)  # with -h/--help, which typer adds
        for param in params:
            if getattr(param, "_runtime_param", False) is None and hasattr(
                param, "type_descriptor"
            ):
                param._runtime_param = _IdentityFirst(param.type_descriptor.annotation)
        return super().parse_args(ctx, args)
