"""The audit's file and network events, from Python's audit hooks (``sys.addaudithook``).

Recorded per rank: each path opened for writing (``open`` with a writing mode, ``os.rename`` /
``os.replace`` targets, ``shutil`` copies and moves, ``torch.save``) with the times and the
script line that did it, and the paths opened for reading, with their first and last time.
``socket.connect`` to a host other than this machine names the host. Files of the interpreter
and its packages, caches, lock files and the runtime's own records are left out.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import sysconfig
import threading
import time
from typing import Any

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT
_SKIP_SUFFIXES = (".py", ".pyc", ".so", ".lock", ".pth", ".dist-info", ".egg-link")
_SKIP_PARTS = ("__pycache__", "/torchinductor_", "/triton/", "/.triton/", "/.cache/",
               "/site-packages/", "/dist-packages/")

_busy = threading.local()


def now() -> float:
    return time.time()


class _Files:
    def __init__(self, rec: Any):
        self.rec = rec
        self.skip_dirs = _skip_dirs(rec)
        self.own_dir = os.path.dirname(os.path.abspath(__file__))
        pkg = os.path.dirname(self.own_dir)
        self.quiet_dirs = tuple(sorted({pkg + os.sep, *self.skip_dirs}))
        self.reads: dict[str, list[Any]] = {}  # path -> [first, last, where]
        self.seen_writes: set[str] = set()
        self.hosts: dict[str, str] = {}  # ip -> name asked for
        self.connected: set[tuple[str, int]] = set()
        self.local_hosts = _local_hosts()


_files: _Files | None = None


def install(rec: Any) -> None:
    global _files
    _files = _Files(rec)
    rec.end_parts.append(_end)
    sys.addaudithook(_hook)


def _skip_dirs(rec: Any) -> list[str]:
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, rec.folder,
            sysconfig.get_paths().get("stdlib", ""), sysconfig.get_paths().get("purelib", "")}
    for var in ("SDP_RUN_REPORT_DIR", "SDP_E2E_AUDIT", "SDP_RUN_OUTPUT_DIR"):
        if os.environ.get(var):
            dirs.add(os.environ[var])
    return [os.path.abspath(d) + os.sep for d in dirs if d]


def _local_hosts() -> set[str]:
    names = {"localhost", "127.0.0.1", "::1", "0.0.0.0", os.environ.get("MASTER_ADDR", "")}
    with contextlib.suppress(OSError):
        names.add(socket.gethostname())
    return names


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if event == "open":
        if getattr(_busy, "on", False) or isinstance(args[0], int) or args[0] is None:
            return
        path, mode, flags = args
        if isinstance(mode, str):
            writes = any(c in mode for c in "wax+")
        else:
            writes = bool(isinstance(flags, int) and flags & _WRITE_FLAGS)
        _note(path, "write" if writes else "read", "open")
    elif event == "os.rename" or event == "shutil.move" or event == "shutil.copyfile":
        if not getattr(_busy, "on", False):
            _note(args[1], "write", event)
    elif event == "socket.getaddrinfo":
        f = _files
        if f is not None and isinstance(args[0], (str, bytes)):
            f.hosts.setdefault("?", os.fsdecode(args[0]) if isinstance(args[0], bytes) else args[0])
    elif event == "socket.connect":
        _connect(args)


def _note(path: Any, kind: str, how: str) -> None:
    f = _files
    if f is None:
        return
    _busy.on = True
    try:
        full = _interesting(f, path)
        if full is None:
            return
        t = now()
        if kind == "write" and os.path.isdir(full):
            return  # O_TMPFILE in a folder (tempfile.TemporaryFile): a file of this rank's own
        if kind == "write":
            f.rec.emit({"kind": "file", "op": "write", "how": how, "path": full, "start": t,
                        "end": t if how != "open" else None, "where": where()})
            f.seen_writes.add(full)
        else:
            seen = f.reads.get(full)
            if seen is None:
                f.reads[full] = [t, t, where()]
                f.rec.emit({"kind": "file", "op": "read", "path": full, "start": t,
                            "where": f.reads[full][2]})
            else:
                seen[1] = t
    except Exception:
        pass
    finally:
        _busy.on = False


def note_write(rec: Any, path: Any, how: str, start: float, end: float) -> None:
    """A write whose start and end are known (``torch.save`` to a path)."""
    f = _files
    if f is None:
        return
    _busy.on = True
    try:
        full = _interesting(f, path)
        if full is not None:
            f.rec.emit({"kind": "file", "op": "write", "how": how, "path": full,
                        "start": start, "end": end, "where": where()})
    except Exception:
        pass
    finally:
        _busy.on = False


def _interesting(f: _Files, path: Any) -> str | None:
    try:
        full = os.path.abspath(os.fsdecode(os.fspath(path)))
    except TypeError:
        return None
    if full.startswith(("/dev/", "/proc/", "/sys/")) or full.endswith(_SKIP_SUFFIXES):
        return None
    if full.startswith(f.quiet_dirs) or any(part in full for part in _SKIP_PARTS):
        return None
    return full


def where() -> str:
    """``file:line`` of the innermost frame of the user's code (not the interpreter's, a
    package's or this runtime's)."""
    frame = sys._getframe(1)
    while frame is not None:
        if is_user(frame.f_code.co_filename):
            return at(frame)
        frame = frame.f_back  # type: ignore[assignment]
    return "?"


def is_user(filename: str) -> bool:
    """Whether code of ``filename`` is the user's (not the interpreter's, a package's or this
    runtime's)."""
    f = _files
    return not filename.startswith("<") and (f is None or not filename.startswith(f.quiet_dirs))


def at(frame: Any) -> str:
    """``file:line`` of ``frame`` (the file relative to the working directory when inside it)."""
    name = frame.f_code.co_filename
    rel = os.path.relpath(name)
    return f"{name if rel.startswith('..') else rel}:{frame.f_lineno}"


def _connect(args: tuple[Any, ...]) -> None:
    f = _files
    if f is None or getattr(_busy, "on", False):
        return
    sock, address = args[0], args[1]
    try:
        if sock.family not in (socket.AF_INET, socket.AF_INET6) or not isinstance(address, tuple):
            return
        host, port = str(address[0]), int(address[1])
    except Exception:
        return
    if host in f.local_hosts or host.startswith("127."):
        return
    if (host, port) in f.connected:
        return
    f.connected.add((host, port))
    name = f.hosts.pop("?", host)
    _busy.on = True
    try:
        f.rec.emit({"kind": "connect", "host": name, "ip": host, "port": port, "where": where()})
    finally:
        _busy.on = False


def _end(record: dict[str, Any]) -> None:
    f = _files
    if f is None:
        return
    record["reads"] = {p: v[:2] for p, v in f.reads.items()}
