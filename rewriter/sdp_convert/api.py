"""The Python API: convert a source held in memory, for programs that embed the converter
(notebook extensions, CI bots, editors).

Example:
    >>> from sdp_convert import convert
    >>> result = convert(open("train.py").read(), lr_scaling="sqrt")
    >>> result.changed, result.text[:40]
    >>> for change in result.changes:
    ...     print(change.line, change.transform, change.message, change.manual)
"""

from __future__ import annotations

import io
import tokenize
from collections.abc import Iterable
from dataclasses import dataclass

from .changes import Change, ConversionError

__all__ = ["Change", "ConversionError", "ConvertResult", "convert"]


@dataclass(frozen=True)
class ConvertResult:
    """What ``convert`` returns.

    ``source`` and ``output`` are bytes as they would be written (PEP 263 coding cookies and a
    UTF-8 BOM are kept); ``text`` is the output decoded. ``changes`` lists every edit and every
    spot a person must look at (``manual``), with the line and column of the *original* source.
    ``kind`` is what the source was judged to be (``torch``, ``keras``, ``horovod (torch)``,
    ``not a training script``, ``already distributed (DeepSpeed)``, ...) and ``reason`` why.
    """

    source: bytes
    output: bytes
    changes: tuple[Change, ...]
    kind: str
    reason: str

    @property
    def changed(self) -> bool:
        return self.output != self.source

    @property
    def manual(self) -> tuple[Change, ...]:
        """The spots a person must look at."""
        return tuple(c for c in self.changes if c.manual)

    @property
    def text(self) -> str:
        """The output as text, decoded as Python decodes the file."""
        encoding, _ = tokenize.detect_encoding(io.BytesIO(self.output).readline)
        return self.output.decode(encoding).removeprefix("\ufeff")


def convert(
    source: str | bytes,
    *,
    lr_scaling: str = "linear",
    framework: str = "auto",
    rank0_output: str = "progress",
    only: Iterable[str] = (),
    skip: Iterable[str] = (),
    notebook: bool = False,
    line_length: int = 88,
) -> ConvertResult:
    """Convert one Python source (or, with ``notebook=True``, one ``.ipynb`` document).

    Arguments:
        source: the code; ``str`` is encoded as UTF-8, ``bytes`` are read as Python reads a file.
        lr_scaling: ``"linear"`` (times ``size()``), ``"sqrt"`` or ``"none"``.
        framework: ``"auto"`` (detect), ``"torch"`` or ``"tensorflow"``.
        rank0_output: what shows on rank 0 only: ``"progress"`` (tqdm bars), ``"all"`` (also
            ``print``, through ``sdp.rank0_print``) or ``"none"``.
        only, skip: transform names (``sdp-convert --list-transforms``) to run only / leave out.
        notebook: ``source`` is a Jupyter notebook (JSON); its code cells are converted.
        line_length: changed lines longer than this are laid out by black (the CLI reads it
            from the file's ``pyproject.toml``).

    Raises ``ConversionError`` (``.message``, ``.line``, ``.col``) for a source that cannot be
    converted (a syntax error, an undecodable file), and ``ValueError`` for a bad argument.
    The output parses, and converting it again changes nothing.

    Example:
        >>> result = convert("import torch\\n...")
        >>> print(result.text)
    """
    from .base import Options
    from .pipeline import PIPELINE
    from .runner import convert_bytes

    if lr_scaling not in ("linear", "sqrt", "none"):
        raise ValueError(f"lr_scaling must be linear, sqrt or none, not {lr_scaling!r}")
    if rank0_output not in ("progress", "all", "none"):
        raise ValueError(f"rank0_output must be progress, all or none, not {rank0_output!r}")
    if framework not in ("auto", "torch", "tensorflow"):
        raise ValueError(f"framework must be auto, torch or tensorflow, not {framework!r}")
    if isinstance(line_length, bool) or not isinstance(line_length, int) or line_length < 1:
        raise ValueError(f"line_length must be a whole number of at least 1, not {line_length!r}")
    only_names, skip_names = frozenset(only), frozenset(skip)
    unknown = (only_names | skip_names) - {t.NAME for t in PIPELINE}
    if unknown:
        raise ValueError(f"unknown transform {', '.join(sorted(unknown))}")
    options = Options(lr_scaling=lr_scaling, framework=framework,  # type: ignore[arg-type]
                      rank0_output=rank0_output,  # type: ignore[arg-type]
                      only=only_names, skip=skip_names, line_length=line_length)
    data = source.encode("utf-8") if isinstance(source, str) else source
    result = convert_bytes(data, "source.ipynb" if notebook else "source.py", options)
    return ConvertResult(data, result.output, tuple(result.changes), result.info.label,
                         result.info.reason)
