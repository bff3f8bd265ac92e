"""Run the engine over many paths: plan the jobs, convert (in parallel), write, collect outcomes."""

from __future__ import annotations

import difflib
import os
import shutil
import sys
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .base import Options
from .changes import ConversionError
from .files import Skip, read_source, walk, write_atomic
from .report import FileOutcome

Mode = Literal["write", "check", "diff"]


@dataclass(frozen=True)
class Job:
    """One source file to convert; ``dest`` is where the result goes (None: nowhere)."""

    src: Path
    display: str
    dest: Path | None


@dataclass(frozen=True)
class Config:
    options: Options
    mode: Mode = "write"
    diff: bool = False


class UsageError(Exception):
    """Arguments that cannot work together (reported like a bad option, exit 2)."""


def plan(
    paths: Sequence[str], output: str | None, excludes: Sequence[str], copy_other_files: bool
) -> tuple[list[Job], list[tuple[Path, Path]], list[FileOutcome]]:
    """Turn PATH arguments into jobs, plain files to copy (for ``-o DIR``), and early failures."""
    jobs: list[Job] = []
    copies: list[tuple[Path, Path]] = []
    early: list[FileOutcome] = []
    out = Path(output) if output else None
    several = len(paths) > 1 or any(Path(p).is_dir() for p in paths)
    if out is not None and several and out.exists() and not out.is_dir():
        raise UsageError(f"-o {output}: must be a directory when converting several files")
    for arg in paths:
        path = Path(arg)
        if path.is_dir() and not path.is_symlink():
            found = False
            for file, is_source in walk(path, excludes):
                rel = file.relative_to(path)
                dest = (out / rel) if out is not None else None
                if is_source:
                    found = True
                    jobs.append(Job(file, str(file), dest if out is not None else file))
                elif dest is not None and copy_other_files:
                    copies.append((file, dest))
            if not found:
                early.append(
                    FileOutcome(str(path), "skipped", message=f"{path}: no Python files found")
                )
        elif not path.exists() and not path.is_symlink():
            early.append(FileOutcome(arg, "failed", message=f"{arg}: no such file or directory"))
        else:
            if out is None:
                dest = path
            elif out.is_dir() or several:
                dest = out / path.name
            else:
                dest = out
            jobs.append(Job(path, arg, dest))
    return jobs, copies, early


def convert_bytes(data: bytes, name: str, options: Options):  # -> engine.Result
    from .engine import convert
    from .notebook import convert_notebook

    if name.endswith(".ipynb"):
        return convert_notebook(data, options)
    return convert(data, options)


def process(job: Job, config: Config) -> FileOutcome:
    """Convert one file and write it if asked. Never raises: failures become outcomes."""
    try:
        data = read_source(job.src)
        result = convert_bytes(data, job.src.name, config.options)
    except Skip as why:
        if config.mode == "write" and job.dest is not None and job.dest != job.src:
            _copy(job.src, job.dest)
        return FileOutcome(job.display, "skipped", message=f"{job.display}: {why}")
    except ConversionError as err:
        return FileOutcome(job.display, "failed", message=err.format(job.display))
    except RecursionError:
        return FileOutcome(job.display, "failed", message=f"{job.display}: nested too deeply")
    except Exception as err:  # noqa: BLE001 - one bad file must not stop the others
        message = f"{job.display}: internal error: {type(err).__name__}: {err} (please report)"
        return FileOutcome(job.display, "failed", message=message)

    status = "converted" if result.changed else "unchanged"
    outcome = FileOutcome(
        job.display, status, result.info.label, result.info.reason, result.changes
    )
    if config.diff and result.changed:
        outcome.diff = unified_diff(data, result.output, job.display)
    if config.mode == "write" and job.dest is not None and (result.changed or job.dest != job.src):
        try:
            job.dest.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(job.dest, result.output)
        except (OSError, ConversionError) as err:
            reason = err.message if isinstance(err, ConversionError) else err.strerror
            return FileOutcome(job.display, "failed", message=f"{job.dest}: cannot write: {reason}")
    return outcome


def _copy(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dest, follow_symlinks=False)


def unified_diff(before: bytes, after: bytes, name: str) -> str:
    a = before.decode("utf-8", "replace").splitlines(keepends=True)
    b = after.decode("utf-8", "replace").splitlines(keepends=True)
    old, new = (name, name) if Path(name).is_absolute() else (f"a/{name}", f"b/{name}")
    return "".join(difflib.unified_diff(a, b, old, new))


def run_jobs(
    jobs: Sequence[Job],
    config: Config,
    workers: int,
    on_done: Callable[[FileOutcome], None] | None = None,
) -> list[FileOutcome]:
    """Process ``jobs`` with up to ``workers`` processes; outcomes come back in job order."""
    if workers <= 1 or len(jobs) <= 1:
        outcomes = []
        for job in jobs:
            outcomes.append(process(job, config))
            if on_done:
                on_done(outcomes[-1])
        return outcomes
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
        chunk = max(1, len(jobs) // (workers * 8))
        outcomes = []
        for outcome in pool.map(process, jobs, [config] * len(jobs), chunksize=chunk):
            outcomes.append(outcome)
            if on_done:
                on_done(outcome)
        return outcomes


def copy_files(copies: Iterable[tuple[Path, Path]]) -> None:
    for src, dest in copies:
        _copy(src, dest)


def default_jobs() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


def convert_stdin(config: Config) -> FileOutcome:
    """``-``: source on stdin, result on stdout (unless checking), messages for stderr."""
    data = sys.stdin.buffer.read()
    try:
        result = convert_bytes(data, "-", config.options)
    except ConversionError as err:
        sys.stdout.buffer.write(data if config.mode == "write" else b"")
        return FileOutcome("-", "failed", message=err.format("<stdin>"))
    status = "converted" if result.changed else "unchanged"
    outcome = FileOutcome("-", status, result.info.label, result.info.reason, result.changes)
    if config.diff and result.changed:
        outcome.diff = unified_diff(data, result.output, "-")
    if config.mode == "write":
        sys.stdout.buffer.write(result.output)
        sys.stdout.flush()
    return outcome
