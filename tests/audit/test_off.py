"""Audit off means no cost at all: nothing of the audit is patched in, and a training step runs
no line of ``sdp_runtime._audit`` (counted with ``sys.setprofile`` in a real process; the same
probe with the audit on counts its hooks, so the probe can see them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ..runtime._spawn import clean_env

PROBE = r'''
import json, os, sys
import sdp_runtime.torch as sdp
import torch
from torch.utils.data import DataLoader, TensorDataset
from sdp_runtime import _audit

sdp.init()
torch.manual_seed(0)
model = sdp.DistributedDataParallel(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
loader = DataLoader(TensorDataset(torch.randn(80, 8), torch.randn(80, 1)), batch_size=8)
audit_dir = os.path.dirname(os.path.abspath(_audit.__file__)) + os.sep
calls = [0]

def profile(frame, event, arg):
    if event == "call" and frame.f_code.co_filename.startswith(audit_dir):
        calls[0] += 1

per_step = []
for i, (x, y) in enumerate(loader):
    before = calls[0]
    if i == 5:  # after the audit's first K (5) steps: the steady state
        sys.setprofile(profile)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    if i >= 5:
        per_step.append(calls[0] - before)
sys.setprofile(None)
patched = [name for name, fn in [
    ("Optimizer.__init__", torch.optim.Optimizer.__init__),
    ("DistributedDataParallel.__init__", torch.nn.parallel.DistributedDataParallel.__init__),
    ("_BaseDataLoaderIter.__next__", torch.utils.data.dataloader._BaseDataLoaderIter.__next__),
    ("_BaseDataLoaderIter._next_index",
     torch.utils.data.dataloader._BaseDataLoaderIter._next_index),
    ("DataLoader.__init__", DataLoader.__init__), ("DataLoader.__iter__", DataLoader.__iter__),
    ("torch.save", torch.save)] if hasattr(fn, "__wrapped__")]
from torch.optim import optimizer as optim_module
hooks = len(optim_module._global_optimizer_pre_hooks) + len(
    optim_module._global_optimizer_post_hooks)
finders = [type(f).__name__ for f in sys.meta_path if "_audit" in type(f).__module__]
print(json.dumps({"active": _audit.active(), "per_step": per_step, "patched": patched,
                  "hooks": hooks, "finders": finders}))
'''


def probe(tmp_path: Path, extra: dict[str, str]) -> dict:
    env = clean_env(extra)
    if "SDP_AUDIT" not in extra:
        env.pop("SDP_AUDIT", None)
    (tmp_path / "probe.py").write_text(PROBE)
    proc = subprocess.run([sys.executable, "probe.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_audit_off_patches_nothing_and_runs_nothing_per_step(tmp_path: Path) -> None:
    off = probe(tmp_path, {})
    assert off == {"active": False, "per_step": [0] * 5, "patched": [], "hooks": 0,
                   "finders": []}


def test_the_probe_sees_the_audit_when_it_is_on(tmp_path: Path) -> None:
    on = probe(tmp_path, {"SDP_AUDIT": "1", "SDP_AUDIT_DIR": str(tmp_path / "records"),
                          "SDP_AUDIT_STEPS": "5"})
    assert on["active"] and on["hooks"] == 2
    assert set(on["patched"]) == {"Optimizer.__init__", "DistributedDataParallel.__init__",
                                  "_BaseDataLoaderIter.__next__", "_BaseDataLoaderIter._next_index",
                                  "DataLoader.__init__", "DataLoader.__iter__", "torch.save"}
    assert all(n > 0 for n in on["per_step"])  # its step hooks still run (and return at once)
