"""Project-wide pytest options."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

# The converter's cache (``sdp_convert.cache``) never reads or writes the developer's own: the
# whole session, subprocesses included, uses a temporary one, and each test a fresh one of its own
# (so that no test is answered from what another test converted). tests/test_cache.py exercises
# the cache itself, through the command line.
_SESSION_CACHE = tempfile.mkdtemp(prefix="sdp-convert-test-cache-")
os.environ["SDP_CONVERT_CACHE_DIR"] = _SESSION_CACHE


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_SESSION_CACHE, ignore_errors=True)


@pytest.fixture(autouse=True)
def _own_cache_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SDP_CONVERT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-goldens",
        action="store_true",
        default=False,
        help="Rewrite fixtures/<kind>/<case>/expected.py and report.txt where they differ "
        "(the tests still fail, listing the files, so that the update is reviewed with git diff).",
    )
