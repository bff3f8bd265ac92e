"""Ranks end with ``sdp-run``, even when ``sdp-run`` is killed with SIGKILL.

torchrun starts each rank in a session of its own (its process group is the rank's pid) and stops
a rank by signalling that group; killed with SIGKILL, it signals nothing and its ranks, and the
processes they started, run on. ``sdp-run`` therefore has torchrun start each rank through a
small bootstrap (``python -I -S -c BOOT``, the standard library only) that

1. opens pidfds of ``sdp-run`` (its parent, checked: if ``sdp-run`` is already gone the rank does
   not start) and of itself,
2. forks a watcher, which waits on both pidfds (no polling): when the rank ends first it exits;
   when ``sdp-run`` ends first it kills the rank's process group with SIGKILL (the rank, every
   process it started that stayed in its group, and the watcher itself), as torchrun would
   have stopped them,
3. execs the rank's real command, the one torchrun would have run (``python -u script args`` or
   the ``--no-python`` program): same pid, same process group, same ``sys.argv``.

The watcher is a child of the rank that holds nothing open (its standard streams are
``/dev/null``). Where pidfds are missing (Linux before 5.3, other systems) it looks every half
second instead (``/proc``, else signal 0).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

#: The bootstrap, run as ``python -I -S -c BOOT LAUNCHER_PID COMMAND...``.
BOOT = r"""
import os, signal, sys, time
launcher, command = int(sys.argv[1]), sys.argv[2:]
me, group = os.getpid(), os.getpgid(0)
try:
    fds = [os.pidfd_open(launcher), os.pidfd_open(me)]
except (AttributeError, OSError):
    fds = []
if os.getppid() != launcher:
    sys.exit("sdp-run: the launcher is gone; this rank does not start")
if os.fork() == 0:
    try:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        if fds:
            import select
            launcher_gone = fds[0] in select.select(fds, [], [])[0]
        else:
            def launcher_alive():
                if os.path.isdir("/proc/self"):
                    try:
                        with open(f"/proc/{launcher}/stat") as f:
                            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
                    except OSError:
                        return False
                try:
                    os.kill(launcher, 0)
                except ProcessLookupError:
                    return False
                except OSError:
                    pass
                return True
            while launcher_alive() and os.getppid() == me:  # the rank: this one's parent
                time.sleep(0.5)
            launcher_gone = not launcher_alive()
        if launcher_gone:
            os.killpg(group, signal.SIGKILL)
    finally:
        os._exit(0)
for fd in fds:
    os.close(fd)
try:
    os.execvp(command[0], command)
except OSError as error:
    sys.exit(f"sdp-run: cannot run {command[0]}: {error.strerror}")
"""


def wrap(torchrun_argv: Sequence[str], n_script_args: int, *, module: bool = False,
         no_python: bool = False) -> list[str]:
    """The same torchrun command line, each rank started through the bootstrap.

    ``torchrun_argv`` is ``launch.torchrun_args``'s: torchrun's flags, then the script and its
    ``n_script_args`` arguments; ``module`` / ``no_python``: sdp-run's ``-m`` / ``--no-python``
    (their torchrun flags are taken out: the bootstrap is the program torchrun runs).

    Example:
        >>> wrap(["--nproc-per-node", "2", "train.py", "--lr", "1"], 2)[:3]
        ['--nproc-per-node', '2', '--no-python']
    """
    cut = len(torchrun_argv) - n_script_args - 1
    flags = [f for f in torchrun_argv[:cut] if f not in ("--no-python", "--module")]
    script, script_args = torchrun_argv[cut], torchrun_argv[cut + 1:]
    if no_python:
        command = [script]
    else:
        python = os.environ.get("PYTHON_EXEC", sys.executable)  # torchrun's own choice
        command = [python, "-u", *(["-m"] if module else []), script]
    # -I: no PYTHON* variables, no current folder on sys.path (a signal.py there is not ours)
    boot = [sys.executable, "-I", "-S", "-c", BOOT, str(os.getpid()), *command, *script_args]
    return [*flags, "--no-python", *boot]
