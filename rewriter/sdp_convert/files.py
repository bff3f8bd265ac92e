"""Finding, reading and writing files safely.

Reading refuses what cannot be a Python source (binary, huge, unreadable) with one clear message;
writing is atomic (a temporary file in the same directory, then ``os.replace``), keeps the file's
mode and owner, refuses read-only files, and never writes through a symlink. Walking a tree skips
VCS folders, virtualenvs, build output, what ``.gitignore`` ignores and what ``--exclude`` names.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import os
import stat
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
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


def read_regular(path: Path) -> bytes | None:
    """The bytes of ``path`` if it is a regular file (not through a symlink), else None.

    Opened without blocking and checked on the open descriptor: a FIFO or a device named
    ``*.py`` (a neighbour read for project mode too) is never waited on, nor read.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags | getattr(os, "O_BINARY", 0))
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            return None
        return handle.read()


def read_source(path: Path) -> bytes:
    """The bytes of ``path``, or ``ConversionError``/``Skip`` with a one-line reason."""
    if os.path.islink(path):
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
        data = read_regular(path)
    except OSError as err:
        raise ConversionError(f"cannot read: {err.strerror}") from None
    if data is None:  # swapped for a FIFO or a device since the stat above
        raise ConversionError("not a regular file")
    if is_generated(data):
        raise Skip("marked @generated")
    return data


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path``'s content with ``data`` atomically, keeping its mode and owner.

    An interrupted run leaves either the old file or the new one, never a truncated one. A file
    without write permission is refused (as an editor would), even for root, who could replace
    it: the user marked it read-only. A file whose owner cannot be kept (another user's file in
    a directory we may write) is refused rather than silently taken over.
    """
    if os.path.islink(path):
        raise ConversionError("refusing to write through a symlink")
    directory = path.parent if str(path.parent) else Path(".")
    try:
        st: os.stat_result | None = path.stat()
    except FileNotFoundError:
        st = None
    if st is not None:
        mode = stat.S_IMODE(st.st_mode)
        # root passes os.access(W_OK) whatever the mode, so the mode bits are checked too.
        if not mode & 0o222 or not os.access(path, os.W_OK):
            raise ConversionError("read-only file, not replaced")
    else:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".sdp-tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if st is not None and (st.st_uid, st.st_gid) != (os.getuid(), os.getgid()):
            try:
                os.chown(tmp, st.st_uid, st.st_gid)
            except PermissionError:
                raise ConversionError(
                    f"owned by another user (uid {st.st_uid}), whose ownership cannot be kept; "
                    "not replaced"
                ) from None
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@dataclass(frozen=True)
class Excluder:
    """``--exclude`` globs: a path is left out when a glob matches its name, its path relative
    to the directory being walked, its path as the user wrote it, or its path relative to
    ``base`` (the directory of the pyproject.toml the globs came from). A glob ending in ``/``
    matches directories only, as in ``.gitignore``."""

    globs: tuple[str, ...] = ()
    base: Path | None = None

    def matches(self, path: Path, rel: str, is_dir: bool) -> bool:
        if not self.globs:
            return False
        names = {path.name, rel, path.as_posix()}
        if self.base is not None:
            with contextlib.suppress(ValueError):
                names.add(path.absolute().relative_to(self.base).as_posix())
        for glob in self.globs:
            if glob.endswith("/"):
                if not is_dir:
                    continue
                glob = glob.rstrip("/")
            glob = glob.removeprefix("./")
            if any(fnmatch.fnmatchcase(n, glob) for n in names):
                return True
        return False


@dataclass
class _GitIgnore:
    """The ``.gitignore`` rules that apply under one directory, nearest last (git's order)."""

    specs: list[tuple[Path, object]] = field(default_factory=list)

    def ignored(self, path: Path, is_dir: bool) -> bool:
        path = path.absolute()
        for base, spec in reversed(self.specs):  # the deepest file that has a say wins
            rel = path.relative_to(base).as_posix() + ("/" if is_dir else "")
            verdict = spec.check_file(rel).include  # type: ignore[attr-defined]
            if verdict is not None:
                return bool(verdict)
        return False

    def below(self, directory: Path) -> _GitIgnore:
        directory = directory.absolute()
        spec = _read_gitignore(directory / ".gitignore")
        return _GitIgnore([*self.specs, (directory, spec)]) if spec is not None else self


def _read_gitignore(file: Path) -> object | None:
    try:
        lines = file.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    import pathspec

    return pathspec.GitIgnoreSpec.from_lines(lines)


def _gitignore_above(root: Path) -> _GitIgnore:
    """The rules that apply at ``root``: inside a git work tree, every ``.gitignore`` from the
    top of the work tree down to ``root`` (and ``.git/info/exclude``); outside one, none."""
    root = root.absolute()
    chain = [root, *root.parents]
    top = next((d for d in chain if os.path.exists(d / ".git")), None)
    if top is None:
        return _GitIgnore()
    rules = _GitIgnore()
    exclude = _read_gitignore(top / ".git" / "info" / "exclude")
    if exclude is not None:
        rules.specs.append((top, exclude))
    for directory in reversed(chain[: chain.index(top) + 1]):
        if directory != root:
            rules = rules.below(directory)
    return rules


def _is_virtualenv(directory: Path) -> bool:
    # os.path.exists, not Path.exists: an unreadable directory is "no", not a PermissionError.
    return os.path.exists(directory / "pyvenv.cfg")


def is_ignored_by_git(path: Path) -> bool:
    """Whether ``.gitignore`` rules of the work tree around ``path`` ignore it (or a parent)."""
    path = path.absolute()
    return _rules_in(path.parent).ignored(path, os.path.isdir(path))


@functools.lru_cache(maxsize=4096)
def _rules_in(directory: Path) -> _GitIgnore:
    # Read once per directory and run: pre-commit names every file, often 1,000s in a few folders.
    return _gitignore_above(directory).below(directory)


def forget_gitignores() -> None:
    """Read ``.gitignore`` files afresh from now on (a new run in the same process)."""
    _rules_in.cache_clear()


def walk(
    root: Path,
    excluder: Excluder = Excluder(),
    *,
    gitignore: bool = True,
    prune: Sequence[Path] = (),
    errors: list[tuple[Path, str]] | None = None,
) -> Iterator[tuple[Path, bool]]:
    """Yield ``(path, is_source)`` for every file under ``root``, in a stable order.

    Skips VCS folders, virtualenvs, build output, ``.gitignore``d paths (when ``gitignore``),
    ``excluder`` matches and the directories in ``prune`` (an output directory inside the input
    tree). ``is_source`` is True for ``.py``/``.ipynb`` files that are not symlinks. A directory
    that cannot be listed is appended to ``errors`` as ``(path, reason)`` and the walk goes on.
    """
    pruned = {p.resolve() for p in prune}
    above = _gitignore_above(root) if gitignore else _GitIgnore()
    if above.ignored(root, True):
        # The user named an ignored directory (a virtualenv's lib, a checkout's build tree):
        # like a file named on the command line, it is converted; its own .gitignore files
        # still apply inside it.
        above = _GitIgnore()
    rules = {root: above.below(root) if gitignore else above}

    def on_error(err: OSError) -> None:
        if errors is not None:
            errors.append((Path(err.filename or root), err.strerror or str(err)))

    for current, dirs, files in os.walk(root, onerror=on_error):
        here = Path(current)
        here_rules = rules.pop(here)
        kept = []
        for d in sorted(dirs):
            sub = here / d
            if (
                d in SKIP_DIRS
                or _is_virtualenv(sub)
                or (pruned and sub.resolve() in pruned)
                or excluder.matches(sub, sub.relative_to(root).as_posix(), True)
                or (gitignore and here_rules.ignored(sub, True))
            ):
                continue
            kept.append(d)
            rules[sub] = here_rules.below(sub) if gitignore else here_rules
        dirs[:] = kept
        for name in sorted(files):
            path = here / name
            rel = path.relative_to(root).as_posix()
            if excluder.matches(path, rel, False):
                continue
            if gitignore and here_rules.ignored(path, False):
                continue
            yield path, name.endswith(SOURCE_SUFFIXES) and not os.path.islink(path)
