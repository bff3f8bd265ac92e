"""While the machines of a fixed-size job meet, say who is missing; if one never comes, say who.

With ``--nnodes N`` (torchrun's static rendezvous) machine 0's ``sdp-run`` serves a TCPStore at
the endpoint and every machine's ``sdp-run`` connects to it; torchrun itself prints nothing while
it waits (up to ``SDP_TIMEOUT`` s, else torchrun's 600 s) and then raises a 40-line
``DistStoreError``. A roll-call thread in each ``sdp-run`` does what a person would: it checks
that the endpoint's host resolves and listens (plain sockets, so torchrun's own client is not
disturbed), signs this machine in under a key of its own (``sdp-run/joined/<node rank>``, its
number of processes as the value) and reads which machines have signed in. Every few seconds,
until all have, it prints one line (every 5 s, every 30 s after the first minute, none past the
time limit):

    sdp-run: waiting for 2 of 4 processes: node 1 has not joined (at 10.0.0.1:29500, 5 s of 600 s)
    sdp-run: waiting for node 0 at 10.0.0.1:29500: nothing listens there yet (connection
    refused) (5 s of 600 s)

and, should torchrun give up, ``failure_line`` names what never arrived in one line.
"""

from __future__ import annotations

import datetime
import socket
import sys
import threading
import time
from collections.abc import Callable

#: torchrun's static rendezvous waits this long when SDP_TIMEOUT is not set.
TORCHRUN_DEFAULT_TIMEOUT_S = 600.0
_KEY = "sdp-run/joined/{}"
#: Seconds between two reads of the roll call.
_POLL_S = 1.0


def _plural(nodes: list[int]) -> str:
    names = ", ".join(str(n) for n in nodes)
    return f"node {names} has not joined" if len(nodes) == 1 else f"nodes {names} have not joined"


class RollCall:
    """The roll-call thread of one ``sdp-run`` (``start()``, ``stop()``, ``failure_line()``).

    Arguments:
        endpoint: ``HOST:PORT`` of machine 0.
        nnodes, node_rank, nproc: the job's machines, this one's rank and its processes.
        timeout_s: how long torchrun waits for the machines; ``timeout_set``: whether it is
            SDP_TIMEOUT's (else torchrun's default).
        say: where the lines go (default: stderr).
        every_s: seconds between two waiting lines (the first after ``first_s``); after the
            first minute, ``slow_every_s``.
    """

    def __init__(self, endpoint: str, nnodes: int, node_rank: int, nproc: int, timeout_s: float,
                 say: Callable[[str], None] | None = None, every_s: float = 5.0,
                 first_s: float = 3.0, timeout_set: bool = True,
                 slow_every_s: float = 30.0) -> None:
        host, _, port = endpoint.rpartition(":")
        self.endpoint, self.host, self.port = endpoint, host.strip("[]"), int(port)
        self.nnodes, self.node_rank, self.nproc = nnodes, node_rank, nproc
        self.timeout_s, self.timeout_set = timeout_s, timeout_set
        self.say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self.every_s, self.first_s, self.slow_every_s = every_s, first_s, slow_every_s
        self.problem: str | None = "not tried yet"  # why the endpoint cannot be reached
        self.missing: list[int] | None = None  # node ranks not signed in (None: not known yet)
        self.joined: dict[int, int] = {}  # node rank -> its processes
        self.complete = False
        #: Seconds after the start when machine 0's store went away after a roll call was read
        #: (at the deadline: machine 0 gave up at the same time, the roll call stands).
        self.lost_at: float | None = None
        self._stop = threading.Event()
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="sdp-roll-call", daemon=True)

    def start(self) -> None:
        self._started = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    # ----------------------------------------------------------------------------------------

    def _run(self) -> None:
        store = None
        next_line = self._started + self.first_s
        while not self._stop.is_set():
            try:
                if store is None:
                    store = self._connect()
                if store is not None:
                    self._read(store)
            except Exception as error:  # the store went away (torchrun gave up): try again
                store, self.problem = None, f"{type(error).__name__}: {error}".splitlines()[0]
                if self.missing is not None and self.lost_at is None:
                    self.lost_at = time.monotonic() - self._started
            if self.complete:
                return
            now = time.monotonic()
            if now >= next_line and now - self._started < self.timeout_s + self.every_s:
                self.say(self.waiting_line(now - self._started))
                slow = now - self._started >= 60
                next_line = now + (self.slow_every_s if slow else self.every_s)
            self._stop.wait(_POLL_S)

    def _connect(self) -> object | None:
        """A store client once the endpoint listens; None (and ``problem`` says why) before."""
        try:
            addresses = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        except socket.gaierror as error:
            self.problem = f"the host {self.host} does not resolve ({error.strerror})"
            return None
        reason = "no answer"
        for family, kind, proto, _, address in addresses:
            with socket.socket(family, kind, proto) as probe:
                probe.settimeout(2.0)
                try:
                    probe.connect(address)
                except OSError as error:
                    reason = (error.strerror or str(error)).lower()
                    continue
                break
        else:
            self.problem = f"nothing listens there yet ({reason})"
            return None
        from torch.distributed import TCPStore

        store = TCPStore(self.host, self.port, None, False, datetime.timedelta(seconds=10),
                         wait_for_workers=False)
        store.set(_KEY.format(self.node_rank), str(self.nproc))
        self.problem = None
        return store

    def _read(self, store: object) -> None:
        missing, joined = [], {}
        for rank in range(self.nnodes):
            key = _KEY.format(rank)
            if store.check([key]):  # type: ignore[attr-defined]
                joined[rank] = int(store.get(key))  # type: ignore[attr-defined]
            else:
                missing.append(rank)
        self.missing, self.joined = missing, joined
        self.complete = not missing

    # ----------------------------------------------------------------------------------------

    def _counts(self) -> tuple[int, int]:
        """(processes missing, processes in all); a missing machine is counted with as many
        processes as this one."""
        missing = len(self.missing or []) * self.nproc
        return missing, missing + sum(self.joined.values())

    def waiting_line(self, elapsed: float) -> str:
        """The line printed every few seconds while the machines meet."""
        clock = f"{elapsed:.0f} s of {self.timeout_s:g} s"
        if self.problem is not None or self.missing is None:
            what = self.problem or "no answer yet"
            return f"sdp-run: waiting for node 0 at {self.endpoint}: {what} ({clock})"
        waiting, total = self._counts()
        return (f"sdp-run: waiting for {waiting} of {total} processes: {_plural(self.missing)} "
                f"(at {self.endpoint}, {clock})")

    def failure_line(self, error: BaseException) -> str:
        """The one line that replaces torchrun's traceback when the machines never all met."""
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        limit = f"within {self.timeout_s:g} s " + (
            "(SDP_TIMEOUT)" if self.timeout_set else "(torchrun's default; SDP_TIMEOUT sets it)")
        if self.complete or not any(word in first.lower() for word in ("timed out", "timeout")):
            # not a wait that ran out (the port is taken, the store went away): torch's words
            return f"sdp-run: error: the rendezvous at {self.endpoint} failed: {first}"
        # Machine 0 ends the rendezvous (its store) when its own wait runs out, which may be a
        # moment before this machine's: the roll call read until then is the answer.
        at_deadline = self.lost_at is not None and self.lost_at >= self.timeout_s - 2 * _POLL_S
        if (self.problem is not None and not at_deadline) or self.missing is None:
            what = self.problem or first
            return (f"sdp-run: error: node 0 never answered at {self.endpoint} {limit}: {what}; "
                    "no process was started")
        missing = self.missing
        verb = "node {} never joined" if len(missing) == 1 else "nodes {} never joined"
        names = verb.format(", ".join(str(n) for n in missing))
        return (f"sdp-run: error: {names} the rendezvous at {self.endpoint} {limit} "
                f"({len(self.joined)} of {self.nnodes} machines came); no process was started")
