"""Fresh public-program patterns (issue 30) converted and run on 2 processes."""

from __future__ import annotations

import http.server
import io
import re
import shutil
import subprocess
import sys
import tarfile
import threading
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from .harness import FIXTURES, SDP_RUN, run, writers

pytestmark = pytest.mark.slow
SDP_CONVERT = str(Path(sys.executable).with_name("sdp-convert"))


def test_an_unseeded_random_split_is_the_same_on_every_rank(tmp_path: Path):
    shutil.copy(FIXTURES / "torch" / "random_split_validation" / "input.py",
                tmp_path / "train.py")
    done = subprocess.run([SDP_CONVERT, "train.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "random_split(...) gets generator=" in done.stderr
    proc = run([SDP_RUN, "-n", "2", "train.py", "--epochs", "1"], tmp_path, timeout=120)
    splits = re.findall(r"split (-?\d+)", proc.output)
    assert len(splits) == 2 and splits[0] == splits[1], proc.output
    # Unconverted, two processes draw two different splits (what the generator prevents).
    shutil.copy(FIXTURES / "torch" / "random_split_validation" / "input.py",
                tmp_path / "original.py")
    drawn = {re.findall(r"split (-?\d+)", run([sys.executable, "original.py", "--epochs", "0"],
                                              tmp_path, timeout=60).output)[0]
             for _ in range(2)}
    assert len(drawn) == 2


def _serve(root: Path) -> tuple[http.server.ThreadingHTTPServer, Counter[str]]:
    """A local HTTP server for ``root`` (no network here), counting the GETs of each path."""
    gets: Counter[str] = Counter()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            super().__init__(*args, directory=str(root), **kwargs)

        def do_GET(self) -> None:  # noqa: N802 - the http.server name
            gets[self.path] += 1
            super().do_GET()

        def log_message(self, *args) -> None:  # type: ignore[no-untyped-def]
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, gets


def _housing_files(root: Path, rows: int = 64) -> None:
    """What fixtures/torch/fetch_unpack_tabular downloads: features, an archive of one more
    column, a tarball of labels, the feature scales."""
    root.mkdir(parents=True)
    (root / "features.csv").write_text(
        "\n".join(f"{i % 7},{(3 * i) % 11},{(5 * i) % 13}" for i in range(rows)) + "\n")
    (root / "scale.txt").write_text("7 11 13\n")
    with zipfile.ZipFile(root / "extra.zip", "w") as z:
        z.writestr("extra.txt", "\n".join(str((i % 5) / 5) for i in range(rows)) + "\n")
    labels = ("\n".join(str((i % 9) / 9) for i in range(rows)) + "\n").encode()
    with tarfile.open(root / "labels.tar.gz", "w:gz") as tar:
        info = tarfile.TarInfo("labels.txt")
        info.size = len(labels)
        tar.addfile(info, io.BytesIO(labels))


def test_downloads_and_extractions_run_once_on_rank_0_and_the_others_wait(tmp_path: Path):
    """requests.get + write, urlretrieve, zipfile and tarfile extraction: rank 0 alone downloads
    and unpacks, every other rank waits at the barrier, then reads whole files; the URL read into
    memory (np.loadtxt(URL)) stays on every rank. The audit (strict) fails the launch if two
    ranks wrote one file."""
    server, gets = _serve(tmp_path / "site")
    _housing_files(tmp_path / "site" / "datasets" / "housing")
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        work = tmp_path / "run"
        work.mkdir()
        source = (FIXTURES / "torch" / "fetch_unpack_tabular" / "input.py").read_text()
        (work / "train.py").write_text(source.replace("https://example.com", url))
        done = subprocess.run([SDP_CONVERT, "train.py"], cwd=work, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "sdp.barrier()" in (work / "train.py").read_text()
        proc = run([SDP_RUN, "-n", "2", "train.py", "--epochs", "1", "--batch-size", "8"], work,
                   audit_dir=tmp_path / "audit", timeout=120)
        assert proc.output.count("epoch 0 loss") == 2, proc.output
        prefix = "/datasets/housing/"
        assert gets[prefix + "features.csv"] == 1 and gets[prefix + "labels.tar.gz"] == 1
        assert gets[prefix + "extra.zip"] == 1
        assert gets[prefix + "scale.txt"] == 2  # read into memory by each rank (a note says so)
        who = writers(tmp_path / "audit")
        for path in ("data/features.csv", "data/extra.zip", "data/extra.txt",
                     "data/labels.tar.gz", "data/labels.txt", "model.pt"):
            assert who.get(path) == ["0"], (path, who)
    finally:
        server.shutdown()


def test_a_projects_helper_writes_run_once_or_are_noted_and_the_notes_are_true(tmp_path: Path):
    """fixtures/projects/torch_helper_writes on 2 processes: the config dump, the JSON-lines
    logger class, the curve a star-imported helper saves (guarded at its call: the contract's
    repair) and the checkpoint are written by rank 0 alone, mkdir_p cannot race; what the
    conversion left with a manual note (the cached features saved in the data module, the log
    file of setup_logging) is what the audit finds written by both ranks: the notes are true,
    and nothing else is."""
    work = tmp_path / "run"
    shutil.copytree(FIXTURES / "projects" / "torch_helper_writes" / "input", work)
    done = subprocess.run([SDP_CONVERT, "."], cwd=work, capture_output=True, text=True,
                          timeout=120)
    assert "utils.py:12:9: [allow_existing_dirs]" in done.stderr, done.stderr
    proc = run([SDP_RUN, "-n", "2", "train.py", "--epochs", "1"], work, {"SDP_AUDIT": "1"},
               audit_dir=tmp_path / "audit", timeout=120)
    who = writers(tmp_path / "audit")
    for path in ("runs/exp/config.yaml", "runs/exp/history.jsonl", "model.pt"):
        assert who.get(path) == ["0"], (path, who)
    noted = {"runs/exp/train.log"}
    # The data module's feature cache (noted too): each rank saves it unless it finds the file
    # another rank saved first, so which ranks write it (0, 1 or both) depends on timing.
    cache = "runs/exp/features.pt"
    assert who.get(cache), who
    assert {p: r for p, r in who.items() if p in noted} == dict.fromkeys(noted, ["0", "1"]), who
    assert all(r == ["0"] for p, r in who.items() if p not in noted | {cache}), who
    # The run-time audit sees the writes through Python's open (torch.save to a path writes
    # from C++: only the harness's torch.save wrapper saw features.pt).
    assert "all wrote runs/exp/train.log" in proc.output, proc.output
    assert who.get("runs/exp/loss.txt") == ["0"], who

@pytest.mark.tensorflow
def test_a_batch_iterator_class_reads_its_own_part_on_each_rank(tmp_path: Path):
    pytest.importorskip("tensorflow")
    shutil.copy(FIXTURES / "tensorflow" / "batch_iterator_shuffle" / "input.py",
                tmp_path / "train.py")
    done = subprocess.run([SDP_CONVERT, "train.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "sdp.shard(np.arange(len(self.x)))" in (tmp_path / "train.py").read_text()
    proc = run([SDP_RUN, "-n", "2", "train.py"], tmp_path, {"BATCH_SIZE": "16", "LR": "0.05"},
               timeout=180)
    # 256 samples: each of the 2 ranks reads its own 128 every epoch (not all 256).
    seen = re.findall(r"epoch \d: (\d+) samples", proc.output)
    assert seen == ["128"] * 4, proc.output


@pytest.mark.tensorflow
def test_a_preview_take_leaves_both_fits_on_the_sharded_data(tmp_path: Path):
    pytest.importorskip("tensorflow")
    shutil.copy(FIXTURES / "keras" / "preview_take_two_fits" / "input.py", tmp_path / "train.py")
    done = subprocess.run([SDP_CONVERT, "train.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    proc = run([SDP_RUN, "-n", "2", "train.py"], tmp_path, {"BATCH_SIZE": "16", "LR": "0.05"},
               timeout=180)
    # 256 samples, batch 16 per rank: 8 steps per rank in BOTH fits (16 = the second fit
    # training on all the data, as before the fix).
    steps = re.findall(r"steps per epoch: (\d+)", proc.output)
    assert steps and set(steps) == {"8"}, proc.output


@pytest.mark.tensorflow
def test_keras_weights_read_before_fit_are_rank_0s_on_every_rank(tmp_path: Path):
    pytest.importorskip("tensorflow")
    shutil.copy(FIXTURES / "keras" / "weights_read_before_fit" / "input.py", tmp_path / "train.py")
    done = subprocess.run([SDP_CONVERT, "train.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    converted = (tmp_path / "train.py").read_text()
    broadcast = "sdp.broadcast_variables(model.variables, root_rank=0)\n"
    assert broadcast in converted
    # The same script without the broadcast: the control that shows what it changes.
    (tmp_path / "control.py").write_text(converted.replace(broadcast, ""))
    env = {"BATCH_SIZE": "16", "LR": "0.05"}
    for script, same in (("train.py", True), ("control.py", False)):
        proc = run([SDP_RUN, "-n", "2", script], tmp_path, env, timeout=180)
        before = re.findall(r"loss before training: (\S+)", proc.output)
        moved = re.findall(r"distance moved from the initial weights: (\S+)", proc.output)
        assert len(before) == 2 and len(moved) == 2, proc.output
        # Unseeded: each rank builds its own random weights; read before fit, they are rank 0's
        # only with the broadcast (and the distance moved is then the same on both ranks).
        assert (before[0] == before[1] and moved[0] == moved[1]) is same, proc.output


BRANCH_LOADERS = """\
import argparse

import torch
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--data", default="a")
args = parser.parse_args()
torch.manual_seed(0)
data_a = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
data_b = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))


def main():
    if args.data == "a":
        loader = DataLoader(data_a, batch_size=8, shuffle=True)
    elif args.data == "b":
        loader = DataLoader(data_b, batch_size=8, shuffle=True)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(2):
        seen = 0
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            seen += len(x)
        print(f"epoch {epoch}: {seen} samples", flush=True)


main()
"""


def test_a_loader_chosen_in_branches_trains_every_epoch_on_2_processes(tmp_path: Path):
    """Issue 38: each branch's loader gets its own sampler, and the epoch loop sets the epoch of
    the one the loop reads (it was ``loader_sampler.set_epoch(epoch)`` and
    ``loader_sampler_2.set_epoch(epoch)``: UnboundLocalError at the first epoch on either path)."""
    (tmp_path / "train.py").write_text(BRANCH_LOADERS)
    done = subprocess.run([SDP_CONVERT, "train.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "loader.sampler.set_epoch(epoch)" in (tmp_path / "train.py").read_text()
    for data, per_rank in (("a", "32"), ("b", "16")):
        proc = run([SDP_RUN, "-n", "2", "train.py", "--data", data], tmp_path, timeout=120)
        seen = re.findall(r"epoch (\d): (\d+) samples", proc.output)
        assert sorted(seen) == [("0", per_rank)] * 2 + [("1", per_rank)] * 2, proc.output


def test_a_helper_that_runs_the_model_stays_on_every_rank_and_the_run_ends(tmp_path: Path):
    """Issue 38: a helper of another module that runs the DDP model's forward and then saves
    (``dump_predictions``) was moved under ``if sdp.rank() == 0:``: rank 0 waited alone in the
    forward (BatchNorm's buffers are broadcast), then "Connection closed by peer". It stays on
    every rank and the run ends; its write is guarded in the helper (the whole-program
    contract's repair), so rank 0 alone writes it, as the checkpoint helper does."""
    from tests.test_note_truth import TRAIN_DUMP, UTILS_DUMP

    work = tmp_path / "run"
    work.mkdir()
    (work / "utils.py").write_text(UTILS_DUMP)
    (work / "train.py").write_text(TRAIN_DUMP)
    done = subprocess.run([SDP_CONVERT, "."], cwd=work, capture_output=True, text=True,
                          timeout=300)
    assert "utils.py:10:5: [guard_rank0_writes] torch.save(...) runs on rank 0 only" in (
        done.stderr)
    run([SDP_RUN, "-n", "2", "train.py"], work, {"SDP_AUDIT": "1"}, audit_dir=tmp_path / "audit",
        timeout=120)
    who = writers(tmp_path / "audit")
    assert who.get("model.pt") == ["0"] and who.get("preds.pt") == ["0"], who
