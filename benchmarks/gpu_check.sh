#!/usr/bin/env bash
# The GPU check (benchmarks/results/gpu_smoke.md): the CUDA tests (marker `cuda`), on a machine
# with one NVIDIA GPU and its own CUDA build of torch, in a checkout of this repository.
#
# Installs this project editable, without dependencies, into the environment of $PYTHON (default
# python3: the one that holds the machine's CUDA torch, which stays), so that `sdp-convert` and
# `sdp-run` exist next to its interpreter; dependencies the machine lacks can be put as wheels in
# .whl/ beforehand (libcst, black, pytokens, pathspec, platformdirs and setuptools>=77 were, for Python 3.12). Then it runs:
#   tests/runtime/test_cuda.py  NCCL chosen by itself, collectives on GPU tensors, one DDP step,
#                               the DDP wrapper with torch.compile (inductor) in both orders
#   tests/e2e/test_gpu_runs.py  every PyTorch golden with an e2e.json converted by sdp-convert
#                               and trained on the GPU under `sdp-run -n 1` with the audit on,
#                               compared with the same script on the CPU
# Output: $OUT/gpu_check.log and $OUT/junit.xml ($OUT defaults to /tmp/gpu_check).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
{
  nvidia-smi -L
  "$PY" -c 'import sys, torch; print(sys.executable, sys.version.split()[0], torch.__version__, torch.cuda.is_available())'
  if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps .whl/*.whl
  fi
  "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e .
  "$PY" -c 'import os, sys; b = os.path.dirname(sys.executable); print([os.path.exists(os.path.join(b, n)) for n in ("sdp-convert", "sdp-run")])'
  PYTHONUNBUFFERED=1 timeout 480 "$PY" -m pytest -p no:cacheprovider \
    -o addopts="-ra --strict-markers" -o timeout=450 -m cuda --junitxml="$OUT/junit.xml" \
    tests/runtime/test_cuda.py tests/e2e/test_gpu_runs.py
} 2>&1 | tee "$OUT/gpu_check.log"
