"""Per-call cost of a small ``sdp.allreduce_`` (20 KiB) between 2 processes.

    sdp-run -n 2 benchmarks/bench_small_calls.py

Prints, on rank 0, the ms per call of 5 repetitions of 400 calls and their median. Used to compare
the clean-run fast path before and after a runtime change (results/fail_fast_before_after.md).
"""

import time

import sdp_runtime.torch as sdp
import torch

sdp.init()
x = torch.ones(5120)
for _ in range(50):
    sdp.allreduce_(x)
times = []
for _ in range(5):
    sdp.barrier()
    start = time.perf_counter()
    for _ in range(400):
        sdp.allreduce_(x)
    times.append((time.perf_counter() - start) / 400 * 1e3)
if sdp.rank() == 0:
    shown = " ".join(f"{t:.3f}" for t in times)
    print(f"per call ms {shown} median {sorted(times)[2]:.3f}", flush=True)
