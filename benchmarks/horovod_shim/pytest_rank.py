"""One rank of a Horovod test suite run (test plumbing for ``benchmarks/horovod_suites.py``).

Started by ``sdp-run -n 2 pytest_rank.py SUITE OUT_DIR [TESTS_FILE]``: sets the variables
``horovodrun --gloo`` gives each process (``HOROVOD_RANK``, ``HOROVOD_SIZE``, ...), from
torchrun's, so that the suites take their Gloo code paths as under horovodrun (or, with
``HOROVOD_SUITE_MODE=mpi``, mpirun's ``OMPI_COMM_WORLD_*``: their MPI code paths); puts the shim's
``horovod`` first on the path; runs pytest on the suite with a per-test time limit, writing each
test's outcome to ``OUT_DIR/rank<r>.jsonl`` as soon as it is known (so that a run stopped at its
time limit still tells what ran), and rank 0 lists every test collected in
``OUT_DIR/collected.json``. With ``TESTS_FILE`` (a JSON list of test ids) only those run.

A test that leaves the job unusable (a collective that timed out or lost its peer: a Horovod test
that makes the ranks call different collectives) fails, and the rank then exits with status 3 at
once, so that sdp-run stops the other rank too; ``horovod_suites.py`` starts the suite again with
the tests that have not run (the runtime, like Horovod, does not recover a job whose collectives
fell out of step). Otherwise it exits 0 once pytest has run (failures are in the report).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

#: A failure that leaves the job's collectives unusable.
_BROKEN = re.compile(r"CommunicationError|pair closure|Connection reset by peer|connectFullMesh|"
                     r"Timed out waiting|Connection closed by peer|Timeout >")


class _Outcomes:
    """A pytest plugin: a JSON line when a test starts, and one per phase that did not pass."""

    def __init__(self, path: Path, collected: Path | None) -> None:
        self.out = open(path, "a", buffering=1)  # noqa: SIM115 (open for the whole run)
        self.collected = collected

    def pytest_collection_finish(self, session: Any) -> None:
        if self.collected is not None:
            ids = [item.nodeid.split("::", 1)[-1] for item in session.items]
            self.collected.write_text(json.dumps(ids))

    def _write(self, nodeid: str, when: str, outcome: str, message: str = "") -> None:
        record = {"test": nodeid.split("::", 1)[-1], "when": when, "outcome": outcome,
                  "message": message[:2000]}
        self.out.write(json.dumps(record) + "\n")

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        self._write(nodeid, "start", "started")

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.passed and report.when != "call":
            return
        message = ""
        if report.skipped and isinstance(report.longrepr, tuple):
            message = str(report.longrepr[2])
        elif report.failed:
            lines = report.longreprtext.strip().splitlines() or [""]
            errors = [line[1:].strip() for line in lines if line.startswith("E ")]
            typed = [e for e in errors if re.match(r"[\w.]+(Error|Exception|Failed)\b", e)]
            message = (typed or errors or lines[-1:])[0]
        self._write(report.nodeid, report.when, report.outcome, message)
        if report.failed and _BROKEN.search(message):
            self._write(report.nodeid, report.when, "broke the job")
            self.out.close()
            os._exit(3)  # sdp-run stops the other rank; horovod_suites.py goes on without it


def main() -> int:
    suite, out_dir = Path(sys.argv[1]), Path(sys.argv[2])
    only = json.loads(Path(sys.argv[3]).read_text()) if len(sys.argv) > 3 else None
    per_test = os.environ.get("HOROVOD_SUITE_TEST_TIMEOUT", "120")
    rank = os.environ.get("RANK", "0")
    # horovodrun --gloo's variables (the suites then shut down and init again around each test),
    # or mpirun's (HOROVOD_SUITE_MODE=mpi: one init for the whole suite, MPI's code paths).
    prefix = "OMPI_COMM_WORLD" if os.environ.get("HOROVOD_SUITE_MODE") == "mpi" else "HOROVOD"
    for ours, theirs in (("RANK", "RANK"), ("SIZE", "WORLD_SIZE"), ("LOCAL_RANK", "LOCAL_RANK"),
                         ("LOCAL_SIZE", "LOCAL_WORLD_SIZE")):
        os.environ[f"{prefix}_{ours}"] = os.environ.get(theirs, "0" if "RANK" in ours else "1")
    if prefix == "HOROVOD":
        os.environ.setdefault("HOROVOD_CROSS_RANK", "0")
        os.environ.setdefault("HOROVOD_CROSS_SIZE", "1")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(1, str(suite.parent))

    import pytest

    targets = [f"{suite}::{test}" for test in only] if only else [str(suite)]
    collected = out_dir / "collected.json" if rank == "0" and not only else None
    pytest.main([
        *targets, "-p", "no:cacheprovider", "-q", "-rN", f"--timeout={per_test}",
        "--rootdir", str(suite.parent),
    ], plugins=[_Outcomes(out_dir / f"rank{rank}.jsonl", collected)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
