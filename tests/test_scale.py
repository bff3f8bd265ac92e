"""Files of any length and depth CPython compiles convert, in time linear in their length (issue
39), through the real ``sdp-convert`` command.

The inputs come from ``benchmarks/scale_inputs.py`` (the shapes the benchmark measures). The time
bounds here are guards against quadratic growth, generous enough for a busy 2-core machine: the
speed targets themselves are checked by ``benchmarks/bench_scale.py``, not by tests.
"""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

from .test_cli import SDP_CONVERT, write

ROOT = Path(__file__).resolve().parents[1]


def _scale_inputs():
    spec = importlib.util.spec_from_file_location(
        "scale_inputs", ROOT / "benchmarks" / "scale_inputs.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


inputs = _scale_inputs()


def convert(path: Path, timeout: float) -> subprocess.CompletedProcess:
    """``sdp-convert --no-cache`` of ``path`` (written in place), text output."""
    return subprocess.run(
        [SDP_CONVERT, "--no-cache", str(path)], capture_output=True, text=True, timeout=timeout
    )


def test_a_real_script_with_its_docstring_and_1000_functions_appended_converts(tmp_path):
    text = inputs.appended_functions(1000)
    assert text.startswith('"""') and text.count("\ndef helper_") == 1000
    script = write(tmp_path / "train.py", text)
    out = convert(script, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "nested too deeply" not in out.stderr and "Traceback" not in out.stderr
    converted = script.read_text()
    # The import goes after the docstring and the script's imports; the functions stay.
    assert converted.startswith(text.split('"""', 2)[0] + '"""' + text.split('"""', 2)[1])
    assert "\nimport sdp_runtime.torch as sdp\n" in converted
    assert converted.count("\ndef helper_") == 1000
    compile(converted, str(script), "exec")
