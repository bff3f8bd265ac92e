"""The fixed-point check against the real second pass, over the corpus (issue 39).

    .venv/bin/python benchmarks/check_fixed_point.py

``engine.convert`` proves its output a fixed point with ``engine._check_once``: a read-only walk
of the transforms' hooks that hands over to the real (rebuilding) pass at the first sign of a
change. For every input of the corpus that ``bench_scale.py`` measures (the golden fixtures, the
project fixtures' modules, the public-style scripts), and every respelled golden input of
``tests/test_engine.py`` (import spellings, some of which a second pass would change), this
converts once, then asks both the check and the real pass about the output: their verdicts,
outputs and reports (transform, message, kind) must be the same. Prints the counts, and each
input where they differ; exits 1 if any does.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests")]

from bench_scale import corpus_files  # noqa: E402
from sdp_convert import engine  # noqa: E402
from sdp_convert.base import Options  # noqa: E402
from sdp_convert.changes import ConversionError  # noqa: E402
from test_engine import _respelled  # noqa: E402


def main() -> int:
    real_pass = engine._convert_once
    fallbacks = 0

    def counted(data: bytes, options: Options, *, probe: bool = False) -> engine.Result:
        nonlocal fallbacks
        fallbacks += not probe
        return real_pass(data, options, probe=probe)

    inputs = [(str(p.relative_to(ROOT)), p.read_bytes()) for p in corpus_files()]
    inputs += [(f"respelled {case}", text.encode()) for case, text in _respelled()]
    checked = unstable = differ = 0
    for name, data in inputs:
        try:
            first = real_pass(data, Options())
        except (ConversionError, RecursionError):
            continue
        if not first.changed:
            continue
        output = engine.format_changed(data, first.output, Options().line_length)
        options = replace(Options(), recheck=first.info.origin == "vanilla")
        real = real_pass(output, options)
        engine._convert_once = counted
        try:
            check = engine._check_once(output, options)
        finally:
            engine._convert_once = real_pass
        checked += 1
        unstable += real.changed
        same = (check.changed, check.output) == (real.changed, real.output) and sorted(
            {(c.transform, c.message, c.manual) for c in check.changes}
        ) == sorted({(c.transform, c.message, c.manual) for c in real.changes})
        if not same:
            differ += 1
            print(f"DIFFERS: {name}")
    print(f"{len(inputs)} inputs, {checked} converted outputs checked, {unstable} of them not a "
          f"fixed point (the real pass would change them): the check differs from the real pass "
          f"on {differ}; it handed over to the real pass {fallbacks} times")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
