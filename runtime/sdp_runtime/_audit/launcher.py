"""``sdp-run --audit``: turn the audit on in the ranks, and report once the job has ended."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable

from . import report, settings

BOOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "boot")


def run_audited(args: argparse.Namespace, launch: Callable[[], int]) -> int:
    """Run ``launch`` with the audit on in every rank; print the report; the exit status.

    The mode comes from ``--audit`` / ``--audit=strict``, else ``SDP_AUDIT``; ``--audit-report``
    (else ``SDP_AUDIT_REPORT``) names the JSON report.
    """
    try:
        mode = args.audit or settings().mode
    except ValueError as error:
        print(f"sdp-run: error: {error}", file=sys.stderr)
        return 2
    if mode == "off":
        if not args.audit_report:
            return launch()  # SDP_AUDIT=0
        mode = "on"  # --audit-report alone
    json_path = args.audit_report or os.environ.get("SDP_AUDIT_REPORT") or None
    saved = {k: os.environ.get(k) for k in
             ("SDP_AUDIT", "SDP_AUDIT_DIR", "SDP_AUDIT_REPORT", "PYTHONPATH")}
    with tempfile.TemporaryDirectory(prefix="sdp-audit-") as folder:
        os.environ["SDP_AUDIT"] = mode
        os.environ["SDP_AUDIT_DIR"] = folder
        os.environ.pop("SDP_AUDIT_REPORT", None)  # the launcher writes it, not the ranks
        path = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = BOOT + (os.pathsep + path if path else "")
        try:
            status = launch()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        sys.stdout.flush()
        return report.finish_in_launcher(
            folder, mode, os.path.abspath(json_path) if json_path else None, status)
