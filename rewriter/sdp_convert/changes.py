"""The records transforms leave behind: what changed, and what a person must look at."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True, order=True)
class Change:
    """One edit (or one spot needing a person) at a position in the *original* file.

    ``line`` is 1-based and ``col`` 1-based, as editors and ``path:line:col`` messages use them.
    """

    line: int
    col: int
    transform: str
    message: str
    manual: bool = False

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def format(self, path: str) -> str:
        mark = " (manual)" if self.manual else ""
        return f"{path}:{self.line}:{self.col}: [{self.transform}]{mark} {self.message}"


class ConversionError(Exception):
    """A file could not be converted. ``line``/``col`` are 1-based when known."""

    def __init__(self, message: str, line: int | None = None, col: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.col = col

    def format(self, path: str) -> str:
        if self.line is None:
            return f"{path}: {self.message}"
        return f"{path}:{self.line}:{self.col or 1}: {self.message}"
