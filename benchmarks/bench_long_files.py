"""How converting one file grows with its length: flat scripts (an exported notebook) of 1,000 to
20,000 lines, converted in this process (no start-up), best of a few runs each, in CPU time.

    .venv/bin/python benchmarks/bench_long_files.py [--sizes 1000,5000,20000] [--repeat 2]

Prints, for each size, the time of CPython's own compile (``compiles.check``, done first on
every file) and of the whole conversion (``runner.convert_bytes``), and the ratio of each size's
conversion time to the first size's: linear growth gives a ratio equal to the size ratio (the
target: a 20,000-line file within about 20x a 1,000-line one). Writes
benchmarks/results/long_files.md.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "rewriter"))

from sdp_convert.compiles import check  # noqa: E402
from sdp_convert.options import Options  # noqa: E402
from sdp_convert.runner import convert_bytes  # noqa: E402

HEAD = ("import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n"
        "model = torch.nn.Linear(4, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))\n"
        "loader = DataLoader(data, batch_size=8, shuffle=True)\n")
LOOP = ("for x, y in loader:\n    loss = (model(x) - y).pow(2).mean()\n    opt.zero_grad()\n"
        "    loss.backward()\n    opt.step()\n")
#: A mix of what notebook exports hold: assignments, calls, prints, small functions.
BODY = (
    "v{i} = torch.zeros({k})\n",
    "print('step', {i}, v{j}.sum())\n",
    "def f{i}(a, b={k}):\n    return a * b + {i}\n",
    "w{i} = [x * {k} for x in range({k})]\n",
)


def script(lines: int) -> bytes:
    body: list[str] = []
    count, i = 0, 0
    while count < lines:
        text = BODY[i % len(BODY)].format(i=i, j=max(i - 4, 0) // 4 * 4, k=i % 7 + 1)
        body.append(text)
        count += text.count("\n")
        i += 1
    return (HEAD + "".join(body) + LOOP).encode()


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.process_time()  # CPU time: the machine is shared, wall time is noise
        fn()
        times.append(time.process_time() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000,5000,20000")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "long_files.md"))
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    options = Options()
    convert_bytes(script(50), "warm.py", options)  # imports and first-use costs
    scripts = {size: script(size) for size in sizes}
    for data in scripts.values():
        assert convert_bytes(data, "long.py", options).changed, "the script must be converted"
    # Sizes interleaved, best of the repeats: on a shared machine the load changes over minutes,
    # and measuring one size after the other would put that change into the ratios.
    compile_s = {size: float("inf") for size in sizes}
    convert_s = {size: float("inf") for size in sizes}
    for _ in range(args.repeat):
        for size, data in scripts.items():
            compile_s[size] = min(compile_s[size], best(lambda data=data: check(data), 1))
            convert_s[size] = min(convert_s[size], best(
                lambda data=data: convert_bytes(data, "long.py", options), 1))
            print(f"{size:>7} lines: compile {compile_s[size] * 1000:8.1f} ms, "
                  f"convert {convert_s[size]:7.2f} s", flush=True)
    rows = [(scripts[size].count(b"\n"), compile_s[size], convert_s[size]) for size in sizes]
    base_lines, _, base = rows[0]
    table = ["| lines | CPython compile | conversion | conversion / first | lines / first |",
             "| ---: | ---: | ---: | ---: | ---: |"]
    for lines, compile_s, convert_s in rows:
        table.append(f"| {lines:,} | {compile_s * 1000:.1f} ms | {convert_s:.2f} s | "
                     f"{convert_s / base:.1f}x | {lines / base_lines:.1f}x |")
    text = (f"# Converting long files ({time.strftime('%Y-%m-%d')})\n\n"
            f"`benchmarks/bench_long_files.py --sizes {args.sizes} --repeat {args.repeat}` on "
            f"{platform.machine()}, Python {platform.python_version()}, "
            "CPU time of this process, best of the repeats, in process (no start-up).\n\n"
            + "\n".join(table) + "\n")
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
