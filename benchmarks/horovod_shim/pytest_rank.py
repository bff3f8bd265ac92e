"""One rank of a Horovod test suite run (test plumbing for ``benchmarks/horovod_suites.py``).

Started by ``sdp-run -n 2 pytest_rank.py SUITE JUNIT_DIR``: sets the variables ``horovodrun
--gloo`` gives each process (``HOROVOD_RANK``, ``HOROVOD_SIZE``, ...), from torchrun's, so that
the suites take their Gloo code paths as under horovodrun; puts the shim's ``horovod`` first on
the path; runs pytest on the suite with a per-test time limit and a JUnit XML report for this
rank. It always exits 0 once pytest has run (failures are in the report): a rank that exited
non-zero first would make sdp-run stop the other before it finished its tests.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main() -> int:
    suite, junit_dir = Path(sys.argv[1]), Path(sys.argv[2])
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
        str(suite), "-p", "no:cacheprovider", "-q", "-rN",
        f"--junitxml={junit_dir / f'rank{rank}.xml'}", f"--timeout={per_test}",
        "-o", "junit_family=xunit1", "--rootdir", str(suite.parent),
    ])
    return 0


if __name__ == "__main__":
    sys.exit(main())
