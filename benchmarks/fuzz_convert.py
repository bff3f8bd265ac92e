"""Fuzz the converter through its real command line: generated bad inputs, in trees, run with
``--check``, ``--diff`` and in place (``-j 2``), each run under a time limit.

    .venv/bin/python benchmarks/fuzz_convert.py [--seed 0] [--inputs 300] [--group 25]

Inputs are mutations of real training scripts (``fixtures/*/*/input.py``) and hand-made shapes:
bytes flipped, lines cut or repeated, brackets nested thousands deep, long flat files, NUL
bytes, bad encodings and coding cookies, Python 2, mixed tabs, CRLF, code CPython rejects but
libcst parses, notebooks with broken JSON shapes, FIFOs and symlink loops. They are written
``--group`` to a folder (a folder is one run, so neighbours meet in project mode), and counted:

* ``tracebacks``: a Python traceback, or an "internal error" line, on stderr;
* ``hangs``: a run past its time limit (killed);
* ``damaged``: a file changed by ``--check``/``--diff``, a file that compiled and was written
  so that it no longer compiles, a file CPython rejects that was written (converted) anyway, a
  file that failed but was written anyway;
* ``bad exit``: an exit status other than 0, 1, 2.

Prints the counts; exits 1 when any of them is not zero.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SDP_CONVERT = str(Path(sys.executable).with_name("sdp-convert"))


def _compiles(data: bytes) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(data, "<fuzz>", "exec", dont_inherit=True)
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError, UnicodeDecodeError):
        return False


def _seeds() -> list[bytes]:
    found = sorted(ROOT.glob("fixtures/*/*/input.py"))
    return [p.read_bytes() for p in found] or [b"import torch\n"]


def _mutate(rng: random.Random, seed: bytes) -> tuple[str, bytes]:
    kind = rng.choice(["flip", "cut", "repeat", "nest", "flat", "nul", "cookie", "py2",
                       "tabs", "crlf", "cpython_rejects", "truncate", "splice", "unicode"])
    data = bytearray(seed)
    if kind == "flip" and data:
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
    elif kind == "cut":
        lines = bytes(data).split(b"\n")
        del lines[rng.randrange(len(lines))]
        data = bytearray(b"\n".join(lines))
    elif kind == "repeat":
        lines = bytes(data).split(b"\n")
        i = rng.randrange(len(lines))
        lines[i:i] = [lines[i]] * rng.randint(2, 50)
        data = bytearray(b"\n".join(lines))
    elif kind == "nest":
        depth = rng.choice([100, 190, 250, 1000, 5000])
        opener, closer = rng.choice([(b"(", b")"), (b"[", b"]"), (b"{", b"}")])
        data += b"\nx = " + opener * depth + b"1" + closer * depth + b"\n"
    elif kind == "flat":
        data += b"".join(b"v%d = %d\n" % (i, i) for i in range(rng.choice([1000, 3000])))
    elif kind == "nul":
        data.insert(rng.randrange(len(data) + 1), 0)
    elif kind == "cookie":
        data[:0] = rng.choice([b"# -*- coding: nonsense -*-\n", b"# coding: latin-1\n\xe9\xff\n",
                               b"\xef\xbb\xbf# coding: latin-1\n"])
    elif kind == "py2":
        data += b"\nprint 'done'\nexec 'x = 1'\n"
    elif kind == "tabs":
        data = bytearray(bytes(data).replace(b"    ", b"\t", rng.randint(1, 5)))
    elif kind == "crlf":
        data = bytearray(bytes(data).replace(b"\n", b"\r\n"))
        if rng.random() < 0.5 and len(data) > 10:
            data[len(data) // 2:len(data) // 2] = b"\r"
    elif kind == "cpython_rejects":
        data += rng.choice([b"\nreturn 1\n", b"\nnonlocal x\n", b"\nbreak\n",
                            b"\ndef f(a, a):\n    pass\n", b"\nyield 1\n", b"\nawait x\n"])
    elif kind == "truncate" and data:
        data = data[: rng.randrange(len(data))]
    elif kind == "splice":
        other = bytearray(rng.choice(_SEEDS))
        cut = rng.randrange(len(data) + 1)
        data = data[:cut] + other[rng.randrange(len(other) + 1):]
    elif kind == "unicode":
        data += "\nπ = 3.14\nnaïve = 'é' * 3\n".encode()
    return kind, bytes(data)


def _notebook(rng: random.Random, seed: bytes) -> bytes:
    shapes = [
        {"cells": [1, 2]}, {"cells": None}, [1], "x", {"cells": "abc"},
        {"cells": [{"cell_type": "code", "source": 5}]},
        {"cells": [{"cell_type": "code", "source": ["a", 1]}]},
        {"cells": [{"cell_type": "code", "source": seed.decode("utf-8", "replace")}]},
        {"nocells": []},
    ]
    shape = rng.choice(shapes)
    text = json.dumps(shape)
    if rng.random() < 0.2:
        text = text[: rng.randrange(len(text) + 1)]
    return text.encode()


_SEEDS: list[bytes] = []
#: A report line (a change or a manual item), not an error: ``path:line:col: [transform] ...``.
_REPORT = re.compile(r"^.+:\d+:\d+: \[")


def generate(root: Path, rng: random.Random, count: int, group: int) -> dict[Path, bytes]:
    """Write ``count`` inputs under ``root`` (``group`` per folder); their original bytes."""
    inputs: dict[Path, bytes] = {}
    for n in range(count):
        folder = root / f"g{n // group:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        roll = rng.random()
        if roll < 0.08:
            path = folder / f"nb{n}.ipynb"
            data = _notebook(rng, rng.choice(_SEEDS))
        elif roll < 0.10:
            path = folder / f"pipe{n}.py"
            os.mkfifo(path)
            continue
        elif roll < 0.11:
            path = folder / f"loop{n}.py"
            path.symlink_to(path)
            continue
        else:
            kind, data = _mutate(rng, rng.choice(_SEEDS))
            path = folder / f"{kind}{n}.py"
        path.write_bytes(data)
        inputs[path] = data
    return inputs


def _run(command: list[str], args: list[str], timeout: float) -> tuple[int | None, str]:
    proc = subprocess.Popen([*command, *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout)
        return proc.returncode, err
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        return None, ""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--inputs", type=int, default=300)
    parser.add_argument("--group", type=int, default=25)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--command", default=SDP_CONVERT,
                        help="the converter to run (e.g. another version's, for a comparison)")
    args = parser.parse_args()
    _SEEDS.extend(_seeds())
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="sdp-fuzz-"))
    counts = {"inputs": 0, "runs": 0, "tracebacks": 0, "hangs": 0, "damaged": 0, "bad exit": 0}
    start = time.monotonic()
    try:
        inputs = generate(work / "tree", rng, args.inputs, args.group)
        counts["inputs"] = args.inputs
        env = dict(os.environ, SDP_CONVERT_CACHE_DIR=str(work / "cache"))
        os.environ.update(env)
        for folder in sorted((work / "tree").iterdir()):
            mine = {p: d for p, d in inputs.items() if p.parent == folder}
            for mode in (["--check"], ["--diff"], []):
                code, err = _run(shlex.split(args.command), [*mode, "-j", "2", str(folder)],
                                 args.timeout)
                counts["runs"] += 1
                if code is None:
                    counts["hangs"] += 1
                    print(f"HANG {mode} {folder}", flush=True)
                    continue
                if code not in (0, 1, 2):
                    counts["bad exit"] += 1
                    print(f"EXIT {code} {mode} {folder}\n{err[-2000:]}", flush=True)
                bad = [ln for ln in err.splitlines()
                       if "Traceback" in ln or "internal error" in ln]
                if bad:
                    counts["tracebacks"] += len(bad)
                    print(f"TRACEBACK {mode} {folder}: {bad[:3]}", flush=True)
                failed = {path for path in mine for ln in err.splitlines()
                          if ln.startswith(f"{path}:") and not _REPORT.match(ln)}
                for path, before in mine.items():
                    after = path.read_bytes() if path.exists() else None
                    if after == before:
                        continue
                    if mode:
                        why = f"changed by {mode[0]}"
                    elif after is None:
                        why = "deleted"
                    elif path in failed:
                        why = "failed but written"
                    elif _compiles(before) and not _compiles(after):
                        why = "written, no longer compiles"
                    elif not _compiles(before):
                        why = "written although CPython rejects the input"
                    else:
                        continue
                    counts["damaged"] += 1
                    print(f"DAMAGED ({why}) {path}", flush=True)
                if not mode:
                    for path in mine:  # a second in-place run: a fixed point
                        mine[path] = path.read_bytes() if path.exists() else b""
    finally:
        shutil.rmtree(work, ignore_errors=True)
    took = time.monotonic() - start
    print(f"fuzz (seed {args.seed}): " + ", ".join(f"{k} {v}" for k, v in counts.items())
          + f"; {took:.0f} s")
    return 1 if any(counts[k] for k in ("tracebacks", "hangs", "damaged", "bad exit")) else 0


if __name__ == "__main__":
    sys.exit(main())
