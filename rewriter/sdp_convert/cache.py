"""Remember what converting a file gave, so that a file seen before is not parsed again.

Like black's cache, but keyed on content, not on paths: an entry's key is a SHA-256 of

* the file's bytes (and whether it is a notebook);
* every field of ``Options`` (read from the dataclass, so a field added later is in the key
  without anyone remembering to add it; ``tests/test_cache.py`` checks each field);
* the converter's identity: ``__version__``, the Python version, and the paths, sizes and
  modification times of every file of the ``sdp_convert`` package and of the installed packages
  that shape the output (libcst; black, when installed). An editable install whose transform
  was edited, or a CI machine reusing its cache after an upgrade, gets new keys, never a stale
  answer;
* extra dependency digests (``deps``): facts from outside the file that change its conversion.
  Today the one such fact travels in ``Options.parallel_importer`` (the file of the run that
  imports this one as a Hogwild worker module). A project mode, where a file's conversion
  depends on the modules it imports, passes a digest of each of those modules' contents (or
  of the facts taken from them) here: an entry is then reused only while they are unchanged.

The entry holds what the user sees: the status (converted or unchanged), the file's kind and
reason, every report entry (manual notes included), and the converted bytes when they differ,
so that ``--check``, ``--diff``, the reports and writing give what a fresh conversion gives.
A file that fails (a syntax error, ...) is remembered with its error (message, line, column), so
that a warm run over a tree with a broken file still loads no converter. A conversion that
changes a file outside project mode also stores what converting its output gives (nothing to
change), so that the run after the file was written is answered here too
(``runner._remember_output``).

The whole-program check keeps its per-file views here too (``get_bytes``/``put_bytes``, keyed by
``runner._view_key``): the same digest, trust and atomic writes, another body.

Trust: what the cache says is never written into a user's file. It may say "this input needs
nothing" and answer ``--check``, ``--diff`` and the reports, but a file is written only from a
conversion done in the run that writes it (``runner.convert_cached``'s ``fresh``), as black does.
Each entry starts with the SHA-256 of the rest of it, checked on every read: a damaged entry
(a flipped bit, a truncated write) is a miss, never an error. Directories are created private
to the user (0700) and entries 0600; an entry or a directory owned by another user, or one that
others may write (group- or world-writable; for the top directory, which the user may have
made: world-writable), is not read, and nothing is stored there (``Cache.trusted``).

Where: ``--cache-dir``, else ``$SDP_CONVERT_CACHE_DIR`` if set, else the user cache directory
(``$XDG_CACHE_HOME`` or ``~/.cache`` on Linux, ``~/Library/Caches`` on macOS,
``%LOCALAPPDATA%`` on Windows), in ``sdp-convert/v2/<2 hex digits>/<key>``. Entries are written
atomically (a temporary file in the same directory, then ``os.replace``): concurrent runs and
``-j N`` workers may store the same key at once, and a reader sees a whole entry or
none. An entry that cannot be read is a miss.

Bounded: a run that stored something removes the oldest entries (by the time they were stored)
once there are more than ``MAX_ENTRIES`` of them or they hold more than ``MAX_BYTES`` (estimated
from one shard directory first, so that the check costs one directory listing). ``--no-cache``
(or ``cache = false`` in ``[tool.sdp-convert]``) bypasses it.

This module imports neither libcst nor the engine: a run that finds every file here does not
load them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import stat
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

from . import __version__
from .changes import Change
from .options import Options

#: Overrides the cache's location (the test suite points it at a temporary directory).
CACHE_DIR_ENV = "SDP_CONVERT_CACHE_DIR"
#: Bumped when the entry format changes (v2: each entry starts with the digest of the rest).
SCHEMA = "v2"
MAX_ENTRIES = 20_000
MAX_BYTES = 64 * 1024 * 1024
#: Installed packages whose code shapes the output besides sdp_convert itself.
OUTPUT_PACKAGES = ("libcst", "black")
#: Temporary files older than this are left-overs of a killed process.
_STALE_TMP_S = 3600


def default_dir() -> Path:
    """Where the cache lives when ``--cache-dir`` says nothing (see the module docstring)."""
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV])
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    elif os.name == "nt":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "sdp-convert"


@dataclass(frozen=True)
class Entry:
    """What converting one source gave: enough to tell the user exactly what a conversion
    would. ``output`` is the source itself when nothing changed."""

    changed: bool
    output: bytes
    kind: str
    reason: str
    changes: tuple[Change, ...]
    #: ``(message, line, column)`` of the ``ConversionError`` converting it raised, if it did.
    error: tuple[str, int | None, int | None] | None = None


def options_key(options: Options) -> dict[str, object]:
    """Every field of ``options``, as JSON-able values (sets sorted), but those marked
    ``cache_key: False`` (facts derived from other files, which enter the key as ``deps``)."""
    key: dict[str, object] = {}
    for f in dataclasses.fields(options):
        if not f.metadata.get("cache_key", True):
            continue
        value = getattr(options, f.name)
        if isinstance(value, (set, frozenset)):
            value = sorted(value)
        key[f.name] = value
    return key


def _files_identity(root: Path, recurse: bool) -> list[tuple[str, int, int]]:
    found: list[tuple[str, int, int]] = []
    for current, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__") if recurse else []
        for name in sorted(files):
            if name.endswith((".py", ".so", ".pyd")):
                path = os.path.join(current, name)
                with contextlib.suppress(OSError):
                    st = os.stat(path)
                    found.append((os.path.relpath(path, root), st.st_size, st.st_mtime_ns))
    return found


@functools.cache
def code_identity(package_dir: str | None = None) -> str:
    """A digest of the code that produces the output (see the module docstring)."""
    digest = hashlib.sha256()
    digest.update(f"{__version__}\0{sys.version}\0".encode())
    own = Path(package_dir) if package_dir else Path(__file__).resolve().parent
    digest.update(json.dumps(_files_identity(own, True)).encode())
    for name in OUTPUT_PACKAGES:
        try:
            spec = find_spec(name)
        except (ImportError, ValueError):  # pragma: no cover - a broken installation
            spec = None
        origin = spec.origin if spec is not None else None
        if origin:
            # The package's top-level files: its version module changes with every release.
            digest.update(f"{name}\0{origin}\0".encode())
            digest.update(json.dumps(_files_identity(Path(origin).parent, False)).encode())
    return digest.hexdigest()


_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def _own(st: os.stat_result, others: int) -> bool:
    """Owned by this user and not writable by the ``others`` bits (no owners on Windows)."""
    getuid = getattr(os, "getuid", None)
    return (getuid is None or st.st_uid == getuid()) and not st.st_mode & others


class Cache:
    """The entries under one directory (``default_dir()`` unless given)."""

    def __init__(
        self,
        directory: Path | str | None = None,
        *,
        max_entries: int = MAX_ENTRIES,
        max_bytes: int = MAX_BYTES,
    ) -> None:
        self.root = Path(directory) if directory else default_dir()
        self.dir = self.root / SCHEMA
        self.max_entries = max_entries
        self.max_bytes = max_bytes

    def key(
        self, data: bytes, name: str, options: Options, deps: Sequence[str | bytes] = ()
    ) -> str:
        """The key of converting ``data`` (a file called ``name``) with ``options``; ``deps``
        are digests of whatever else the conversion depends on (see the module docstring)."""
        context = json.dumps(
            {
                "code": code_identity(),
                "options": options_key(options),
                "notebook": name.endswith(".ipynb"),
                "deps": [d.hex() if isinstance(d, bytes) else d for d in deps],
            },
            sort_keys=True,
        )
        digest = hashlib.sha256(context.encode())
        digest.update(b"\0")
        digest.update(data)
        return digest.hexdigest()

    def _path(self, key: str) -> Path:
        return self.dir / key[:2] / key

    def trusted(self, shard: Path | None = None) -> bool:
        """Whether the cache's directories (and ``shard``, when given) may be read and written:
        owned by this user, and writable by nobody else (see the module docstring). A directory
        that does not exist yet is fine (``put`` creates it private)."""
        for path, others in ((self.root, stat.S_IWOTH), (self.dir, _OTHERS_WRITE),
                             (shard, _OTHERS_WRITE)):
            if path is None:
                continue
            try:
                st = os.stat(path) if path == self.root else os.lstat(path)
            except FileNotFoundError:
                continue
            except OSError:
                return False
            if not stat.S_ISDIR(st.st_mode) or not _own(st, others):
                return False
        return True

    def get(self, key: str, source: bytes) -> Entry | None:
        """The entry stored under ``key`` (``source`` is the file's bytes), or None: also for
        an entry that is damaged or that someone else could have written (a miss, never an
        error)."""
        body = self.get_bytes(key)
        if body is None:
            return None
        try:
            head, _, output = body.partition(b"\n")
            meta = json.loads(head)
            changes = tuple(Change(*c) for c in meta["changes"])
            changed = bool(meta["changed"])
            if changed and len(output) != meta["size"]:
                return None
            error = meta.get("error")
            return Entry(changed, output if changed else source, str(meta["kind"]),
                         str(meta["reason"]), changes,
                         (str(error[0]), error[1], error[2]) if error else None)
        except (ValueError, KeyError, TypeError, IndexError):
            return None

    def get_bytes(self, key: str) -> bytes | None:
        """What ``put_bytes`` stored under ``key``, checked as ``get`` checks an entry (its
        digest, its owner and permissions), or None."""
        path = self._path(key)
        if not self.trusted(path.parent):
            return None
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
                         | getattr(os, "O_NONBLOCK", 0))
        except OSError:
            return None
        try:
            with os.fdopen(fd, "rb") as handle:
                st = os.fstat(handle.fileno())
                if not stat.S_ISREG(st.st_mode) or not _own(st, _OTHERS_WRITE):
                    return None
                raw = handle.read()
        except OSError:
            return None
        digest, _, body = raw.partition(b"\n")
        if hashlib.sha256(body).hexdigest().encode() != digest:
            return None  # damaged (or truncated by a full disk): recompute
        return body

    def put(self, key: str, entry: Entry) -> bool:
        """Store ``entry`` atomically; False (and nothing stored) if the disk refused or the
        directory is not ``trusted``."""
        meta = {
            "changed": entry.changed,
            "size": len(entry.output) if entry.changed else 0,
            "kind": entry.kind,
            "reason": entry.reason,
            "changes": [
                [c.line, c.col, c.transform, c.message, c.manual] for c in entry.changes
            ],
            "error": list(entry.error) if entry.error else None,
        }
        body = json.dumps(meta).encode() + b"\n" + (entry.output if entry.changed else b"")
        return self.put_bytes(key, body)

    def put_bytes(self, key: str, body: bytes) -> bool:
        """Store ``body`` under ``key`` atomically, behind its digest (``put``'s way); False
        (and nothing stored) if the disk refused or the directory is not ``trusted``."""
        blob = hashlib.sha256(body).hexdigest().encode() + b"\n" + body
        path = self._path(key)
        try:
            for directory in (self.root, self.dir, path.parent):
                # Private from the start (mkdir's mode, not a chmod after): no moment where
                # another user could put an entry in.
                with contextlib.suppress(FileExistsError):
                    directory.mkdir(mode=0o700, parents=directory == self.root)
            if not self.trusted(path.parent):
                return False
            fd, tmp = tempfile.mkstemp(prefix=".", suffix=".tmp", dir=path.parent)
        except OSError:
            return False
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(blob)
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return False
        return True

    def _entries(self, shard: Path) -> Iterator[tuple[float, int, str]]:
        """``(mtime, size, path)`` of a shard's entries; removes stale temporary files."""
        now = time.time()
        with contextlib.suppress(OSError), os.scandir(shard) as it:
            for item in it:
                try:
                    st = item.stat(follow_symlinks=False)
                except OSError:
                    continue
                if item.name.startswith("."):
                    if now - st.st_mtime > _STALE_TMP_S:
                        with contextlib.suppress(OSError):
                            os.unlink(item.path)
                    continue
                yield st.st_mtime, st.st_size, item.path

    def prune(self, estimate: bool = False) -> int:
        """Remove the oldest entries beyond the bounds; returns how many were removed.

        With ``estimate``, first estimate the total from one shard directory of the 256 (keys
        are hashes, spread evenly) and stop there when it is well within the bounds: a run
        that stored a few entries then pays for one directory listing, not for all of them.
        """
        if not self.trusted():
            return 0
        if estimate:
            sample = list(self._entries(self.dir / "00"))
            if (len(sample) * 256 <= self.max_entries * 0.75
                    and sum(size for _, size, _ in sample) * 256 <= self.max_bytes * 0.75):
                return 0
        try:
            shards = [self.dir / name for name in os.listdir(self.dir)]
        except OSError:
            return 0
        entries = sorted(e for shard in shards for e in self._entries(shard))
        count, total = len(entries), sum(size for _, size, _ in entries)
        if count <= self.max_entries and total <= self.max_bytes:
            return 0
        # Down to 80% of the bounds, oldest first, so that the next runs do not prune again.
        removed = 0
        for _, size, path in entries:
            if count <= self.max_entries * 0.8 and total <= self.max_bytes * 0.8:
                break
            with contextlib.suppress(OSError):
                os.unlink(path)
                removed += 1
            count, total = count - 1, total - size
        return removed
