"""``sdp_runtime.notebook_launcher``: run a function on N processes of this machine, from a
running notebook (what Accelerate's ``notebook_launcher`` does, with ``sdp-run``'s behaviour).

The processes are forked, not spawned: a function defined in a notebook cell lives in the
kernel's ``__main__``, which a spawned process cannot import (pickle sends functions by name),
while a forked one has it already, with every name the earlier cells defined. torch's elastic
agent (what torchrun runs) starts and watches them (``start_method="fork"``), so a rank that
fails stops the others at once; each rank's output lines are prefixed ``[rankN]: `` and reach
the notebook through the kernel's own streams. Forking rules out CUDA in the notebook's own
process beforehand (CUDA cannot be used in a forked child once the parent initialised it):
this is checked, as Accelerate does.

In each rank, the function runs like a script under ``sdp-run``: ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ... set (``sdp.init()`` finds them), the audit installed first when asked, the
process's exit handlers run when it returns (``sdp.shutdown()``: the ranks leave together), an
uncaught exception printed with its traceback and recorded for the launcher.

A converted notebook calls ``sdp.init()`` in its first cell, so the kernel itself may run the
runtime as one process (rank 0 of 1). The launcher then leaves that one-process group while the
ranks run, joins each rank to the job before calling the function (which therefore must not
call ``sdp.init()`` again), and joins the kernel's one-process group again afterwards.
"""

from __future__ import annotations

# Only modules Python has loaded at start-up anyway: ``import sdp_runtime`` stays cheap (the
# others are imported when the launcher is called).
import atexit
import contextlib
import io
import os
import signal
import sys
import time

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from typing import Any

_PREFIX = "[rank{rank}]: "
#: The signals torch's agent takes over while it runs (given back afterwards).
_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


class LaunchError(RuntimeError):
    """A rank of ``notebook_launcher`` failed (the others were stopped), or the audit found a
    problem with ``audit="strict"``.

    Attributes: ``rank`` (the rank that failed first; None for the audit), ``status`` (its exit
    status, or 3 for the audit), ``traceback`` (the end of the rank's traceback, "" if none).
    """

    def __init__(self, message: str, rank: int | None, status: int, trace: str = "") -> None:
        super().__init__(message)
        self.rank, self.status, self.traceback = rank, status, trace


def notebook_launcher(
    function: Callable[..., Any],
    args: Sequence[Any] = (),
    num_processes: int | None = None,
    *,
    audit: bool | str = False,
    audit_report: str | None = None,
    prefix: bool = True,
) -> list[Any]:
    """Run ``function(*args)`` on ``num_processes`` processes of this machine, from a notebook.

    The notebook's version of ``sdp-run -n N``: call it in a cell, with the training in a
    function. Each rank is a fork of the kernel, so the function and everything the earlier
    cells defined are there. When the notebook's own process has called ``sdp.init()`` (a
    converted notebook's first cell does), each rank is joined to the job before the function
    runs; otherwise the function calls ``sdp.init()`` first. A rank that fails stops the others
    within seconds and the call raises ``LaunchError`` naming it; its traceback is in the
    cell's output, as it happened.

    Arguments:
        function: the training function; defined in the notebook or imported.
        args: its arguments (the same in every rank).
        num_processes: how many processes; default one per GPU here, else 1.
        audit: ``True`` checks, while it trains, that the ranks train one model on split data
            and prints the audit's report at the end (``sdp-run --audit``); ``"strict"`` also
            raises ``LaunchError`` when it finds a problem.
        audit_report: with ``audit``, also write the audit's report to this file, as JSON.
        prefix: prefix each output line with ``[rankN]: `` (default).

    Returns:
        Each rank's return value, by rank (they must be picklable).

    Raises:
        LaunchError: a rank failed (``.rank``, ``.status``, ``.traceback``), or the strict
            audit found a problem.
        RuntimeError: CUDA was used in this process before the call, this process is a rank
            of a job already, or this system cannot fork.
        KeyboardInterrupt: the kernel was interrupted; every rank was stopped.

    Example:
        >>> from sdp_runtime import notebook_launcher
        >>> def train(epochs):
        ...     import sdp_runtime.torch as sdp
        ...     sdp.init()
        ...     ...  # the converted training
        ...     return sdp.rank()
        >>> notebook_launcher(train, args=(3,), num_processes=2)
        [0, 1]
    """
    import multiprocessing

    if "fork" not in multiprocessing.get_all_start_methods():
        raise RuntimeError("notebook_launcher forks the notebook's process, and this system "
                           "cannot fork: use sdp-run on an exported script instead")
    initialised = _kernel_runtime()
    from . import launch

    nproc = launch._count_nproc(launch.Plan(num_processes, 1, 0, None))
    if nproc < 1:
        raise ValueError(f"num_processes={num_processes}: give 1 or more")
    if audit not in (False, True, "on", "strict"):
        raise ValueError(f"audit={audit!r}: give True, False or 'strict'")
    failure: list[LaunchError] = []
    results: list[list[Any]] = []

    def once() -> int:
        try:
            results.append(_launch(function, tuple(args), nproc, prefix, initialised))
        except LaunchError as error:
            failure.append(error)
            return error.status
        return 0

    if initialised:  # a one-process runtime: left while the ranks run, joined again after
        sys.modules["sdp_runtime._comm"].shutdown()
    try:
        if audit or audit_report:
            import argparse

            from ._audit import launcher

            mode = "strict" if audit == "strict" else "on"
            status = launcher.run_audited(
                argparse.Namespace(audit=mode, audit_report=audit_report), once)
        else:
            status = once()
    finally:
        if initialised:
            sys.modules["sdp_runtime._comm"].init()
    if failure:
        raise failure[0]
    if status:
        raise LaunchError("the audit found a problem (audit='strict'): see its report above",
                          None, status)
    return results[0]


def _kernel_runtime() -> bool:
    """Whether the notebook's own process runs the runtime as one process (a converted
    notebook's first cell called ``sdp.init()``); raise where the ranks cannot be forked from it.
    """
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise RuntimeError(
            "CUDA was used in this notebook's own process before notebook_launcher: the forked "
            "ranks cannot use it. Restart the kernel and leave every CUDA call (.cuda(), "
            ".to('cuda'), torch.cuda.*) inside the launched function")
    comm = sys.modules.get("sdp_runtime._comm")
    if comm is None or not comm.is_initialized():
        return False
    if comm.size() > 1 or not comm._state.owns_group:
        raise RuntimeError(
            "this process is already a rank of a job of "
            f"{comm.size()} processes (or runs a process group of its own): notebook_launcher "
            "starts a job from a notebook's one process; call the function directly here")
    return True


def _launch(function: Callable[..., Any], args: tuple[Any, ...], nproc: int,
            prefix: bool, initialise: bool) -> list[Any]:
    import tempfile
    import uuid

    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from . import launch

    for stream in (sys.stdout, sys.stderr):  # what is buffered would be written by every fork
        with contextlib.suppress(Exception):
            stream.flush()
    with tempfile.TemporaryDirectory(prefix="sdp-notebook-") as folder, \
            _environment(nproc, os.path.join(folder, "exits")), _signals_kept(), \
            launch.quiet_torch_logs():
        config = LaunchConfig(
            min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"sdp-{uuid.uuid4().hex}",
            rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0,
            monitor_interval=0.1, start_method="fork",
            logs_specs=DefaultLogsSpecs(log_dir=os.path.join(folder, "logs")),
        )
        try:
            returned = elastic_launch(config, _rank)(function, args, prefix, initialise)
        except ChildFailedError as error:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            reports = launch._read_reports(os.path.join(folder, "exits"))
            # The agent names the first process it saw end, which may be a rank that only
            # followed another's failure: every rank that recorded one is a candidate.
            failures = {**{r: _Ended(rec) for r, rec in reports.items()}, **error.failures}
            rank, why, status, trace = launch.first_failure(failures, reports)
            raise LaunchError(f"rank {rank} failed first: {why}; the other ranks were stopped",
                              rank, status, trace) from None
        except SignalException as stop:
            raise KeyboardInterrupt(f"stopped by {signal.Signals(stop.sigval).name}; every "
                                    "rank was stopped") from None
    return [returned[r] for r in range(nproc)]


class _Ended:
    """A rank that recorded its failure, as torch's agent describes a failed process."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.exitcode, self.timestamp = 1, float(record.get("time", 0.0))

    def signal_name(self) -> str:
        return ""


@contextlib.contextmanager
def _environment(nproc: int, reports: str) -> Iterator[None]:
    """The variables the ranks inherit (sdp-run's), given back afterwards."""
    from . import launch

    saved = dict(os.environ)
    os.makedirs(reports, exist_ok=True)
    os.environ["SDP_RUN_REPORT_DIR"] = reports  # where a failing rank says why
    os.environ["SDP_RUN_PREFIXED"] = "1"  # the ranks' lines are prefixed here: torch adds none
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, launch._cores() // nproc)))
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _signals_kept() -> Iterator[None]:
    """torch's agent takes SIGINT (the kernel's interrupt) and others for itself: give them
    back afterwards."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    numbers = [getattr(signal, name) for name in _SIGNALS if hasattr(signal, name)]
    saved = {n: signal.getsignal(n) for n in numbers}
    try:
        yield
    finally:
        for n, handler in saved.items():
            with contextlib.suppress(TypeError, ValueError, OSError):
                signal.signal(n, handler if handler is not None else signal.SIG_DFL)


# ---------------------------------------------------------------------------------------------
# In each rank (a fork of the notebook's process)


class _Prefixed(io.TextIOBase):
    """A text stream that writes whole lines, each prefixed, to ``target``; ``flush()`` also
    writes a started line (progress bars)."""

    def __init__(self, target: Any, prefix: str) -> None:
        super().__init__()
        self.target, self.prefix, self.pending = target, prefix, ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.pending += text
        if "\n" in self.pending:
            whole, _, self.pending = self.pending.rpartition("\n")
            self._emit(whole + "\n")
        return len(text)

    def flush(self) -> None:
        if self.pending:
            text, self.pending = self.pending, ""
            self._emit(text)
        with contextlib.suppress(Exception):
            self.target.flush()

    def _emit(self, text: str) -> None:
        lines = text.splitlines(keepends=True)
        self.target.write("".join(self.prefix + line for line in lines))
        with contextlib.suppress(Exception):
            self.target.flush()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return str(getattr(self.target, "encoding", None) or "utf-8")

    def isatty(self) -> bool:
        return False


def _rank(function: Callable[..., Any], args: tuple[Any, ...], prefix: bool,
          initialise: bool) -> Any:
    """One rank: ``function(*args)`` as a process of its own would run it; ``initialise``: join
    the job first (the notebook's process had called ``sdp.init()``)."""
    atexit._clear()  # the kernel's exit handlers are not this process's
    # The agent stops a rank with SIGTERM, and an interrupted kernel sends SIGINT to its
    # process group: a rank reacts as a process of its own (the handlers are torch's, inherited).
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    rank = int(os.environ.get("RANK", "0"))
    if prefix:
        sys.stdout = _Prefixed(sys.stdout, _PREFIX.format(rank=rank))
        sys.stderr = _Prefixed(sys.stderr, _PREFIX.format(rank=rank))
    # Not the kernel's hook (IPython's, which talks to the notebook over sockets a fork must
    # not use): Python's, over which sdp.init() puts the runtime's, even where the kernel ran
    # sdp.init() once before.
    from ._notebook import print_exception

    sys.excepthook = print_exception
    exits = sys.modules.get("sdp_runtime._exit")
    if exits is not None:
        setattr(exits, "_hook_installed", False)  # noqa: B010 - another module's flag
    comm = sys.modules.get("sdp_runtime._comm")
    if comm is not None:  # its exit handler (sdp.shutdown) went with the kernel's: again
        setattr(comm, "_atexit_registered", False)  # noqa: B010
    _display_as_text()
    if os.environ.get("SDP_AUDIT"):  # what sdp-run's start-up hook does in each rank
        from . import _audit

        _audit.install()
    try:
        if initialise:
            from . import _comm

            _comm.init()
        result = function(*args)
    except SystemExit as leave:  # sys.exit(...): as a script's, without a traceback
        code = leave.code
        if code is None or code == 0:
            _leave(None)
            return None
        if not isinstance(code, int):
            print(code, file=sys.stderr)
        _leave(code if isinstance(code, int) else 1)
    except KeyboardInterrupt:
        _leave(128 + signal.SIGINT, handlers=False)
    except BaseException as error:
        _failed(error, rank)
        if initialise and type(error).__name__ == "AlreadyInitializedError":
            print("sdp_runtime: notebook_launcher joined this rank to the job already, because the "
                  "notebook's own process had called sdp.init() (a converted notebook's first "
                  "cell): leave sdp.init() out of the function", file=sys.stderr)
        _leave(1)
    _leave(None)
    return result


def _display_as_text() -> None:
    """In a fork of a Jupyter kernel, ``display(...)`` prints its text, like ``print``: the
    kernel's own publisher sends to the notebook over a socket that a fork must not use (ipykernel
    drops such messages with a warning)."""
    shells = sys.modules.get("IPython.core.interactiveshell")
    if shells is None or not shells.InteractiveShell.initialized():
        return
    from IPython.core.displaypub import DisplayPublisher

    shell = shells.InteractiveShell.instance()
    shell.display_pub = DisplayPublisher(shell=shell)


def _failed(error: BaseException, rank: int) -> None:
    """Print the traceback (through the runtime's hook after ``sdp.init()``, which records the
    failure), and record it for the launcher when nothing else did."""
    tb = error.__traceback__.tb_next if error.__traceback__ else None  # not this frame
    sys.excepthook(type(error), error.with_traceback(tb), tb)
    folder = os.environ.get("SDP_RUN_REPORT_DIR")
    if folder and not os.path.exists(os.path.join(folder, f"rank{rank}.json")):
        from . import _exit

        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        summary = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
        import traceback

        text = "".join(traceback.format_exception(type(error), error, tb))[-8000:]
        _exit._write_report(folder, {"rank": rank, "status": "failed", "error": summary[:500],
                                     "time": time.time(), "caused_by_peer": False,
                                     "traceback": text})


def _leave(status: int | None, handlers: bool = True) -> None:
    """Run this process's exit handlers (``sdp.shutdown()``, the audit's end), as a process
    of its own would at exit; then end it with ``status`` (None: return to torch's agent)."""
    if handlers:
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if status is not None:
        os._exit(status)
