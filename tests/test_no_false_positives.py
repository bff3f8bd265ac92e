"""sdp-convert is safe to point at any code: no false positives, no crashes, stable output."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sdp_convert.engine import convert

SDP_CONVERT = str(Path(sys.executable).with_name("sdp-convert"))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_standard_library_is_left_alone(tmp_path):
    stdlib = sysconfig.get_paths()["stdlib"]
    report = tmp_path / "stdlib.json"
    out = subprocess.run(
        [SDP_CONVERT, "--check", "-q", stdlib, "--report", str(report), "--report-format", "json"],
        capture_output=True, timeout=600,
    )
    doc = json.loads(report.read_text())
    summary = doc["summary"]
    converted = [f["path"] for f in doc["files"] if f["status"] == "converted"]
    assert summary["converted"] == 0 and not converted, converted
    assert summary["unchanged"] > 1000
    assert b"Traceback" not in out.stderr and b"internal error" not in out.stderr
    failed = [f for f in doc["files"] if f["status"] == "failed"]
    # CPython ships deliberately broken files (lib2to3 test data, bad encodings): each gets one
    # clean line naming the file, and the position where there is one.
    assert failed, "expected the stdlib's deliberately broken test files to be reported"
    clean = re.compile(r"^\S+\.py(:\d+:\d+)?: (syntax error|cannot decode file): .+")
    for f in failed:
        assert clean.match(f["message"]), f["message"]
    assert out.returncode == 2


# ---------------------------------------------------------------------------------------------
# Property: training snippets mixed with unrelated code convert to stable, parseable output that
# keeps every unrelated line; without a training step nothing changes at all.

UNRELATED = [
    "import os\n",
    "import json as js\n",
    "from collections import OrderedDict\n",
    "CONFIG = {'lr': 0.1, 'steps': 3}  # settings\n",
    "def helper(x, *args, **kw):\n    '''Doc.'''\n    return [i * 2 for i in range(x)]\n",
    "class Thing:\n    size = 3\n\n    def step(self):\n        return self.size\n",
    "if os.environ.get('DEBUG'):\n    print('debug')\n",
    "for i in range(2):\n    pass\n",
    "try:\n    value = int('3')\nexcept ValueError:\n    value = 0\n",
    "with open(__file__) as fh:\n    text = fh.read()\n",
    "numbers = sorted({3, 1, 2})\n",
    "lam = lambda a, b=2: a + b\n",
]

MODEL = "import torch\nmodel = torch.nn.Linear(3, 1)\n"
OPTIMIZER = "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
STEP = (
    "for batch in range(3):\n"
    "    loss = model(torch.randn(4, 3)).mean()\n"
    "    opt.zero_grad()\n"
    "    loss.backward()\n"
    "    opt.step()\n"
)
SAVE = "torch.save(model.state_dict(), 'model.pt')\n"


@st.composite
def programs(draw):
    before = draw(st.lists(st.sampled_from(UNRELATED), max_size=4))
    middle = draw(st.lists(st.sampled_from(UNRELATED), max_size=3))
    after = draw(st.lists(st.sampled_from(UNRELATED), max_size=3))
    trains = draw(st.booleans())
    saves = draw(st.booleans())
    parts = [*before, MODEL, OPTIMIZER, *middle]
    if trains:
        parts.append(STEP)
    if saves:
        parts.append(SAVE)
    parts.extend(after)
    return "".join(parts), trains, before + middle + after


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_mixed_programs_convert_stably(program):
    source, trains, unrelated = program
    result = convert(source)
    output = result.output.decode()
    ast.parse(output)
    assert convert(result.output).output == result.output  # one pass is a fixed point
    if not trains:
        assert output == source
        return
    assert "sdp.init()" in output
    for snippet in unrelated:
        for line in snippet.splitlines():
            assert line.strip() in output
