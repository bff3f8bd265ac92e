"""Project-wide pytest options."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-goldens",
        action="store_true",
        default=False,
        help="Rewrite fixtures/<kind>/<case>/expected.py and report.txt where they differ "
        "(the tests still fail, listing the files, so that the update is reviewed with git diff).",
    )
