"""Run the engine over many paths: plan the jobs, convert (in parallel), write, collect outcomes."""

from __future__ import annotations

import contextlib
import difflib
import gc
import hashlib
import json
import os
import shutil
import signal
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

from . import manual_marks
from .cache import Cache, Entry, code_identity
from .changes import Change as ConversionChange
from .changes import ConversionError
from .compiles import check, check_output
from .files import (
    Excluder,
    Skip,
    forget_gitignores,
    is_ignored_by_git,
    read_regular,
    read_source,
    walk,
    write_atomic,
)
from .formatting import line_length_for
from .options import Options
from .report import FileOutcome
from .siblings import ProjectFiles, hogwild_imports, project_digest, read_project, resolver

if TYPE_CHECKING:
    from .program.facts import Repair

_T = TypeVar("_T")

if TYPE_CHECKING:
    from concurrent.futures import Future

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
    #: Remember results in this directory (``cache``); None: no cache.
    cache_dir: str | None = None


@dataclass(frozen=True)
class Selection:
    """Which files of the PATH arguments to convert (``--exclude``, ``.gitignore``, ...)."""

    excluder: Excluder = Excluder()
    gitignore: bool = True
    #: Apply the exclusions to files named on the command line too (pre-commit passes files).
    force_exclude: bool = False
    copy_other_files: bool = True

    def excludes_named(self, path: Path) -> bool:
        """Whether a path given on the command line is left out (only with ``force_exclude``)."""
        if not self.force_exclude:
            return False
        is_dir = os.path.isdir(path)
        if any(
            self.excluder.matches(p, p.as_posix(), is_dir if p == path else True)
            for p in (path, *path.parents) if p.name
        ):
            return True
        return self.gitignore and is_ignored_by_git(path)


class UsageError(Exception):
    """Arguments that cannot work together (reported like a bad option, exit 2)."""


@dataclass
class Interrupted(Exception):
    """A signal stopped a run of many files; ``outcomes`` are those of the files finished."""

    signum: int
    outcomes: list[FileOutcome] = field(default_factory=list)


def plan(
    paths: Sequence[str], output: str | None, selection: Selection = Selection()
) -> tuple[list[Job], list[tuple[Path, Path]], list[FileOutcome]]:
    """Turn PATH arguments into jobs, plain files to copy (for ``-o DIR``), and early outcomes."""
    forget_gitignores()
    jobs: list[Job] = []
    copies: list[tuple[Path, Path]] = []
    early: list[FileOutcome] = []
    out = Path(output) if output else None
    # os.path, not Path methods: a path under an unreadable directory is "no", not an exception.
    several = len(paths) > 1 or any(os.path.isdir(p) for p in paths)
    # ``-o newdir/`` (a trailing slash) names a directory, as cp and rsync read it.
    out_is_dir = out is not None and (os.path.isdir(out) or str(output).endswith(("/", os.sep)))
    if out is not None and several and os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"-o {output}: must be a directory when converting several files")
    for arg in paths:
        path = Path(arg)
        if selection.excludes_named(path):
            continue
        if os.path.isdir(path) and not os.path.islink(path):
            found = False
            errors: list[tuple[Path, str]] = []
            # An output directory inside the input tree is never an input (converted/converted/).
            prune = [out] if out is not None else []
            for file, is_source in walk(path, selection.excluder, gitignore=selection.gitignore,
                                        prune=prune, errors=errors):
                rel = file.relative_to(path)
                dest = (out / rel) if out is not None else None
                if is_source:
                    found = True
                    jobs.append(Job(file, str(file), dest if out is not None else file))
                elif dest is not None and selection.copy_other_files:
                    copies.append((file, dest))
            for where, reason in errors:
                early.append(FileOutcome(str(where), "failed",
                                         message=f"{where}: cannot read directory: {reason}"))
            if not found and not errors:
                early.append(
                    FileOutcome(str(path), "skipped", message=f"{path}: no Python files found")
                )
        elif not os.path.lexists(path):
            early.append(FileOutcome(arg, "failed", message=f"{arg}: no such file or directory"))
        else:
            if out is None:
                dest = path
            elif out_is_dir or several:
                dest = out / path.name
            else:
                dest = out
            jobs.append(Job(path, arg, dest))
    return jobs, copies, early


def convert_bytes(data: bytes, name: str, options: Options):  # -> engine.Result
    """Convert one source (a notebook's JSON when ``name`` ends in ``.ipynb``). CPython compiles
    it first (``compiles``: what it rejects is never parsed further) and compiles the output;
    manual notes are written into a changed output and read back from the input
    (``manual_marks``); any failure, running out of stack included, is a ``ConversionError``."""
    from .engine import convert
    from .notebook import convert_notebook

    # The cyclic garbage collector is off while one file converts: libcst's trees are freed by
    # reference counting (peak memory of a 10,000-line file: 445 MiB without it, 440 MiB with
    # it), and its full collections, which walk every live node, made the time grow faster than
    # the file (a 20,000-line file took 23.5x a 1,000-line one; without them, linear:
    # benchmarks/bench_long_files.py).
    collecting = gc.isenabled()
    gc.disable()
    try:
        if name.endswith(".ipynb"):
            return convert_notebook(data, options)
        check(data)
        result = manual_marks.apply(data, convert(data, options))
        if result.changed:
            check_output(result.output)
        return result
    except RecursionError:
        raise ConversionError(
            "nested too deeply for the converter (RecursionError); the file is left as it is"
        ) from None
    finally:
        if collecting:
            gc.enable()


def convert_cached(
    data: bytes,
    name: str,
    config: Config,
    cached_only: bool = False,
    deps: Sequence[str | bytes] = (),
    fresh: bool = False,
) -> tuple[Entry | None, bool]:
    """What converting ``data`` gives, from the cache when it knows (then True), else from the
    engine (and remembered); with ``cached_only``, ``(None, False)`` when the cache does not
    know. A conversion that fails is an entry with its ``error`` (message, line, column), from
    the engine as from the cache, which remembers failures too.

    ``deps``: digests of everything outside ``data`` and ``config.options`` that the conversion
    reads (other modules' contents, in a project); see ``cache``. A conversion that reads another
    file must pass it here, or the cache would answer with a result computed before that file
    changed.

    ``fresh``: the output is going to be written (into the user's file, or to stdout for an
    editor). Then only "nothing to change" (or a failure) is taken from the cache; a changed
    output is always converted again in this run, so that what is written never comes from a
    file someone else could have put there (``cache``'s "Trust"). The files a run writes are
    few next to those it checks, and each write costs a conversion anyway.
    """
    cache = Cache(config.cache_dir) if config.cache_dir else None
    key = cache.key(data, name, config.options, deps) if cache is not None else ""
    if cache is not None:
        entry = cache.get(key, data)
        if entry is not None and not (fresh and entry.changed):
            return entry, True
    if cached_only:
        return None, False
    entry = _computed(data, name, config.options)
    if cache is not None:
        cache.put(key, entry)
        if entry.changed and not deps:
            _remember_output(cache, entry.output, name, config.options)
    return entry, False


def _computed(data: bytes, name: str, options: Options) -> Entry:
    """What the engine gives for ``data``, as a cache entry (a ``ConversionError`` as its
    ``error``)."""
    try:
        result = convert_bytes(data, name, options)
    except ConversionError as err:
        return Entry(False, data, "", "", (), (err.message, err.line, err.col))
    return Entry(result.changed, result.output, result.info.label, result.info.reason,
                 tuple(result.changes))


def _remember_output(cache: Cache, output: bytes, name: str, options: Options) -> None:
    """Store what converting a conversion's ``output`` gives, so that a later run over the
    converted file (written in place, or pasted over the original) is answered without parsing.

    The entry is computed, not assumed: the engine's own second pass proves the output a fixed
    point, but with ``recheck`` (the transforms run again), so its report ("torch") is not a
    later run's ("already uses sdp_runtime"); one more plain pass gives the later run's. Only
    outside project mode (no ``deps``): there the key of the converted file holds a digest of
    its neighbours and of itself, which writing it changes, and its project facts follow from
    the new contents; a run that is a project records nothing here.
    """
    key = cache.key(output, name, options)
    if cache.get(key, output) is not None:
        return
    try:
        entry = _computed(output, name, options)
    except Exception:  # noqa: BLE001 - an optimisation: the file's own conversion stands
        return
    cache.put(key, entry)


def process(
    job: Job, config: Config, cached_only: bool = False, deps: Sequence[str] = (),
    again: FileOutcome | None = None,
) -> FileOutcome | None:
    """Convert one file and write it if asked. Never raises: failures become outcomes.

    ``cached_only``: answer only from the cache; None when it does not know the file.
    ``deps``: what else the conversion reads, for the cache's key (``convert_cached``).
    ``again``: the file's outcome of this run so far (a repair converts it again): the source is
    what that outcome read, and what it wrote is what the file must still hold to be replaced.
    """
    writes = config.mode == "write" and job.dest is not None
    try:
        if again is not None:
            data = again.source if again.source is not None else (again.output or b"")
        else:
            data = read_source(job.src)
        result, hit = convert_cached(data, job.src.name, config, cached_only, deps, fresh=writes)
        if result is None:
            return None
        if result.error is not None:
            return FileOutcome(job.display, "failed",
                               message=ConversionError(*result.error).format(job.display))
    except Skip as why:
        if cached_only:
            return None
        outcome = FileOutcome(job.display, "skipped", message=f"{job.display}: {why}")
        if config.mode == "write" and job.dest is not None and job.dest != job.src:
            try:
                _copy(job.src, job.dest)
            except OSError as err:
                return FileOutcome(job.display, "failed",
                                   message=f"{job.dest}: cannot write: {err.strerror}")
            outcome.written = True
        return outcome
    except ConversionError as err:
        if cached_only:
            return None
        return FileOutcome(job.display, "failed", message=err.format(job.display))
    except RecursionError:  # reading the file's project (convert_bytes says it better)
        return FileOutcome(job.display, "failed", message=f"{job.display}: nested too deeply")
    except Exception as err:  # noqa: BLE001 - one bad file must not stop the others
        message = f"{job.display}: internal error: {type(err).__name__}: {err} (please report)"
        return FileOutcome(job.display, "failed", message=message)

    status = "converted" if result.changed else "unchanged"
    outcome = FileOutcome(
        job.display, status, result.kind, result.reason, list(result.changes)
    )
    outcome.computed = not hit
    outcome.output = result.output
    if result.changed:
        outcome.source = data
    if config.diff and result.changed:
        outcome.diff = unified_diff(data, result.output, job.display)
    rewrite = again is not None and again.written and job.dest == job.src
    if writes and job.dest is not None and (result.changed or job.dest != job.src or rewrite):
        on_disk = again.output if again is not None and again.written and job.dest == job.src \
            else data
        if not _still(job.src, on_disk if on_disk is not None else data):
            return FileOutcome(
                job.display, "failed",
                message=f"{job.display}: changed or deleted while it was being converted; "
                "left as it is (convert it again)",
            )
        try:
            job.dest.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(job.dest, result.output)
        except (OSError, ConversionError) as err:
            reason = err.message if isinstance(err, ConversionError) else err.strerror
            return FileOutcome(job.display, "failed", message=f"{job.dest}: cannot write: {reason}")
        outcome.written = True
    return outcome


def _still(path: Path, data: bytes) -> bool:
    """Whether ``path`` still holds ``data`` (what was read and converted): an edit or a
    deletion during the conversion is never overwritten or undone."""
    try:
        return read_regular(path) == data
    except OSError:
        return False


def _copy(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dest, follow_symlinks=False)


def unified_diff(before: bytes, after: bytes, name: str) -> str:
    """``diff -u`` of two versions, that ``patch`` and ``git apply`` accept.

    A last line without a newline is followed by ``\\ No newline at end of file``, as GNU diff
    writes it; without the marker the next line of the diff would be glued to it.
    """
    a = _lines(before.decode("utf-8", "replace"))
    b = _lines(after.decode("utf-8", "replace"))
    old, new = (name, name) if Path(name).is_absolute() else (f"a/{name}", f"b/{name}")
    lines = []
    for line in difflib.unified_diff(a, b, old, new):
        if not line.endswith("\n"):
            line += "\n\\ No newline at end of file\n"
        lines.append(line)
    return "".join(lines)


def _lines(text: str) -> list[str]:
    # Split at "\n" only, as diff and patch do (str.splitlines also splits at form feeds).
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


class _Abort(BaseException):
    """A signal came while there is nothing to write (``--check``, ``--diff``): the conversion
    in progress is dropped at once. A BaseException, so that ``process`` does not turn it into
    a failed file."""


class _Stop:
    """SIGINT/SIGTERM during a run: note it, let the file being written finish, stop after.

    With ``abort`` (nothing is written: ``--check``, ``--diff``) the run stops at once instead:
    the conversion in progress is dropped (``_Abort``) and the workers are killed.
    A second signal acts as usual (the default handlers are back), for a user who insists.
    """

    def __init__(self, abort: bool = False) -> None:
        self.signum = 0
        self.abort = abort
        self._old: dict[int, object] = {}

    def __enter__(self) -> _Stop:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._note)
            except ValueError:  # not the main thread (an embedding program): no handler
                break
        return self

    def _note(self, signum: int, frame: object) -> None:
        self.signum = signum
        self.__exit__()
        if self.abort:
            raise _Abort

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)  # type: ignore[arg-type]
        self._old.clear()


def _worker_init() -> None:
    # Ctrl-C reaches the whole process group: the workers finish their file and the main process
    # decides what stops (and prints no traceback from each worker).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A worker ends with the process that started it, even after kill -9 of that process (which
    # runs no clean-up): Linux sends it SIGKILL (PR_SET_PDEATHSIG).
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):  # pragma: no cover - no libc prctl
            pass
        import multiprocessing

        parent = multiprocessing.parent_process()
        if parent is not None and not parent.is_alive():  # gone before the line above took effect
            os._exit(1)


def run_jobs(
    jobs: Sequence[Job],
    config: Config,
    workers: int,
    on_done: Callable[[FileOutcome], None] | None = None,
) -> list[FileOutcome]:
    """Process ``jobs`` with up to ``workers`` processes; outcomes come back in job order.

    Raises ``Interrupted`` (with the outcomes of the files finished) after SIGINT or SIGTERM:
    no file is left half-written, and those written are in the outcomes. A worker process that
    dies (a crash, a kill, out of memory) fails the file it was converting, with one line; the
    others are still converted.
    """
    # Project mode: the files of the run and their neighbours are one program (``projects``),
    # read once here. The cache keys each file on a digest of all of them (no parsing); the
    # program is planned (libcst) only when some file is not answered from the cache.
    files = [(job.src, job.display) for job in jobs]
    project = read_project(files) if jobs else None
    contents = project[2] if project is not None else None
    importers = hogwild_imports([job.src for job in jobs], contents) if len(jobs) > 1 else {}
    deps = (digest,) if config.cache_dir and (digest := project_digest(files, project)) else ()
    planned: dict[Path, Options] | None = None
    resolve = resolver()

    def config_of(job: Job, plan: bool = True) -> Config:
        """The file's options; with ``plan``, its project facts too (not part of its key)."""
        nonlocal planned
        importer = importers.get(job.src, config.options.parallel_importer)
        options = replace(
            config.options, parallel_importer=importer, line_length=line_length_for(job.src)
        )
        if plan:
            if planned is None:
                from .projects import project_options

                try:
                    planned = project_options(files, config.options, project)
                except RecursionError:  # a file too deep to read: each file says so itself
                    planned = {}
            if (facts := planned.get(resolve(job.src))) is not None:
                options = replace(options, project=facts.project)
        return replace(config, options=options)

    done: dict[int, FileOutcome] = {}
    with _Stop(abort=config.mode != "write") as stop:
        try:
            # What the cache knows is answered here: the rest is converted (in workers: a warm
            # run starts none).
            if config.cache_dir:
                for i, job in enumerate(jobs):
                    if stop.signum:
                        break
                    outcome = process(job, config_of(job, plan=False), cached_only=True,
                                      deps=deps)
                    if outcome is not None:
                        done[i] = outcome
            todo = [i for i in range(len(jobs)) if i not in done]
            if workers <= 1 or len(todo) <= 1:
                for i, job in enumerate(jobs):
                    if i not in done:
                        if stop.signum:
                            continue  # after a signal, only what is done already (and written)
                        outcome = process(job, config_of(job), deps=deps)
                        assert outcome is not None
                        done[i] = outcome
                    if on_done:
                        on_done(done[i])
            else:
                for outcome in done.values():
                    if on_done:
                        on_done(outcome)
                # Largest first: the pool hands out one file at a time, and a long conversion
                # handed out last would keep one worker busy while the others have nothing
                # left to do.
                todo.sort(key=lambda i: -_size(jobs[i].src))
                _run_pool(jobs, todo, done, config_of, workers, stop, on_done, deps)
        except _Abort:
            pass
    outcomes = [done[i] for i in range(len(jobs)) if i in done]
    if project is not None and not stop.signum:
        outcomes = _check_and_repair(jobs, outcomes, project, config, config_of, deps, stop)
    if config.cache_dir and any(o.computed for o in outcomes):
        # The bound is kept here, once per run, not by each worker after each file.
        Cache(config.cache_dir).prune(estimate=True)
    if stop.signum:
        raise Interrupted(stop.signum, outcomes)
    return outcomes


#: How many times the contract's repairs are made and the program checked again.
REPAIR_ROUNDS = 4


def _check_and_repair(
    jobs: Sequence[Job], outcomes: list[FileOutcome], project: ProjectFiles, config: Config,
    config_of: Callable[[Job], Config], deps: Sequence[str], stop: _Stop,
) -> list[FileOutcome]:
    """Check the program's contract; where it names a missing part at a site in a file of
    this run (``contract.Finding.repair``), convert that file again with the repair
    (``ModuleFacts.repairs``) and check again, until nothing is left to repair (at most
    ``REPAIR_ROUNDS`` times). The outcomes of the last check stand."""
    from .program.facts import ModuleFacts

    resolve = resolver()
    by_path = {resolve(job.src): i for i, job in enumerate(jobs)}
    # (A notebook is named by its display name: it is no project module.)
    by_path.update({resolve(Path(job.display)): i for i, job in enumerate(jobs)})
    by_path.update({Path(job.display): i for i, job in enumerate(jobs)})
    asked: dict[Path, tuple[Repair, ...]] = {}
    repairs = check_contract(outcomes, project, config.cache_dir)
    for _ in range(REPAIR_ROUNDS):
        wanted: dict[Path, list[Repair]] = {}
        for repair in repairs:
            if repair.path in by_path and repair not in wanted.setdefault(repair.path, []):
                wanted[repair.path].append(repair)
        todo = {
            path: (*asked.get(path, ()), *new)
            for path, found in wanted.items()
            if (new := [r for r in found if not _asked(r, asked.get(path, ()))])
            and outcomes[by_path[path]].status in ("converted", "unchanged")
        }
        if not todo or stop.signum:
            break
        for outcome in outcomes:
            _forget_contract(outcome)
        for path, its_repairs in todo.items():
            asked[path] = its_repairs
            i = by_path[path]
            job = jobs[i]
            base = config_of(job)
            facts = replace(base.options.project or ModuleFacts(), repairs=its_repairs)
            digest = hashlib.sha256(repr(its_repairs).encode()).hexdigest()
            again = process(job, replace(base, options=replace(base.options, project=facts)),
                            deps=(*deps, digest), again=outcomes[i])
            if again is not None:
                outcomes[i] = again
        repairs = check_contract(outcomes, project, config.cache_dir)
    return outcomes


def _asked(repair: Repair, asked: Sequence[Repair]) -> bool:
    """Whether ``repair`` was asked of its file already: the same kind at the same node (named
    by the code of its head: a later check reads the node as that conversion wrote it)."""
    def head(code: str) -> str:
        return code.split(" in ", 1)[0] if code.startswith("for ") else code.split("(", 1)[0]

    return any(r.kind == repair.kind and head(r.code) == head(repair.code) for r in asked)


def _forget_contract(outcome: FileOutcome) -> None:
    """What an earlier check of the contract said on ``outcome`` (it is checked again)."""
    outcome.changes = [c for c in outcome.changes if c.transform != "contract"]
    outcome.contract = None
    outcome.program_attention = False


def check_contract(outcomes: Sequence[FileOutcome], project: ProjectFiles,
                   cache_dir: Path | str | None = None) -> list[Repair]:
    """The whole-program contract (``contract``) over what the run gives: a manual note at each
    spot where a program that trains misses a part, and each entry point's parts, on its
    outcome. Files in the run are read as converted, their neighbours as they are.

    The check reads every module with the program model (``program.run``), in a thread with
    room for deep nesting (a valid module with a 400-term expression is read, not dropped); a
    module CPython rejects is not read. With ``cache_dir``, its result is kept in the cache,
    keyed on every text it read (and the notes and kinds of the files of the run): a warm run
    reads no file again. Returns the repairs the contract asks for (``program.project.Repair``:
    the edits that would make a missing part hold, in the files that can take them)."""
    written, shown, contents = project
    by_display = {o.path: o for o in outcomes}
    resolve = resolver()
    texts: dict[Path, bytes] = {}
    lines_of: dict[Path, list[tuple[int, int]]] = {}
    outcome_of: dict[Path, FileOutcome] = {}
    failed: set[Path] = set()
    for path, display in written.items():
        o = by_display.get(display)
        if o is not None and o.output is not None and o.status in ("converted", "unchanged"):
            outcome_of[path] = o
            texts[path] = o.output
        elif o is not None and o.status == "failed":
            failed.add(path)  # said already (one line); its program is not checked through it
    for path, data in contents.items():
        if path not in failed:
            texts.setdefault(path, data)
    for o in outcomes:  # notebooks are not project modules: each is a program of its own
        if o.path.endswith(".ipynb") and o.output is not None and o.status != "failed":
            from .notebook import notebook_program  # the engine with it: notebooks only

            program = notebook_program(o.output)
            if program is not None:
                path = resolve(Path(o.path))
                outcome_of[path] = o
                texts[path], lines_of[path] = program[0].encode(), program[1]
    if not any(_may_train(t) for t in texts.values()):
        return []
    chosen = {p: t for p, t in texts.items() if _may_train(t) or p in outcome_of}
    store = Cache(cache_dir) if cache_dir else None
    key = _contract_key(chosen, shown, outcome_of, lines_of) if store is not None else ""
    checked: _Checked | None = None
    if store is not None and (data := store.get_bytes(key)) is not None:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            checked = _Checked.from_bytes(data)
    if checked is None:
        try:
            checked = _deep(lambda: _check_program(chosen, texts, shown, outcome_of, lines_of))
        except Exception as err:  # noqa: BLE001 - said on every file it concerns
            names = ", ".join(sorted(outcome_of[p].path for p in outcome_of
                                     if _may_train(chosen.get(p, b""))))
            sys.stderr.write(f"sdp-convert: the whole-program check could not run "
                             f"({type(err).__name__}: {err}); not verified: {names or 'none'} "
                             "(please report)\n")
            for path, o in outcome_of.items():
                if _may_train(chosen.get(path, b"")):
                    o.changes.append(ConversionChange(
                        1, 1, "contract",
                        f"the whole-program check could not run ({type(err).__name__}): the "
                        "parts of this file's program are not verified; sdp-run --audit "
                        "checks them at run time (please report)", manual=True))
                    o.program_attention = True
            return []
        if store is not None:
            store.put_bytes(key, checked.to_bytes())
    _apply(checked, outcome_of, shown)
    return checked.repairs()


def _deep(work: Callable[[], _T]) -> _T:
    """``work()`` in a thread with room for deep recursion (libcst and ``ast`` recurse once per
    level of nesting: a 400-term ``a + b + ...`` is 400 levels): what a valid module needs."""
    import threading

    box: list[object] = []
    limit = sys.getrecursionlimit()
    size = threading.stack_size()

    def run() -> None:
        try:
            box.append(("ok", work()))
        except BaseException as err:  # noqa: BLE001 - handed to the caller
            box.append(("error", err))

    try:
        threading.stack_size(512 * 1024 * 1024)
        sys.setrecursionlimit(max(limit, 60_000))
        thread = threading.Thread(target=run, name="sdp-convert-contract")
        thread.start()
        thread.join()
    finally:
        threading.stack_size(size)
        sys.setrecursionlimit(limit)
    kind, value = box[0]  # type: ignore[misc]
    if kind == "error":
        raise value  # type: ignore[misc]
    return value  # type: ignore[return-value]


@dataclass
class _Checked:
    """The contract's answers for one run, as the cache keeps them: per entry, its JSON, the
    notes it adds (by file) and the repairs it asks for."""

    entries: list[tuple[str, dict[str, object], bool, list[tuple[str, int, int, str]],
                        list[tuple[str, str, int, str, str, bool, str]]]]

    def to_bytes(self) -> bytes:
        return json.dumps(self.entries).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> _Checked:
        raw = json.loads(data)
        if not isinstance(raw, list):
            raise ValueError("not a contract result")
        return cls([(e, j, bool(h), [tuple(n) for n in notes],  # type: ignore[misc]
                     [tuple(r) for r in repairs])  # type: ignore[misc]
                    for e, j, h, notes, repairs in raw])

    def repairs(self) -> list[Repair]:
        from .program.facts import Repair

        found: list[Repair] = []
        for *_, repairs in self.entries:
            for kind, path, line, code, detail, shuffle, framework in repairs:
                repair = Repair(kind, Path(path), line, code, detail, shuffle, framework)
                if repair not in found:
                    found.append(repair)
        return found


def _check_program(chosen: dict[Path, bytes], texts: dict[Path, bytes], shown: dict[Path, str],
                   outcome_of: dict[Path, FileOutcome],
                   lines_of: dict[Path, list[tuple[int, int]]],
                   ) -> _Checked:
    from . import contract
    from .engine import node_positions
    from .modules import Project, imported_modules
    from .program.model import FileModel
    from .program.run import Module, Run

    modules: list[Module] = []
    unread: dict[Path, str] = {}
    for path, text in chosen.items():
        o = outcome_of.get(path)
        try:
            # CPython's own verdict first: what it rejects is not read.
            check(text, notebook=path in lines_of)
        except ConversionError as err:
            if "nested too deeply" in err.message:
                unread[path] = "nested too deeply for CPython"
            continue
        try:
            fm = FileModel.from_source(text)
        except Exception as err:  # noqa: BLE001 - a module the model cannot read is not followed
            unread[path] = type(err).__name__
            continue
        modules.append(Module(path, shown.get(path, o.path if o else str(path)), fm,
                              written=o is not None, notebook=path in lines_of))
    py = {p: t for p, t in texts.items() if p.suffix == ".py"}
    graph = Project(py)
    run = Run(modules, graph)
    imports = {m.path: imported_modules(graph, m.path) if m.path in py else
               _notebook_imports(graph, m.path, texts[m.path]) for m in modules}
    positions: dict[Path, dict[int, tuple[int, int]]] = {}

    def position(module: Module, node: object) -> tuple[int, int]:
        where = positions.get(module.path)
        if where is None:
            order = module.fm.index.order
            where = positions[module.path] = node_positions(module.fm.module, set(order))
        line, col = where.get(id(node), (1, 0))
        return line, col + 1

    lines: dict[Path, Callable[[int], int]] = {}
    for path, o in outcome_of.items():
        if path in lines_of:
            continue
        if o.source is not None and o.output is not None:
            lines[path] = _line_map(o.output, o.source)
    def cell_of(of: list[tuple[int, int]]) -> Callable[[int], str]:
        def cell(line: int) -> str:
            index, at = of[min(max(line, 1), len(of)) - 1]
            return f"cell {index + 1}, line {at}"
        return cell

    context = contract.Context(
        notes={p: [c for c in o.changes if c.manual] for p, o in outcome_of.items()},
        kinds={p: o.kind for p, o in outcome_of.items()},
        lines=lines, position=position, imports=imports, unread=unread,
        cells={p: cell_of(of) for p, of in lines_of.items() if of},
    )
    results = contract.check_program(run, context)
    entries = []
    for result in results:
        notes = [(str(path), c.line, c.col, c.message) for path, cs in result.notes.items()
                 for c in cs]
        repairs = [(r.kind, str(r.path), r.line, r.code, r.detail, r.shuffle, r.framework)
                   for r in result.repairs]
        entries.append((result.entry, result.as_json(), result.holds, notes, repairs))
    return _Checked(entries)


def _notebook_imports(graph: object, path: Path, program: bytes) -> list[Path]:
    """The project modules a notebook's cells import (absolute imports: a notebook is no
    package module)."""
    import ast

    from .modules import import_names, resolve_imports

    try:
        names = [n for n in import_names(ast.parse(program)) if not n.startswith(".")]
    except (SyntaxError, ValueError, RecursionError):
        return []
    return resolve_imports(graph, path, names)  # type: ignore[arg-type]


def _apply(checked: _Checked, outcome_of: dict[Path, FileOutcome], shown: dict[Path, str]) -> None:
    """The contract's answers onto the outcomes: each entry's parts, its notes at their files
    (a neighbour's, on the entry, naming the file), and "needs attention" on an entry whose
    program does not hold, wherever its notes landed."""
    by_display = {o.path: (p, o) for p, o in outcome_of.items()}
    for entry, as_json, holds, notes, _repairs in checked.entries:
        found = by_display.get(entry)
        if found is None:
            continue
        entry_path, entry_outcome = found
        entry_outcome.contract = as_json
        if not holds:
            entry_outcome.program_attention = True
        for raw_path, line, col, message in notes:
            path = Path(raw_path)
            o = outcome_of.get(path)
            change = ConversionChange(line, col, "contract", message, manual=True)
            if o is None:  # a neighbour: its note goes to the entry, naming the file
                o = entry_outcome
                display = shown.get(path, raw_path)
                change = ConversionChange(1, 1, "contract", f"{display}:{line}: {message}",
                                          manual=True)
            elif o.path.endswith(".ipynb"):  # said of the notebook's cells, as its own are
                from .notebook import notebook_program, placed

                program = notebook_program(o.output or b"")
                if program is not None:
                    [change] = placed(o.output or b"", [change], program[1])
            seen = {(c.line, c.message) for c in o.changes}
            if (change.line, change.message) not in seen:
                o.changes.append(change)
            o.changes.sort(key=lambda c: (c.line, c.col))


def _contract_key(chosen: dict[Path, bytes], shown: dict[Path, str],
                  outcome_of: dict[Path, FileOutcome],
                  lines_of: dict[Path, list[tuple[int, int]]]) -> str:
    """The cache key of the contract's answers for this run: every text it reads, with the
    notes and kind of each file of the run."""
    digest = hashlib.sha256(json.dumps({"what": "contract", "code": code_identity()}).encode())
    for path in sorted(chosen):
        o = outcome_of.get(path)
        context = json.dumps({
            "path": str(path), "display": shown.get(path, o.path if o else str(path)),
            "notebook": path in lines_of, "in_run": o is not None,
            "kind": o.kind if o else "",
            "notes": [[c.line, c.col, c.transform, c.message] for c in
                      (o.changes if o else ()) if c.manual],
        }, sort_keys=True).encode()
        for part in (context, chosen[path],
                     o.source if o and o.source and path not in lines_of else b""):
            digest.update(b"\0%d\0" % len(part))
            digest.update(part)
    return digest.hexdigest()


def _line_map(output: bytes, source: bytes) -> Callable[[int], int]:
    """Line of ``output`` -> the line of ``source`` it comes from (an inserted line: the source
    line it was inserted before)."""
    import difflib

    after, before = output.splitlines(), source.splitlines()
    table: dict[int, int] = {}
    for tag, i1, i2, j1, _j2 in difflib.SequenceMatcher(None, after, before,
                                                       autojunk=False).get_opcodes():
        for k in range(i1, i2):
            table[k + 1] = (j1 + (k - i1) + 1) if tag == "equal" else min(j1 + 1, len(before))
    return lambda line: table.get(line, line)


#: Words a module that trains (or builds what trains) has somewhere in its text.
_TRAINING_WORDS = (b"torch", b"tensorflow", b"keras", b"sdp_runtime")


def _may_train(text: bytes) -> bool:
    return any(word in text for word in _TRAINING_WORDS)


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _run_pool(
    jobs: Sequence[Job],
    todo: list[int],
    done: dict[int, FileOutcome],
    config_of: Callable[[Job], Config],
    workers: int,
    stop: _Stop,
    on_done: Callable[[FileOutcome], None] | None,
    deps: Sequence[str] = (),
) -> None:
    """Convert ``jobs[i]`` for ``i`` in ``todo`` in worker processes, into ``done``; after a
    signal, only the files finished (those being written are finished first).

    At most one file per worker is handed out at a time, so that when a worker dies the files
    it may have been converting are known: those are tried again, each alone in a fresh
    worker, and the one that kills its worker again fails with one line. The others go on in a
    fresh pool.
    """
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor
    from concurrent.futures import wait as wait_futures
    from concurrent.futures.process import BrokenProcessPool

    queue = list(todo)
    suspects: list[int] = []
    while (queue or suspects) and not stop.signum:
        alone = not queue
        batch = [suspects.pop(0)] if alone else queue
        width = 1 if alone else min(workers, len(batch))
        pool = ProcessPoolExecutor(max_workers=width, initializer=_worker_init)
        inflight: dict[Future[FileOutcome | None], int] = {}

        def finish(
            future: Future[FileOutcome | None],
            alone: bool = alone,
            inflight: dict[Future[FileOutcome | None], int] = inflight,
        ) -> None:
            i = inflight.pop(future)
            try:
                outcome = future.result()
            except BrokenProcessPool:
                if not alone:
                    suspects.append(i)
                    return
                display = jobs[i].display
                outcome = FileOutcome(
                    display, "failed",
                    message=f"{display}: the converter's process died converting it (a crash, "
                    "a kill or no memory left); left as it is (please report)",
                )
            assert outcome is not None
            done[i] = outcome
            if on_done:
                on_done(outcome)

        try:
            broken = False
            while (batch or inflight) and not stop.signum:
                while batch and not broken and len(inflight) < width:
                    i = batch.pop(0)
                    try:
                        future = pool.submit(process, jobs[i], config_of(jobs[i]), False, deps)
                    except BrokenProcessPool:
                        batch.insert(0, i)
                        broken = True
                        break
                    inflight[future] = i
                if broken and not inflight:
                    break  # a fresh pool for the rest
                finished, _ = wait_futures(list(inflight), timeout=0.1,
                                           return_when=FIRST_COMPLETED)
                for future in finished:
                    broken = broken or isinstance(future.exception(), BrokenProcessPool)
                    finish(future)
            if stop.signum and inflight:
                # Files being converted when the signal came are finished (they may be writing)
                # and counted; with nothing to write, _Abort comes here instead.
                wait_futures(list(inflight))
                for future in list(inflight):
                    finish(future)
        except _Abort:
            for process_ in list((getattr(pool, "_processes", None) or {}).values()):
                process_.kill()  # nothing is written: no reason to wait for any conversion
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


def copy_files(copies: Iterable[tuple[Path, Path]]) -> list[FileOutcome]:
    """Copy plain files for ``-o DIR``; a file that cannot be copied is a failed outcome."""
    failed = []
    for src, dest in copies:
        try:
            _copy(src, dest)
        except OSError as err:
            failed.append(FileOutcome(str(src), "failed",
                                      message=f"{dest}: cannot copy: {err.strerror}"))
    return failed


def default_jobs() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


def convert_stdin(config: Config, name: str = "-", excluded: bool = False) -> FileOutcome:
    """``-``: source on stdin, result on stdout (unless checking), messages for stderr.

    ``name`` (``--stdin-filename``) is the file's name in messages, reports and the diff.
    ``excluded`` (the name is excluded and ``--force-exclude`` is on): the input is written back
    unchanged, as black does, so that an editor integration never loses the buffer.
    """
    data = sys.stdin.buffer.read()
    shown = "<stdin>" if name == "-" else name
    if excluded:
        if config.mode == "write":
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
        return FileOutcome(name, "skipped", message=f"{shown}: excluded")
    options = replace(config.options, line_length=line_length_for(None if name == "-" else name))
    try:
        result, _ = convert_cached(data, name, replace(config, options=options),
                                   fresh=config.mode == "write")
        assert result is not None
        if result.error is not None:
            raise ConversionError(*result.error)
    except ConversionError as err:
        sys.stdout.buffer.write(data if config.mode == "write" else b"")
        return FileOutcome(name, "failed", message=err.format(shown))
    status = "converted" if result.changed else "unchanged"
    outcome = FileOutcome(name, status, result.kind, result.reason, list(result.changes))
    if config.diff and result.changed:
        outcome.diff = unified_diff(data, result.output, name)
    if config.mode == "write":
        sys.stdout.buffer.write(result.output)
        sys.stdout.flush()
    return outcome


