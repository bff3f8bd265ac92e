"""CPython's word on a source: the converter never parses code CPython rejects, and never
returns code that CPython rejects when the input was accepted.

libcst's native parser has limits of its own (5,000 nested parentheses crash it, taking the
process down), and it accepts some code CPython refuses (``return`` outside a function,
``nonlocal`` at module level): CPython's full ``compile`` runs first, and its error (message,
line, column) is what the user sees. Compiling costs a fraction of what libcst's parse does
(``benchmarks/bench_long_files.py``).
"""

from __future__ import annotations

import ast
import io
import tokenize
import warnings

from .changes import ConversionError


def check(data: bytes, *, notebook: bool = False) -> None:
    """Raise ``ConversionError`` (CPython's message and position) unless CPython compiles
    ``data``. ``notebook``: the joined code cells of a notebook, where IPython allows a
    top-level ``await``."""
    if b"\0" in data[:8192]:
        raise ConversionError("binary file (contains NUL bytes)")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        text = data.decode(encoding)
    except SyntaxError as err:  # an unknown or inconsistent coding cookie
        raise ConversionError(f"cannot decode file: {err.msg}") from None
    except (UnicodeDecodeError, LookupError) as err:
        raise ConversionError(f"cannot decode file: {err}") from None
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT if notebook else 0
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes and the like: not ours to say
            compile(text.removeprefix("\ufeff"), "<source>", "exec", flags=flags,
                    dont_inherit=True)
    except SyntaxError as err:
        if not err.lineno:  # the coding cookie itself is wrong: there is no position
            raise ConversionError(f"cannot decode file: {err.msg}") from None
        raise ConversionError(
            f"syntax error: {err.msg}", err.lineno, max(err.offset or 1, 1)
        ) from None
    except (RecursionError, MemoryError) as err:
        raise ConversionError(
            f"CPython cannot compile it: {type(err).__name__}: {err} (nested too deeply)"
        ) from None
    except ValueError as err:  # NUL bytes further in
        raise ConversionError(f"cannot decode file: {err}") from None


def check_output(output: bytes, *, notebook: bool = False) -> None:
    """Raise ``ConversionError`` if a conversion's ``output`` (of an input that compiled)
    does not compile: the file is then left as it was."""
    try:
        check(output, notebook=notebook)
    except ConversionError as err:
        where = f" at line {err.line}" if err.line else ""
        raise ConversionError(
            f"internal error: the converted code does not compile ({err.message}{where}); "
            "the file is left as it is (please report)"
        ) from None
