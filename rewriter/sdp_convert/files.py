"""Finding, reading and writing files safely.

Reading refuses what cannot be a Python source (binary, huge, unreadable) with one clear message;
writing is atomic (a temporary file in the same directory, then ``os.replace``), keeps the file's
mode, and never writes through a symlink.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import stat
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from .changes import ConversionError

#: Files larger than this are refused: no training script is 10 MB of code.
MAX_BYTES = 10 * 1024 * 1024
#: Directories never descended into.
SKIP_DIRS = frozenset(
    {".git", ".hg", ".svn", ".tox", ".nox", ".venv", "venv", "__pycache__", "build", "dist",
     "node_modules", ".eggs", "site-packages", ".mypy_cache", ".pytest_cache", ".ipynb_checkpoints"}
)
SOURCE_SUFFIXES = (".py", ".ipynb")


class Skip(Exception):
    """A file left alone on purpose (symlink, generated file); not an error."""


def is_generated(data: bytes) -> bool:
    return b"@generated" in data[:4096]


def read_source(path: Path) -> bytes:
    """The bytes of ``path``, or ``ConversionError``/``Skip`` with a one-line reason."""
    if path.is_symlink():
        raise Skip("symlink, not followed")
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ConversionError("no such file") from None
    except OSError as err:
        raise ConversionError(f"cannot read: {err.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise ConversionError("is a directory")
    if not stat.S_ISREG(st.st_mode):
        raise ConversionError("not a regular file")
    if st.st_size > MAX_BYTES:
        raise ConversionError(f"file too large ({st.st_size} bytes; limit {MAX_BYTES})")
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ConversionError(f"cannot read: {err.strerror}") from None
    if is_generated(data):
        raise Skip("marked @generated")
    return data


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path``'s content with ``data`` atomically, keeping its mode.

    An interrupted run leaves either the old file or the new one, never a truncated one.
    """
    if path.is_symlink():
        raise ConversionError("refusing to write through a symlink")
    directory = path.parent if str(path.parent) else Path(".")
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".sdp-tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _excluded(rel: str, name: str, excludes: Sequence[str]) -> bool:
    return any(fnmatch.fnmatch(rel, g) or fnmatch.fnmatch(name, g) for g in excludes)


def _is_virtualenv(directory: Path) -> bool:
    return (directory / "pyvenv.cfg").exists()


def walk(root: Path, excludes: Sequence[str] = ()) -> Iterator[tuple[Path, bool]]:
    """Yield ``(path, is_source)`` for every file under ``root``, in a stable order.

    Skips VCS folders, virtualenvs, build output and ``--exclude`` matches. ``is_source`` is True
    for ``.py``/``.ipynb`` files that are not symlinks.
    """
    for current, dirs, files in os.walk(root):
        here = Path(current)
        dirs[:] = sorted(
            d
            for d in dirs
            if d not in SKIP_DIRS
            and not _is_virtualenv(here / d)
            and not _excluded((here / d).relative_to(root).as_posix(), d, excludes)
        )
        for name in sorted(files):
            path = here / name
            rel = path.relative_to(root).as_posix()
            if _excluded(rel, name, excludes):
                continue
            yield path, name.endswith(SOURCE_SUFFIXES) and not path.is_symlink()
