"""False-positive review: run ``sdp-convert --check`` over installed packages' sources.

Library code (torch, tensorflow, keras, ...) is not a training script. Every file sdp-convert would
change there is listed with the reason it was judged a training script, so the list can be
reviewed; results go to ``benchmarks/results/site_packages.md``.

Usage: ``.venv/bin/python benchmarks/scan_packages.py [PACKAGE ...]`` (default: torch tensorflow
keras numpy libcst).
"""

from __future__ import annotations

import importlib.util
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SDP_CONVERT = str(Path(sys.executable).with_name("sdp-convert"))


def package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def main(argv: list[str]) -> int:
    names = argv or ["torch", "tensorflow", "keras", "numpy", "libcst"]
    rows, flagged, failures = [], [], []
    for name in names:
        root = package_dir(name)
        if root is None:
            print(f"{name}: not installed, skipped")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "r.json"
            start = time.perf_counter()
            subprocess.run(
                [SDP_CONVERT, "--check", "-q", str(root), "--report", str(report),
                 "--report-format", "json"],
                capture_output=True, timeout=3600,
            )
            seconds = time.perf_counter() - start
            doc = json.loads(report.read_text())
        s = doc["summary"]
        rows.append((name, len(doc["files"]), s["converted"], s["failed"], seconds))
        for f in doc["files"]:
            rel = Path(f["path"]).relative_to(root.parent).as_posix()
            if f["status"] == "converted":
                flagged.append((rel, f["kind"], f["reason"]))
            elif f["status"] == "failed":
                failures.append((rel, f["message"].split(": ", 1)[-1]))
    lines = [
        "# sdp-convert --check over installed packages",
        "",
        f"Run {time.strftime('%Y-%m-%d')} with "
        f"`{' '.join(['benchmarks/scan_packages.py', *names])}` "
        f"on {platform.processor() or platform.machine()}, Python {platform.python_version()}.",
        "",
        "| package | files | would change | failed | seconds |",
        "| --- | ---: | ---: | ---: | ---: |",
        *[f"| {n} | {f} | {c} | {x} | {t:.1f} |" for n, f, c, x, t in rows],
        "",
        "## Files that would change, and why they were judged training scripts",
        "",
        *([f"- `{p}` ({k}): {r}" for p, k, r in sorted(flagged)] or ["(none)"]),
        "",
        "## Files that failed",
        "",
        *([f"- `{p}`: {m}" for p, m in sorted(failures)] or ["(none)"]),
        "",
    ]
    text = "\n".join(lines)
    print(text)
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "site_packages.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
