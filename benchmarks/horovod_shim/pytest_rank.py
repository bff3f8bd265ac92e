"""One rank of a Horovod test suite run (test plumbing for ``benchmarks/horovod_suites.py``).

Started by ``sdp-run -n 2 pytest_rank.py SUITE OUT_DIR``: sets the variables ``horovodrun
--gloo`` gives each process (``HOROVOD_RANK``, ``HOROVOD_SIZE``, ...), from torchrun's, so that
the suites take their Gloo code paths as under horovodrun; puts the shim's ``horovod`` first on
the path; runs pytest on the suite with a per-test time limit, writing each test's outcome to
``OUT_DIR/rank<r>.jsonl`` as soon as it is known (so that a run stopped at its time limit still
tells what ran). It always exits 0 once pytest has run (failures are in the report): a rank that
exited non-zero first would make sdp-run stop the other before it finished its tests.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any


class _Outcomes:
    """A pytest plugin: a JSON line when a test starts, and one per phase that did not pass."""

    def __init__(self, path: Path) -> None:
        self.out = open(path, "a", buffering=1)  # noqa: SIM115 (open for the whole run)

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


def main() -> int:
    suite, out_dir = Path(sys.argv[1]), Path(sys.argv[2])
    per_test = os.environ.get("HOROVOD_SUITE_TEST_TIMEOUT", "120")
    rank = os.environ.get("RANK", "0")
    for ours, theirs in (("HOROVOD_RANK", "RANK"), ("HOROVOD_SIZE", "WORLD_SIZE"),
                         ("HOROVOD_LOCAL_RANK", "LOCAL_RANK"),
                         ("HOROVOD_LOCAL_SIZE", "LOCAL_WORLD_SIZE")):
        os.environ[ours] = os.environ.get(theirs, "0" if "RANK" in ours else "1")
    os.environ.setdefault("HOROVOD_CROSS_RANK", "0")
    os.environ.setdefault("HOROVOD_CROSS_SIZE", "1")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(1, str(suite.parent))

    import pytest

    pytest.main([
        str(suite), "-p", "no:cacheprovider", "-q", "-rN", f"--timeout={per_test}",
        "--rootdir", str(suite.parent),
    ], plugins=[_Outcomes(out_dir / f"rank{rank}.jsonl")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
