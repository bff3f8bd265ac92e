"""``[tool.sdp-convert]`` in ``pyproject.toml``: defaults for the command line, as black and ruff
read theirs.

The file is found from the common directory of the paths given (the current directory for stdin,
the directory of ``--stdin-filename``), upwards, stopping at the top of the repository (a
directory with ``.git`` or ``.hg``): the first ``pyproject.toml`` with a ``[tool.sdp-convert]``
table wins. ``--config FILE`` names one instead. Flags on the command line win over the file.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

#: The keys the table may hold, and what kind of value each takes.
KEYS: dict[str, type] = {
    "lr-scaling": str,
    "framework": str,
    "rank0-output": str,
    "only": list,
    "skip": list,
    "exclude": list,
    "extend-exclude": list,
    "force-exclude": bool,
    "respect-gitignore": bool,
    "jobs": int,
    "cache": bool,
    "allow-manual-markers": bool,
}
CHOICES = {
    "lr-scaling": ("linear", "sqrt", "none"),
    "framework": ("auto", "torch", "tensorflow"),
    "rank0-output": ("progress", "all", "none"),
}


class ConfigError(Exception):
    """A configuration file that cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class FileConfig:
    """The table's values (absent keys are absent) and the directory it came from."""

    values: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    @property
    def base(self) -> Path | None:
        return self.path.parent.absolute() if self.path is not None else None

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)


def find(paths: Sequence[str]) -> Path | None:
    """The ``pyproject.toml`` that configures ``paths`` (see the module docstring), or None."""
    dirs = [Path(p).absolute() for p in paths if p != "-"] or [Path.cwd()]
    dirs = [d if os.path.isdir(d) else d.parent for d in dirs]
    start = Path(os.path.commonpath([str(d) for d in dirs]))
    for directory in (start, *start.parents):
        candidate = directory / "pyproject.toml"
        if os.path.isfile(candidate) and _has_table(candidate):
            return candidate
        if os.path.exists(directory / ".git") or os.path.exists(directory / ".hg"):
            return None
    return None


def _has_table(path: Path) -> bool:
    try:
        return "sdp-convert" in _read(path).get("tool", {})
    except ConfigError:
        return True  # report the broken file rather than silently look further up


def _read(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from None


def load(path: Path | None) -> FileConfig:
    """Read and check ``[tool.sdp-convert]`` of ``path`` (None: no file, empty config)."""
    if path is None:
        return FileConfig()
    table = _read(path).get("tool", {}).get("sdp-convert", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.sdp-convert] must be a table")
    values: dict[str, Any] = {}
    for key, value in table.items():
        kind = KEYS.get(key)
        where = f"{path}: [tool.sdp-convert] {key}"
        if kind is None:
            raise ConfigError(
                f"{path}: [tool.sdp-convert] has unknown key {key!r} "
                f"(known: {', '.join(sorted(KEYS))})"
            )
        if kind is list:
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{where}: must be a list of strings")
        elif kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"{where}: must be a whole number of at least 1")
        elif not isinstance(value, kind):
            raise ConfigError(f"{where}: must be {'true or false' if kind is bool else 'a string'}")
        if key in CHOICES and value not in CHOICES[key]:
            raise ConfigError(f"{where}: {value!r} is not one of {', '.join(CHOICES[key])}")
        values[key] = value
    return FileConfig(values, path)
