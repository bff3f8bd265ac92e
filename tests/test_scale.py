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


def test_200_training_blocks_in_one_scope_are_each_converted(tmp_path):
    """Issue 39's first shape: an exported notebook of 200 whole training blocks in the module
    scope (200 models, optimizers, loaders, loops, saves). The model-wrapping step once compared
    every model with every other; each block must still get its own edits."""
    text = inputs.blocks_with_models(200)
    script = write(tmp_path / "train.py", text)
    out = convert(script, timeout=600)
    assert out.returncode == 0, out.stderr
    converted = script.read_text()
    for k in (0, 99, 199):
        assert f"\nmodel_{k} = sdp.DistributedDataParallel(model_{k})\n" in converted
        assert f"loader_{k} = DataLoader(loader_{k}_dataset, batch_size=" in converted
        assert f"    loader_{k}_sampler.set_epoch(epoch)\n" in converted
    assert converted.count(" = sdp.DistributedDataParallel(model_") == 200
    assert converted.count("DistributedSampler(\n") == 200
    assert converted.count("\nif sdp.rank() == 0:\n    torch.save(model_") == 200
    assert converted.count("lr=") == converted.count(" * sdp.size())") == 200
    compile(converted, str(script), "exec")


def test_a_20000_line_script_converts(tmp_path):
    """Issue 39's second shape at 20,000 lines: a training script carrying some 2,800 helper
    functions. Its training code is converted and every helper stays as it was."""
    text = inputs.flat_helpers(20_000)
    assert text.count("\n") >= 20_000
    script = write(tmp_path / "train.py", text)
    out = convert(script, timeout=900)
    assert out.returncode == 0, out.stderr
    converted = script.read_text()
    assert "    model = sdp.DistributedDataParallel(model)\n" in converted
    assert "    loader = DataLoader(data, batch_size=32, sampler=loader_sampler)\n" in converted
    assert "lr=args.lr * sdp.size())" in converted
    helpers = [part for part in text.split("\n\n\n") if part.startswith("def helper_")]
    assert len(helpers) > 2_800
    assert all(h in converted for h in helpers[:: len(helpers) // 50])
    assert converted.count("\ndef helper_") == len(helpers)
    compile(converted, str(script), "exec")
