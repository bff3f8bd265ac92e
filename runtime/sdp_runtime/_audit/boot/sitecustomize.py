"""Put first on PYTHONPATH by ``sdp-run --audit``: turns the audit on in each rank at start-up.

Python imports one ``sitecustomize`` at start-up; this one installs the audit (when
``SDP_AUDIT`` is set: the launcher itself and other programs are left alone) and then runs the
``sitecustomize`` that would have been imported without it, if any.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys


def _audit() -> None:
    if not os.environ.get("SDP_AUDIT") or not os.environ.get("RANK"):
        return
    try:
        from sdp_runtime import _audit as audit

        audit.install()
    except Exception as error:  # never stop the job for the audit's sake
        print(f"sdp audit: not started: {error!r}", file=sys.stderr)


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_audit()
_chain()
