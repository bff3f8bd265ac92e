"""The distribution as pip and PyPI see it: extras with ranges (the CPU pins live in the CI
set-up), PEP 639 license metadata, one version, and the README's set-up commands being what CI
runs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
import sdp_convert
import sdp_runtime
import tomllib
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]


def _bash_blocks() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def test_ci_runs_exactly_the_readmes_set_up_command():
    blocks = _bash_blocks()
    setup = [b for b in blocks if b.startswith("python3 -m venv .venv")]
    assert len(setup) >= 2, "the README's two set-up commands"
    first, second = setup[:2]
    assert blocks.index(first) < blocks.index(second) and second.endswith("-m pytest")
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci == second
    for command in (first, second):
        assert "-c .ci/constraints.txt" in command and "-e '.[" in command


def test_extras_are_ranges_and_the_cpu_pins_are_in_the_ci_constraints():
    requires = [Requirement(r) for r in metadata.requires("sdp-convert") or []]
    assert not [r for r in requires if any(s.operator == "==" for s in r.specifier)]

    def extra(name: str) -> dict[str, str]:
        return {r.name: str(r.specifier) for r in requires
                if r.marker is not None and r.marker.evaluate({"extra": name})}

    assert extra("torch")["torch"] == ">=2.13"
    assert extra("tensorflow")["tensorflow"] == ">=2.21" and "tensorflow-cpu" not in extra(
        "tensorflow")
    assert extra("tensorflow-cpu")["tensorflow-cpu"] == ">=2.21"
    pins = (REPO / ".ci" / "constraints.txt").read_text().split()
    # Portable pins: a local version label (+cpu) exists on PyTorch's own index only, and the
    # public index has no such file; the CPU build is chosen by the local index (see below).
    assert "torch==2.13.0" in pins and "tensorflow-cpu==2.21.0" in pins
    assert not [p for p in pins if "==" in p and "+" in p]


def test_license_classifiers_and_one_version():
    meta = metadata.metadata("sdp-convert")
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    assert (REPO / "LICENSE").read_text().split()[:4] == ["Apache", "License", "Version", "2.0,"]
    classifiers = meta.get_all("Classifier")
    for minor in (10, 11, 12, 13):
        assert f"Programming Language :: Python :: 3.{minor}" in classifiers
    assert not [c for c in classifiers if c.startswith("License ::")]  # PEP 639: expression only
    assert meta["Version"] == sdp_convert.__version__ == sdp_runtime.__version__
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]  # sdp_convert's


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_wheel_builds_with_pep_639_metadata(tmp_path):
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                          "--wheel-dir", str(tmp_path), str(REPO)],
                         capture_output=True, text=True, timeout=540)
    assert out.returncode == 0, out.stderr[-3000:]
    (wheel,) = tmp_path.glob("sdp_convert-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        text = archive.read(info).decode()
        entry_points = archive.read(info.replace("METADATA", "entry_points.txt")).decode()
    assert f"Version: {sdp_convert.__version__}\n" in text
    assert "License-Expression: Apache-2.0\n" in text
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "sdp-rank-files = sdp_runtime._launch_logs:RankFiles" in entry_points
    assert "sdp_runtime/_audit/boot/sitecustomize.py" in names  # sdp-run --audit's start-up


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_development_set_up_resolves_to_cpu_builds_only(tmp_path):
    """What the README's commands install, resolved from scratch (nothing downloaded): the CPU
    builds on the local index, never a CUDA torch and its nvidia-* packages."""
    report = tmp_path / "report.json"
    out = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed",
         "--report", str(report), "-e", f"{REPO}[torch,tensorflow-cpu,dev]",
         "-c", str(REPO / ".ci" / "constraints.txt")],
        capture_output=True, text=True, timeout=540,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    chosen = {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"]
              for i in json.loads(report.read_text())["install"]}
    assert chosen["torch"] == "2.13.0+cpu" and chosen["tensorflow-cpu"] == "2.21.0"
    assert "tensorflow" not in chosen
    assert not [name for name in chosen if name.startswith(("nvidia-", "triton"))]
