"""Where the converter's time goes: cProfile of ``engine.convert`` over the benchmark corpus.

Usage: ``.venv/bin/python benchmarks/profile_convert.py [--variants N] [--top K] [--sort S]``
(the corpus of ``bench_convert.py``; one process, one core). Prints the phases (parse, metadata,
one pass, fixed-point re-check) and the functions that take the most time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_convert import corpus  # noqa: E402
from sdp_convert.base import Options  # noqa: E402
from sdp_convert.engine import convert  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--variants", type=int, default=48)
    parser.add_argument("--top", type=int, default=45)
    parser.add_argument("--sort", default="tottime")
    parser.add_argument("--out", help="also write the pstats dump here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sources = [p.read_bytes() for p in corpus(Path(tmp), args.variants)]
    options = Options()
    for s in sources:  # warm the imports and the per-class caches
        convert(s, options)
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    for s in sources:
        convert(s, options)
    profiler.disable()
    print(f"{len(sources)} files, {time.perf_counter() - start:.2f} s under the profiler")
    if args.out:
        profiler.dump_stats(args.out)
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats(args.sort).print_stats(args.top)
    print(text.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
