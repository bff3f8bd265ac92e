"""A module that a Hogwild program of the same run imports is left alone (real CLI)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from sdp_convert.siblings import hogwild_imports

from .test_cli import SDP_CONVERT

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
MAIN = (FIXTURES / "distributed" / "hogwild_main" / "input.py").read_text()
TRAIN = (FIXTURES / "torch" / "hogwild_train_module" / "input.py").read_text()


def test_the_hogwild_examples_train_module_is_left_unchanged_with_its_main(tmp_path: Path):
    (tmp_path / "main.py").write_text(MAIN)
    (tmp_path / "train.py").write_text(TRAIN)
    out = subprocess.run([SDP_CONVERT, str(tmp_path)], capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "main.py").read_text() == MAIN
    assert (tmp_path / "train.py").read_text() == TRAIN
    err = out.stderr.decode()
    assert f"{tmp_path / 'train.py'}:1:1: [note_already_distributed] left unchanged: already " \
        f"distributed with torch.multiprocessing workers of {tmp_path / 'main.py'}" in err
    assert "0 converted, 0 need attention, 2 unchanged" in err


def test_on_its_own_the_train_module_is_converted_without_a_module_level_init(tmp_path: Path):
    (tmp_path / "train.py").write_text(TRAIN)
    out = subprocess.run([SDP_CONVERT, str(tmp_path / "train.py")], capture_output=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "\nsdp.init()" not in (tmp_path / "train.py").read_text()


def test_only_imports_of_a_program_with_workers_and_shared_memory_count(tmp_path: Path):
    main, train, other = tmp_path / "main.py", tmp_path / "train.py", tmp_path / "other.py"
    main.write_text(MAIN)
    train.write_text(TRAIN)
    other.write_text("import train\n")
    assert hogwild_imports([main, train, other]) == {train: str(main)}
    main.write_text(MAIN.replace("model.share_memory()", "pass"))
    assert hogwild_imports([main, train, other]) == {}
