"""The whole-program contract (issues 28, 37, 38): what a converted program must show, checked
after every conversion on the program model (three answers per part: holds, missing, unknown),
the repairs it asks for where a part is missing, and the checks of inserted code made before
anything is written."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sdp_convert import contract, inserted
from sdp_convert.engine import convert
from sdp_convert.options import Options
from sdp_convert.runner import Config, Job, run_jobs

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
SDP_CONVERT = str(Path(sys.executable).with_name("sdp-convert"))


def check(tmp_path: Path, files: dict[str, str], *paths: str) -> list:
    """Convert ``files`` (written under ``tmp_path``) as ``sdp-convert --check PATHS`` does,
    in this process: the outcomes, contract notes and entry results included."""
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    jobs = [Job(tmp_path / p, p, None) for p in (paths or files)]
    return run_jobs(jobs, Config(Options(), mode="check"), workers=1)


def notes(outcomes: list, part: str | None = None) -> list[str]:
    return [f"{o.path}:{c.line}: {c.message}" for o in outcomes for c in o.changes
            if c.transform == "contract" and (part is None or c.message.endswith(f"[{part}]"))]


# -- the parts, one by one -------------------------------------------------------------------

TORCH_SCRIPT = """\
    import torch

    def main():
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 4)),
                                             batch_size=8)
        for (x,) in loader:
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
        torch.save(model.state_dict(), "m.pt")

    if __name__ == "__main__":
        main()
    """


def test_a_converted_script_holds_every_part(tmp_path: Path):
    [outcome] = check(tmp_path, {"train.py": TORCH_SCRIPT})
    assert outcome.status == "converted" and not outcome.needs_attention
    assert not notes([outcome])
    parts = outcome.contract["parts"]
    assert {k: v["state"] for k, v in parts.items()} == dict.fromkeys(contract.PARTS, "holds")
    assert outcome.contract["holds"] is True


def test_a_script_the_transforms_were_kept_from_misses_parts_and_says_where(tmp_path: Path):
    # --only add_runtime_init: init holds, nothing else does; each part names its spot.
    (tmp_path / "train.py").write_text(textwrap.dedent(TORCH_SCRIPT))
    jobs = [Job(tmp_path / "train.py", "train.py", None)]
    config = Config(Options(only=frozenset({"add_runtime_init"})), mode="check")
    [outcome] = run_jobs(jobs, config, workers=1)
    assert outcome.needs_attention
    states = {k: v["state"] for k, v in outcome.contract["parts"].items()}
    assert states == {"init": "holds", "averaging": "missing", "data": "missing",
                      "state": "missing", "writes": "missing"}
    found = notes([outcome])
    # Each at the spot to edit: where the model is made, the loader built, the file written.
    assert any(n.startswith("train.py:4: the model made here (model) is trained in train.py:11 "
                            "by torch.optim.SGD") and n.endswith("[averaging]") for n in found)
    assert any(n.startswith("train.py:6: the DataLoader built here feeds the training loop at "
                            "train.py:8") for n in found)
    assert any(n.startswith("train.py:12: torch.save(...) writes on every rank") for n in found)


def test_what_removing_data_parallel_leaves_is_noted_without_unaveraging(tmp_path: Path):
    # The checkpoint-format and GPU-count notes are true, and say nothing of the averaging:
    # the model is wrapped, so that part holds.
    script = TORCH_SCRIPT.replace(
        "        model = torch.nn.Linear(4, 1)\n",
        "        batch = 8 * torch.cuda.device_count()\n"
        "        model = torch.nn.Linear(4, 1)\n"
        "        model = torch.nn.DataParallel(model)\n")
    [outcome] = check(tmp_path, {"train.py": script})
    manual = [c.message for c in outcome.changes if c.manual and c.transform == "wrap_model_ddp"]
    assert len(manual) == 2 and manual[0].startswith("8 * torch.cuda.device_count(): grown")
    assert "keys start with `module.`" in manual[1]
    assert outcome.contract["parts"]["averaging"]["state"] == "holds"


def test_a_file_opened_to_update_in_place_is_a_write(tmp_path: Path):
    # "r+" rewrites the file: every rank doing it is a write on every rank, as "w" is.
    script = TORCH_SCRIPT.replace(
        '        torch.save(model.state_dict(), "m.pt")\n',
        '        with open("runs.txt", "r+") as log:\n            log.write("done")\n')
    (tmp_path / "train.py").write_text(textwrap.dedent(script))
    jobs = [Job(tmp_path / "train.py", "train.py", None)]
    config = Config(Options(only=frozenset({"add_runtime_init"})), mode="check")
    [outcome] = run_jobs(jobs, config, workers=1)
    assert outcome.contract["parts"]["writes"]["state"] == "missing"
    assert any(n.startswith("train.py:12: open(...) writes on every rank")
               for n in notes([outcome], "writes"))


def test_an_extraction_is_a_download_and_a_network_read_into_memory_is_not(tmp_path: Path):
    """Kept from order_downloads, an archive unpacked on every rank is missing (any
    ``.extractall``); ``requests.get(url).json()`` on every rank is right as it is."""
    script = TORCH_SCRIPT.replace(
        "    def main():\n",
        "    import requests\n    import zipfile\n\n    def main():\n"
        "        zipfile.ZipFile(\"data.zip\").extractall(\"data\")\n"
        "        meta = requests.get(\"https://example.com/meta.json\").json()\n"
        "        print(meta)\n")
    (tmp_path / "train.py").write_text(textwrap.dedent(script))
    config = Config(Options(skip=frozenset({"order_downloads"})), mode="check")
    [outcome] = run_jobs([Job(tmp_path / "train.py", "train.py", None)], config, workers=1)
    assert [n.split(": ", 1)[1] for n in notes([outcome])] == [
        'zipfile.ZipFile("data.zip").extractall(...) writes the same files on every rank at '
        "once: run it on rank 0 only (`if sdp.rank() == 0:`), then `sdp.barrier()` [writes]"]
    [outcome] = check(tmp_path, {"train.py": script})  # converted: rank 0, then a barrier
    assert not notes([outcome]) and not outcome.needs_attention


def test_a_manual_note_of_the_conversion_means_the_part_does_not_hold(tmp_path: Path):
    source = """\
        import torch

        def main():
            model = torch.nn.Linear(4, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for step in range(3):
                opt.zero_grad()
                model(torch.randn(8, 4)).pow(2).mean().backward()
                opt.step()

        if __name__ == "__main__":
            main()
        """
    [outcome] = check(tmp_path, {"train.py": source})
    parts = outcome.contract["parts"]
    # Not shown either way (random batches in the loop): unknown, never "holds".
    assert parts["data"]["state"] == "unknown" and parts["data"]["noted"] is True
    assert "no loop over training data was found" in parts["data"]["detail"]
    assert not notes([outcome], "data")  # said once, by the transform's note
    assert any("no DataLoader feeding this training loop" in c.message for c in outcome.changes)
    assert outcome.needs_attention


def test_a_program_distributed_by_other_means_is_not_checked(tmp_path: Path):
    [outcome] = check(tmp_path, {"ddp.py": FIXTURES.joinpath(
        "distributed/torch_ddp/input.py").read_text()})
    assert outcome.contract is None and not notes([outcome])


def test_a_file_that_does_not_train_gets_no_contract(tmp_path: Path):
    [outcome] = check(tmp_path, {"util.py": "import torch\n\ndef f(x):\n    return x + 1\n"})
    assert outcome.contract is None and not outcome.changes


# -- the shapes of the issue -----------------------------------------------------------------

PROJECTS = FIXTURES / "projects"


def _project(case: str, tmp_path: Path) -> list:
    tree = tmp_path / case
    shutil.copytree(PROJECTS / case / "input", tree)
    files = sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*.py"))
    return run_jobs([Job(tree / f, f, None) for f in files], Config(Options(), mode="check"), 1)


def test_keras_compile_in_another_module_is_repaired_where_each_part_is(tmp_path: Path):
    # compile in models.py, fit in main.py, the dataset in data.py: each edit in its file.
    outcomes = _project("keras_compile_elsewhere", tmp_path)
    by = {o.path: o for o in outcomes}
    assert not notes(outcomes)
    assert by["main.py"].contract["holds"] is True and not by["main.py"].needs_attention
    assert "sdp.keras.DistributedOptimizer(" in by["models.py"].output.decode()
    assert "args.lr * sdp.size()" in by["models.py"].output.decode()
    assert ".apply(sdp.shard)" in by["data.py"].output.decode()
    main = by["main.py"].output.decode()
    assert "BroadcastGlobalVariablesCallback(0)" in main and "sdp.init()" in main
    assert "if sdp.rank() == 0:\n        model.save_weights" in main


@pytest.mark.parametrize("case, made", [("torch_learner_kwargs", "model = nn.Sequential("),
                                        ("torch_config_trainer",
                                         'model = cfg.build("arch", models)')])
def test_a_model_trained_through_an_object_of_another_module_is_wrapped_where_it_is_made(
    case: str, made: str, tmp_path: Path
):
    # The optimizer steps self.model in learner.py / a BaseTrainer subclass: the model is
    # wrapped in main.py, where it is made (not in the config's generic factory).
    outcomes = _project(case, tmp_path)
    assert not notes(outcomes)
    entry = next(o for o in outcomes if o.contract is not None)
    assert entry.path == "main.py" and not entry.needs_attention
    assert all(p["state"] == "holds" for p in entry.contract["parts"].values())
    main = entry.output.decode()
    after = main[main.index(made):]
    assert after.splitlines()[1].strip() == "model = sdp.DistributedDataParallel(model)"
    assert "sampler=loader_sampler" in main and "* sdp.size()" in main


def test_a_module_level_entry_gets_init_and_the_rest_is_repaired(tmp_path: Path):
    outcomes = _project("torch_module_level_entry", tmp_path)
    by = {o.path: o for o in outcomes}
    train = by["train.py"].output.decode()
    assert "sdp.init()" in train and "model = sdp.DistributedDataParallel(model)" in train
    assert "if sdp.rank() == 0:\n    torch.save(" in train
    assert all(p["state"] == "holds" for p in by["train.py"].contract["parts"].values())
    assert not any("no sdp.init() added" in c.message for c in by["engine.py"].changes)
    assert not any(c.manual for c in by["engine.py"].changes)


def test_a_sample_batch_pulled_after_the_step_is_not_the_data_trained_on(tmp_path: Path):
    # A while loop pulls its training batch, steps, then pulls a test batch for a look: the
    # data part checks the pipeline that reaches the step (split), not the test one.
    [outcome] = check(tmp_path, {"train.py": """\
        import tensorflow as tf

        model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
        opt = tf.keras.optimizers.SGD(0.01)
        train = tf.data.Dataset.from_tensor_slices((tf.zeros([64, 4]), tf.zeros([64, 1])))
        test = tf.data.Dataset.from_tensor_slices((tf.zeros([16, 4]), tf.zeros([16, 1])))
        train_it = iter(train.batch(8).repeat())
        test_it = iter(test.batch(8).repeat())
        step = 0
        while step < 100:
            x, y = next(train_it)
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x) - y) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            step += 1
            if step % 10 == 0:
                test_x, test_y = next(test_it)
                print(float(tf.reduce_mean(model(test_x) - test_y)))
        """})
    assert not notes([outcome])
    assert outcome.contract["parts"]["data"]["state"] == "holds"


def test_a_counted_loop_that_draws_with_next_reads_the_data_it_draws(tmp_path: Path):
    # `for step in range(n): x = next(it)`: the loop's draw is the data trained on (split
    # here), and a draw for samples only in the same kind of loop is not taken for it.
    [outcome] = check(tmp_path, {"train.py": """\
        import tensorflow as tf

        model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
        opt = tf.keras.optimizers.SGD(0.01)
        train = tf.data.Dataset.from_tensor_slices((tf.zeros([64, 4]), tf.zeros([64, 1])))
        train_it = iter(train.shuffle(64).batch(8).repeat())
        for step in range(100):
            x, y = next(train_it)
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x) - y) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
        """})
    assert not notes([outcome])
    assert outcome.contract["parts"]["data"]["state"] == "holds"
    [noise] = check(tmp_path / "noise", {"train.py": """\
        import tensorflow as tf

        model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
        opt = tf.keras.optimizers.SGD(0.01)
        samples = iter(tf.data.Dataset.from_tensor_slices(tf.zeros([16, 4])).batch(4).repeat())
        for step in range(100):
            z = tf.random.normal([8, 4])
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(model(z) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            if step % 10 == 0:
                print(float(tf.reduce_mean(model(next(samples)))))
        """})
    data = noise.contract["parts"]["data"]
    assert data["state"] == "unknown" and "no loop over training data" in data["detail"]


def test_a_write_every_call_of_this_program_switches_off_is_not_its_write(tmp_path: Path):
    # save_preview writes only when given a path; the training passes '' (another script,
    # which never starts the runtime, passes one): not a write of this program. Given a path by
    # the training too, it is one, and the writes part says so.
    utils = """\
        def save_preview(values, output_path, show=False):
            if output_path != "":
                with open(output_path, "w") as f:
                    f.write(str(values))
            return values
        """
    preview = """\
        from utils import save_preview

        if __name__ == "__main__":
            save_preview([1, 2], "preview.txt")
        """
    train = TORCH_SCRIPT.replace('torch.save(model.state_dict(), "m.pt")',
                                 'save_preview(model.weight.tolist(), "")').replace(
        "import torch\n", "import torch\n    from utils import save_preview\n", 1)
    files = {"train.py": train, "utils.py": utils, "preview.py": preview}
    outcomes = check(tmp_path, files, "train.py", "utils.py", "preview.py")
    [entry] = [o for o in outcomes if o.path.endswith("train.py")]
    assert entry.contract["parts"]["writes"]["state"] == "holds"
    assert not notes(outcomes, "writes")
    files["train.py"] = train.replace('weight.tolist(), "")', 'weight.tolist(), "w.txt")')
    outcomes = check(tmp_path / "given", files, "train.py", "utils.py", "preview.py")
    [entry] = [o for o in outcomes if o.path.endswith("train.py")]
    assert entry.contract["parts"]["writes"]["state"] == "missing"


def test_an_entry_that_starts_tensorflow_before_importing_the_init_gets_its_own(tmp_path: Path):
    # train.py initialises and pins at import; run.py (a notebook's cells, say) uses TensorFlow
    # first: the pin at import would raise RuntimeError on a GPU, so run.py is pinned first (the
    # module's own pin then changes nothing, which TensorFlow allows).
    train = """\
        import tensorflow as tf

        gpus = tf.config.experimental.list_physical_devices("GPU")
        if len(gpus) > 0:
            tf.config.experimental.set_memory_growth(gpus[0], True)


        def main():
            model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
            opt = tf.keras.optimizers.SGD(0.01)
            data = tf.data.Dataset.from_tensor_slices((tf.zeros([64, 4]), tf.zeros([64, 1])))
            for x, y in data.batch(8):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean((model(x) - y) ** 2)
                grads = tape.gradient(loss, model.trainable_variables)
                opt.apply_gradients(zip(grads, model.trainable_variables))


        if __name__ == "__main__":
            main()
        """
    run = """\
        import tensorflow as tf

        print(tf.reduce_sum(tf.ones([2])))
        from train import *  # noqa: E402,F403

        main()  # noqa: F405
        """
    outcomes = check(tmp_path, {"train.py": train, "run.py": run})
    [entry] = [o for o in outcomes if o.path.endswith("run.py")]
    assert {c.transform for c in entry.changes} >= {"add_runtime_init", "pin_tf_gpus"}
    assert entry.contract["parts"]["init"]["state"] == "holds"
    # Imported first, before any TensorFlow of its own: nothing to add.
    outcomes = check(tmp_path / "first", {"train.py": train, "run.py": run.replace(
        "print(tf.reduce_sum(tf.ones([2])))\n        from train import *  # noqa: E402,F403",
        "from train import *  # noqa: E402,F403\n        print(tf.reduce_sum(tf.ones([2])))")})
    [entry] = [o for o in outcomes if o.path.endswith("run.py")]
    assert not entry.changes and entry.contract["parts"]["init"]["state"] == "holds"


def test_the_json_report_carries_each_entry_points_parts(tmp_path: Path):
    tree = tmp_path / "p"
    shutil.copytree(PROJECTS / "torch_learner_kwargs" / "input", tree)
    done = subprocess.run([SDP_CONVERT, "--check", "--report", "-", "--report-format", "json",
                           "."], cwd=tree, capture_output=True, text=True, timeout=120)
    doc = json.loads(done.stdout)
    [entry] = [f for f in doc["files"] if "contract" in f]
    assert entry["path"] == "main.py" and entry["attention"] is False
    assert entry["contract"]["parts"]["averaging"] == {
        "state": "holds", "detail": "gradients averaged", "noted": False}
    assert entry["contract"]["parts"]["init"]["state"] == "holds"
    assert entry["contract"]["modules"] == ["main.py", "learner.py"]
    assert "sdp-convert: 2 would be converted, 0 need attention" in done.stderr


# -- every golden ---------------------------------------------------------------------------

#: What the contract finds in the goldens beyond what their conversion says: all true.
#: torch_elastic trains every rank on the same tensors (``torch.manual_seed(0)`` then
#: ``randn``), as its Horovod original does; mnist_eight_gpus downloads MNIST on every rank;
#: the Horovod hybrid SMP script downloads MNIST to one path on every rank; the two TensorFlow
#: SMP scripts (SageMaker's own example) give every rank the same batches
#: (each reads all of MNIST and shuffles it with the same seed): what model parallelism wants
#: within one replica, but under data parallelism every rank trains on the same data.
#: param_lists_resume's optimizer comes out of a checkpoint in its resume branch (which model it
#: steps cannot be read); optimizer_model_unknown's model is wrapped nowhere, so nothing gives
#: the ranks rank 0's initial weights (its state is unknown, not "holds").
GOLDEN_FINDINGS = {
    "horovod/torch_elastic": ["input.py:36: no loop over training data was found around"],
    "smddp/mnist_eight_gpus": ["input.py:38: datasets.MNIST(...) downloads on every rank"],
    "smp/tf2_horovod_hybrid": ["input.py:10: tf.keras.datasets.mnist.load_data(...) downloads"],
    # (SMP's TensorFlow scripts train data-parallel here; this one reads all of its data on
    # every rank: its loop's step is a module-level tf.function, no Keras train_step.)
    "smp/tf2_subclass": ["input.py:15: the data trained on at input.py:58 comes from here and "
                         "is not split between ranks",
                         "input.py:58: nothing broadcasts rank 0's initial weights"],
    "smp/torch_manual_partition_amp": ["input.py:62: no loop over training data was found"],
    "torch/optimizer_model_unknown": ["input.py:30: no sdp.DistributedDataParallel wrap or"],
    "torch/param_lists_resume": ["input.py:62: could not tell which model this optimizer"],
    "torch/two_loops_full_batch": ["input.py:55: no loop over training data was found"],
}
CASES = sorted(p for p in FIXTURES.glob("*/*") if p.is_dir() and p.parent.name != "projects")


def test_the_contract_over_every_golden_and_project(tmp_path: Path):
    jobs = []
    for case in CASES:
        work = tmp_path / f"{case.parent.name}-{case.name}"
        work.mkdir()
        shutil.copy(case / "input.py", work / "input.py")
        jobs.append((f"{case.parent.name}/{case.name}", [Job(work / "input.py", "input.py",
                                                              None)]))
    for case in sorted(p for p in PROJECTS.iterdir() if p.is_dir()):
        work = tmp_path / f"projects-{case.name}"
        shutil.copytree(case / "input", work)
        files = sorted(p.relative_to(work).as_posix() for p in work.rglob("*.py"))
        jobs.append((f"projects/{case.name}", [Job(work / f, f, None) for f in files]))
    found: dict[str, list[str]] = {}
    entries = 0
    for name, case_jobs in jobs:
        outcomes = run_jobs(case_jobs, Config(Options(), mode="check"), workers=1)
        entries += sum(o.contract is not None for o in outcomes)
        if notes(outcomes):
            found[name] = notes(outcomes)
    # Each repaired where it was found wanting, but for a cache rank 0 must build first.
    expected_projects = {"projects/torch_helper_writes", "projects/keras_cached_annotations"}
    assert set(found) == set(GOLDEN_FINDINGS) | expected_projects, sorted(found)
    for name, starts in GOLDEN_FINDINGS.items():
        assert len(found[name]) == len(starts)
        for note, start in zip(sorted(found[name]), starts, strict=True):
            assert note.startswith(start), note
    assert entries >= 80  # the check ran over the entry points (86 today), it did not skip them


# -- inserted code ---------------------------------------------------------------------------


def test_an_inserted_name_used_before_anything_binds_it_is_found():
    before = b"from tensorflow import keras\nmodel = keras.Sequential()\n"
    after = (b"from tensorflow import keras\nimport sdp_runtime.tensorflow as sdp\nsdp.init()\n"
             b"gpus = tf.config.list_physical_devices('GPU')\nimport tensorflow as tf\n"
             b"model = keras.Sequential()\n")
    [(line, why)] = inserted.problems(before, after)
    assert line == 4 and "`tf`" in why and "NameError" in why
    # The user's own late binding is theirs: only what the conversion adds is held against it.
    assert inserted.problems(b"print(x)\nx = 1\n", b"print(x)\nx = 1\n") == []


def test_an_inserted_collective_under_a_per_rank_condition_is_found():
    before = textwrap.dedent("""\
        import os
        import sdp_runtime.torch as sdp
        if not os.path.exists(p):
            download(p)
        else:
            text = open(p).read()
        """).encode()
    after = before.replace(b"    text = open", b"    sdp.barrier()\n    text = open")
    [(line, why)] = inserted.problems(before, after)
    assert line == 6 and "`not os.path.exists(p)`" in why and "deadlock" in why
    rank = after.replace(b"not os.path.exists(p)", b"sdp.rank() == 0")
    assert "`sdp.rank() == 0`" in inserted.problems(before, rank)[0][1]
    # os.path.join is no collective, and a barrier every rank reaches is fine.
    fine = before.replace(b"as sdp\n", b"as sdp\nsdp.barrier()\nq = os.path.join('a')\n")
    assert inserted.problems(before, fine) == []


EXISTS_ELSE = """\
import os

import torch
import torch.nn as nn

SOURCE = os.environ.get("CORPUS_SOURCE", "corpus_source.txt")


def load_text(path):
    if not os.path.exists(path):
        text = open(SOURCE).read()
        with open(path, "w") as f:
            f.write(text)
    else:
        text = open(path).read()
    return text


def main():
    text = load_text("corpus.txt")
    data = torch.tensor([ord(c) % 32 for c in text[:512]], dtype=torch.float32).view(-1, 8)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data), batch_size=8)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(2):
        for (x,) in loader:
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()


if __name__ == "__main__":
    main()
"""


def test_no_barrier_is_put_where_only_some_ranks_go():
    result = convert(EXISTS_ELSE)
    out = result.output.decode()
    assert result.changed and "barrier" not in out
    [note] = [c for c in result.changes if c.transform == "barrier_before_reads"]
    assert note.manual and "`not os.path.exists(path)`, which can differ between ranks" in (
        note.message)
    assert not inserted.problems(EXISTS_ELSE.encode(), result.output)


NOTEBOOK_CELLS = [
    "from tensorflow import keras",
    "import numpy as np\nx = np.random.RandomState(0).rand(64, 4).astype('float32')\n"
    "y = x.sum(axis=1, keepdims=True)",
    "model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1)])\n"
    "model.compile(optimizer=keras.optimizers.SGD(0.01), loss='mse')",
    "model.fit(x, y, batch_size=16, epochs=1)",
]


def test_a_notebook_importing_only_keras_gets_what_its_first_cell_needs(tmp_path: Path):
    cells = [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
              "source": c} for c in NOTEBOOK_CELLS]
    path = tmp_path / "train.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4,
                                "nbformat_minor": 5}))
    [outcome] = run_jobs([Job(path, "train.ipynb", None)], Config(Options(), mode="check"), 1)
    assert outcome.status == "converted" and not outcome.needs_attention, outcome.changes
    assert outcome.contract["holds"] is True
    cells = [c["source"] for c in json.loads(outcome.output)["cells"]]
    code = "\n".join("".join(c) if isinstance(c, list) else c for c in cells)
    assert "tf.config" in code and "import tensorflow as tf" in code
    assert code.index("import tensorflow as tf") < code.index("tf.config")
    # The cells, run in order as a kernel runs them: no NameError, and it trains.
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=180, cwd=tmp_path,
                          env={"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin"})
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_runtime_call_that_runs_before_init_is_named(tmp_path: Path):
    # helpers.py asks the rank at import: main.py imports it before its own init().
    files = {
        "helpers.py": """\
            import sdp_runtime.torch as sdp

            VERBOSE = sdp.rank() == 0

            def log(*args):
                if VERBOSE:
                    print(*args)
            """,
        "main.py": TORCH_SCRIPT.replace("    import torch\n", "    import torch\n\n    import "
                                        "helpers\n"),
    }
    outcomes = check(tmp_path, files)
    found = notes(outcomes, "init")
    assert len(found) == 1 and found[0].startswith(
        "helpers.py:3: sdp.rank() runs when main.py imports it, before sdp.init() "
        "(NotInitializedError)"), found
    entry = next(o for o in outcomes if o.contract is not None)
    assert entry.contract["parts"]["init"]["state"] == "missing"


# unet-keras: a module-level main.py that imports nothing of Keras by name (``from model import
# *``) and calls fit_generator on the model a factory of model.py compiles.
STAR_FACTORY = {
    "model.py": """\
        from keras.models import *
        from keras.layers import *
        from keras.optimizers import *
        from keras.callbacks import ModelCheckpoint


        def unet(input_size=(8,)):
            inputs = Input(input_size)
            model = Model(inputs, Dense(1)(inputs))
            model.compile(optimizer=Adam(learning_rate=1e-4), loss="mse")
            return model
        """,
    "data.py": """\
        import numpy as np


        def trainGenerator(batch_size):
            while True:
                yield np.zeros((batch_size, 8)), np.zeros((batch_size, 1))
        """,
    "main.py": """\
        from model import *
        from data import *

        myGene = trainGenerator(2)
        model = unet()
        model_checkpoint = ModelCheckpoint("unet.hdf5", monitor="loss", save_best_only=True)
        model.fit_generator(myGene, steps_per_epoch=300, epochs=1, callbacks=[model_checkpoint])
        """,
}


def test_fit_generator_on_a_star_imported_factory_model_is_training(tmp_path: Path):
    outcomes = check(tmp_path, STAR_FACTORY)
    by = {o.path: o for o in outcomes}
    assert by["main.py"].contract is not None and by["main.py"].status == "converted"
    main = by["main.py"].output.decode()
    assert "sdp.init()" in main and "model.fit(" in main and "fit_generator" not in main
    assert "BroadcastGlobalVariablesCallback(0)" in main
    # ModelCheckpoint comes in through the star import (model.py imports it from keras).
    assert "([model_checkpoint] if sdp.rank() == 0 else [])" in main
    assert "sdp.keras.DistributedOptimizer(Adam(" in by["model.py"].output.decode()


# resnet-tf2: evaluate.py imports get_model from train.py, whose training runs only in its
# ``__main__`` block (through a step function that block defines and calls).
EVALUATE_ONLY = {
    "train.py": """\
        import tensorflow as tf


        def get_model():
            return tf.keras.Sequential([tf.keras.layers.Dense(1)])


        def fit_epoch(model, optimizer, dataset):
            for x, y in dataset:
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean((model(x) - y) ** 2)
                grads = tape.gradient(loss, model.trainable_variables)
                optimizer.apply_gradients(zip(grads, model.trainable_variables))


        if __name__ == "__main__":
            model = get_model()
            optimizer = tf.keras.optimizers.SGD(0.1)
            dataset = tf.data.Dataset.from_tensor_slices((tf.zeros([8, 4]), tf.zeros([8, 1])))
            for epoch in range(2):
                fit_epoch(model, optimizer, dataset.batch(4))
        """,
    "evaluate.py": """\
        import tensorflow as tf
        from train import get_model

        if __name__ == "__main__":
            model = get_model()
            model.load_weights("model.weights.h5")
            for x, y in tf.data.Dataset.from_tensor_slices((tf.zeros([8, 4]),)).batch(4):
                print(model(x))
        """,
}


def test_an_entry_that_only_imports_a_training_scripts_factory_gets_no_contract(tmp_path: Path):
    by = {o.path: o for o in check(tmp_path, EVALUATE_ONLY)}
    assert by["evaluate.py"].contract is None and not by["evaluate.py"].needs_attention
    assert by["train.py"].contract is not None


# cyclegan-tf2: data.py builds (and, converted, shards) the zipped dataset and returns its
# length with it; train.py's LinearDecay (module.py) counts optimizer steps from that length.
SCHEDULE_FROM_LENGTH = {
    "data.py": """\
        import tensorflow as tf


        def make_zip_dataset(a, b, batch_size):
            A = tf.data.Dataset.from_tensor_slices(a).batch(batch_size)
            B = tf.data.Dataset.from_tensor_slices(b).batch(batch_size)
            return tf.data.Dataset.zip((A, B)), len(a) // batch_size
        """,
    "module.py": """\
        import tensorflow as tf


        class LinearDecay(tf.keras.optimizers.schedules.LearningRateSchedule):
            def __init__(self, lr, total, start):
                super().__init__()
                self.lr, self.total, self.start = lr, total, start

            def __call__(self, step):
                return self.lr * (1.0 - tf.maximum(0.0, float(step) - self.start) / self.total)
        """,
    "train.py": """\
        import tensorflow as tf

        import data
        import module

        A_B_dataset, len_dataset = data.make_zip_dataset(tf.zeros([64, 4]), tf.zeros([64, 4]), 8)
        G = tf.keras.Sequential([tf.keras.layers.Dense(4)])
        G_lr_scheduler = module.LinearDecay(0.01, 10 * len_dataset, 5 * len_dataset)
        G_optimizer = tf.keras.optimizers.Adam(learning_rate=G_lr_scheduler)

        for epoch in range(10):
            for A, B in A_B_dataset:
                with tf.GradientTape() as t:
                    loss = tf.reduce_mean((G(A) - B) ** 2)
                grads = t.gradient(loss, G.trainable_variables)
                G_optimizer.apply_gradients(zip(grads, G.trainable_variables))
        """,
}


def test_a_schedule_counting_steps_of_data_split_in_another_module_is_noted(tmp_path: Path):
    by = {o.path: o for o in check(tmp_path, SCHEDULE_FROM_LENGTH)}
    assert ".apply(sdp.shard)" in by["data.py"].output.decode()
    train = by["train.py"]
    said = [c.message for c in train.changes]
    # The data is split (in data.py): no note says otherwise.
    assert not [m for m in said if "not sharded" in m or "not split" in m], said
    steps = [c for c in train.changes if c.manual and "counts optimizer steps with len_dataset"
             in c.message]
    assert [c.line for c in steps] == [8] and "len_dataset // sdp.size()" in steps[0].message
    # A schedule object of another module's class is not multiplied (it is no number).
    assert "G_lr_scheduler * sdp.size()" not in train.output.decode()
    assert any("module.LinearDecay(...) is the learning rate" in m for m in said)


# The zip of two inputs that a library module of the project shuffles and batches (and the
# converter does not follow there): a shard of the zip would give each rank every size()-th
# batch of its own order (overlapping parts), so neither it nor the learning rate is touched.
ZIP_OF_SHUFFLED = {
    "imglib/__init__.py": "from imglib.pipeline import *\n",
    "imglib/pipeline.py": """\
        import tensorflow as tf


        def batched_images(paths, batch_size, shuffle=True, repeat=1):
            ds = tf.data.Dataset.from_tensor_slices(paths)
            if shuffle:
                ds = ds.shuffle(1024)
            return ds.map(tf.strings.length).batch(batch_size).repeat(repeat)
        """,
    "data.py": """\
        import tensorflow as tf
        import imglib as il


        def make_pair_dataset(a_paths, b_paths, batch_size):
            a = il.batched_images(a_paths, batch_size)
            b = il.batched_images(b_paths, batch_size, repeat=None)
            return tf.data.Dataset.zip((a, b)), len(a_paths) // batch_size
        """,
    "train.py": """\
        import tensorflow as tf

        import data

        pairs, steps = data.make_pair_dataset(["a"] * 64, ["b"] * 48, 8)
        model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
        optimizer = tf.keras.optimizers.Adam(0.001)
        for epoch in range(3):
            for a, b in pairs:
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(model(tf.cast(a[:, None], tf.float32)) ** 2)
                grads = tape.gradient(loss, model.trainable_variables)
                optimizer.apply_gradients(zip(grads, model.trainable_variables))
        """,
}


def test_a_zip_of_inputs_shuffled_elsewhere_is_split_where_their_paths_are_handed_over(
    tmp_path: Path
):
    # Each input of the zip is a library pipeline that shuffles and batches inside, so neither
    # the zip nor its inputs can be sharded (data.py stays as it is, with no note: nothing is
    # left unsplit); the path lists are split where the training call hands them over, the
    # count returned with them is each worker's, and the rate is scaled.
    by = {o.path: o for o in check(tmp_path, ZIP_OF_SHUFFLED, "data.py", "train.py")}
    data, train = by["data.py"], by["train.py"]
    assert "sdp.shard" not in data.output.decode()
    assert not [c.message for c in data.changes if c.manual]
    assert 'data.make_pair_dataset(sdp.shard(["a"] * 64), sdp.shard(["b"] * 48), 8)' in (
        train.output.decode())
    assert "Adam(0.001 * sdp.size())" in train.output.decode()
    assert not [c.message for c in train.changes if c.manual]
    assert train.contract is not None and train.contract["parts"]["data"]["state"] == "holds"


# A helper that lists a folder and zips images with labels, called for the training, the
# validation and the test folders, its result unpacked with a count; the training side is
# shuffled and batched in the module's own function, trained on in the entry.
FOLDER_HELPER = {
    "prepare.py": """\
        import tensorflow as tf


        def folder_dataset(folder):
            names = [f"{folder}/{i}.png" for i in range(40)]
            images = tf.data.Dataset.from_tensor_slices(names).map(tf.strings.length)
            labels = tf.data.Dataset.from_tensor_slices([i % 2 for i in range(40)])
            return tf.data.Dataset.zip((images, labels)), len(names)


        def all_datasets(batch_size):
            train, n_train = folder_dataset("train")
            valid, n_valid = folder_dataset("valid")
            train = train.shuffle(buffer_size=n_train).batch(batch_size)
            return train, valid.batch(batch_size), n_train
        """,
    "fit.py": """\
        import tensorflow as tf

        from prepare import all_datasets

        if __name__ == "__main__":
            train, valid, count = all_datasets(8)
            model = tf.keras.Sequential([tf.keras.layers.Dense(2)])
            optimizer = tf.keras.optimizers.SGD(0.1)
            for epoch in range(2):
                for x, y in train:
                    with tf.GradientTape() as tape:
                        loss = tf.reduce_mean(model(tf.cast(x[:, None], tf.float32)) ** 2)
                    grads = tape.gradient(loss, model.trainable_variables)
                    optimizer.apply_gradients(zip(grads, model.trainable_variables))
                for x, y in valid:
                    model(tf.cast(x[:, None], tf.float32))
        """,
}


def test_a_shared_folder_helper_is_sharded_after_it_returns_the_training_data(tmp_path: Path):
    by = {o.path: o for o in check(tmp_path, FOLDER_HELPER)}
    prepare = by["prepare.py"].output.decode()
    # Split on the training side, after the helper (which builds the validation data too)
    # and before the shuffle; the helper itself and the validation data are left whole.
    assert "train = train.apply(sdp.shard).shuffle(buffer_size=n_train)" in prepare, prepare
    assert prepare.count("sdp.shard") == 1
    said = [c.message for c in by["prepare.py"].changes]
    assert any("after folder_dataset() returns it" in m and "its map still runs" in m
               for m in said), said
    fit = by["fit.py"]
    assert "SGD(0.1 * sdp.size())" in fit.output.decode()
    assert not [c for o in by.values() for c in o.changes if c.manual], said
    assert fit.contract is not None and fit.contract["parts"]["data"]["state"] == "holds"


# A builder class in a data module makes the tf.data pipeline from the arrays it is given;
# the trainer entry calls it for training (the loop is a runner's method, with a nested
# tf.function step), an evaluator entry for the test arrays; the data module also downloads
# with keras on first use.
BUILDER_TWO_ENTRIES = {
    "pipeline.py": """\
        import numpy as np
        import tensorflow as tf


        def load_arrays(train=True):
            (x, y), (x_test, y_test) = tf.keras.datasets.mnist.load_data()
            if not train:
                x, y = x_test, y_test
            return y.astype("int64"), (x / 255.0).astype("float32")


        class Builder:
            def __init__(self, seed=0):
                self.seed = seed

            def make(self, labels, images, batch_size, training=True):
                ds = tf.data.Dataset.from_tensor_slices((labels, images))
                if training:
                    ds = ds.repeat().shuffle(1000, seed=self.seed)
                return ds.batch(batch_size)
        """,
    "runner.py": """\
        import tensorflow as tf


        def build_optimizer(lr):
            return tf.keras.optimizers.SGD(learning_rate=lr)


        class Runner:
            def __init__(self, model):
                self.model = model

            def train(self, dataset, optimizer, steps):
                @tf.function
                def train_step(labels, images):
                    with tf.GradientTape() as tape:
                        logits = self.model(images)
                        loss = tf.reduce_mean(
                            tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
                    grads = tape.gradient(loss, self.model.trainable_variables)
                    optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
                    return loss

                for labels, images in dataset:
                    train_step(labels, images)
                    if optimizer.iterations >= steps:
                        break
        """,
    "train_main.py": """\
        import tensorflow as tf

        from pipeline import Builder, load_arrays
        from runner import Runner, build_optimizer


        def main():
            labels, images = load_arrays(train=True)
            dataset = Builder().make(labels, images, 32, training=True)
            model = tf.keras.Sequential([tf.keras.layers.Flatten(), tf.keras.layers.Dense(10)])
            Runner(model).train(dataset, build_optimizer(0.1), 100)
            model.save_weights("model.weights.h5")


        if __name__ == "__main__":
            main()
        """,
    "eval_main.py": """\
        import tensorflow as tf

        from pipeline import Builder, load_arrays

        if __name__ == "__main__":
            labels, images = load_arrays(train=False)
            dataset = Builder().make(labels, images, 1000, training=False)
            model = tf.keras.Sequential([tf.keras.layers.Flatten(), tf.keras.layers.Dense(10)])
            model.load_weights("model.weights.h5")
            for y, x in dataset:
                print(float(tf.reduce_mean(tf.cast(tf.argmax(model(x), 1) == y, tf.float32))))
        """,
}


def test_a_builder_shared_with_an_evaluator_gets_its_training_arrays_split(tmp_path: Path):
    by = {o.path: o for o in check(tmp_path, BUILDER_TWO_ENTRIES)}
    pipeline, main = by["pipeline.py"].output.decode(), by["train_main.py"].output.decode()
    # The training call's arrays are split; the builder (the evaluator's too) is left whole.
    assert "Builder().make(sdp.shard(labels), sdp.shard(images), 32, training=True)" in main
    assert "sdp.shard" not in pipeline and by["eval_main.py"].status == "unchanged"
    # The download is named, not put in rank0_first() in pipeline.py: eval_main.py runs it too,
    # without sdp.init(), where rank0_first() would raise NotInitializedError.
    assert "rank0_first" not in pipeline
    # Split, so the rate is scaled where the optimizer is made.
    assert "SGD(learning_rate=lr * sdp.size())" in by["runner.py"].output.decode()
    assert [c.message for o in by.values() for c in o.changes if c.manual] == [
        "tf.keras.datasets.mnist.load_data(...) downloads on every rank at once: run it in `with "
        "sdp.rank0_first():` (not made: eval_main.py imports pipeline.py too and runs without "
        "sdp.init()) [writes]"]
    contract = by["train_main.py"].contract
    assert contract is not None
    assert {k: v["state"] for k, v in contract["parts"].items()} == {
        **dict.fromkeys(("init", "averaging", "data", "state"), "holds"), "writes": "missing"}


# -- a Horovod script migrated to sdp: what its own code already does ----------------------

HOROVOD_SCRIPT = """\
    import filelock
    import torch
    import torchvision
    import horovod.torch as hvd
    from transformers import get_linear_schedule_with_warmup


    def fit(net, batches, opt, sched):
        for x, y in batches:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
            sched.step()


    def main():
        hvd.init()
        local_rank = hvd.local_rank()
        with filelock.FileLock("data.lock"):
            data = torchvision.datasets.CIFAR10(root="data", train=True, download=True)
        sampler = torch.utils.data.distributed.DistributedSampler(
            data, num_replicas=hvd.size(), rank=hvd.rank())
        loader = torch.utils.data.DataLoader(data, batch_size=32, sampler=sampler)
        net = torchvision.models.resnet18(num_classes=10)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        hvd.broadcast_parameters(net.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(opt, named_parameters=net.named_parameters())
        sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=0, num_training_steps=9)
        for epoch in range(3):
            sampler.set_epoch(epoch)
            fit(net, loader, opt, sched)
            if local_rank == 0:
                torch.save(net.state_dict(), "net.pt")
        if hvd.local_rank() == 0:
            with open("done.txt", "w") as f:
                f.write("done")


    if __name__ == "__main__":
        main()
    """


def test_a_migrated_horovod_script_is_read_as_it_distributes(tmp_path: Path):
    # The optimizer's DistributedOptimizer averages (its schedule, given the optimizer, trains
    # nothing; the migration's note on its unscaled rate is no averaging note); the download in
    # a file lock runs once; the writes under a local rank test run once per machine, which is
    # said as such, never "on every rank".
    [outcome] = check(tmp_path, {"train.py": HOROVOD_SCRIPT})
    states = {k: v["state"] for k, v in outcome.contract["parts"].items()}
    assert states["averaging"] == "holds" and states["data"] == "holds"
    found = notes([outcome])
    assert not [n for n in found if "every rank" in n or "get_linear_schedule" in n], found
    assert [n.split(": ")[0] for n in notes([outcome], "writes")] == ["train.py:33", "train.py:35"]
    assert all("first process of each machine" in n for n in notes([outcome], "writes"))
    assert states["writes"] == "unknown"
    assert any("learning rate is not scaled" in c.message for c in outcome.changes)
    assert outcome.contract["parts"]["averaging"]["noted"] is False


# -- a module with a trainer and an evaluator, each run by its own script ----------------------

RUNNERS = """\
    import tensorflow as tf


    class Fitter:
        def __init__(self, net):
            self.net = net

        def run(self, batches, opt, steps):
            @tf.function
            def one_step(x, y):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(tf.square(self.net(x) - y))
                grads = tape.gradient(loss, self.net.trainable_variables)
                opt.apply_gradients(zip(grads, self.net.trainable_variables))
                done = opt.iterations
                return loss, done

            for x, y in batches:
                loss, done = one_step(x, y)
                if done >= steps:
                    break


    class Scorer:
        def __init__(self, net):
            self.net = net

        def score(self, batches):
            return [float(tf.reduce_mean(self.net(x) - y)) for x, y in batches]
    """

RUN_FIT = """\
    import tensorflow as tf
    from runners import Fitter


    def main():
        data = tf.data.Dataset.from_tensor_slices((tf.ones([64, 3]), tf.ones([64, 1]))).batch(8)
        net = tf.keras.Sequential([tf.keras.layers.Dense(1)])
        fitter = Fitter(net)
        fitter.run(data, tf.keras.optimizers.SGD(0.1), 100)


    if __name__ == "__main__":
        main()
    """

RUN_SCORE = """\
    import tensorflow as tf
    from runners import Scorer


    def main():
        data = tf.data.Dataset.from_tensor_slices((tf.ones([64, 3]), tf.ones([64, 1]))).batch(8)
        net = tf.keras.Sequential([tf.keras.layers.Dense(1)])
        print(Scorer(net).score(data))


    if __name__ == "__main__":
        main()
    """


def test_a_script_that_only_evaluates_gets_no_training_contract(tmp_path: Path):
    # run_score.py imports the module whose Fitter trains, but calls only its Scorer: the
    # training is run_fit.py's alone, and run_score.py stays a one-process script. The loop's
    # exit reads the optimizer's step count, the same on every worker: no broadcast of it.
    files = {"runners.py": RUNNERS, "run_fit.py": RUN_FIT, "run_score.py": RUN_SCORE}
    outcomes = {o.path: o for o in check(tmp_path, files)}
    assert outcomes["run_fit.py"].contract is not None
    assert outcomes["run_score.py"].contract is None
    assert outcomes["run_score.py"].status == "unchanged"  # no init "for the training" it runs
    lines = [c.message for o in outcomes.values() for c in o.changes]
    assert not [m for m in lines if "called 0 times" in m or "broadcast_object" in m], lines


# -- a script's own distribution, switched by a configuration default of another module --------

SETTINGS = """\
    class Node(dict):
        __getattr__ = dict.__getitem__
        __setattr__ = dict.__setitem__


    cfg = Node()
    cfg.run = Node()
    cfg.run.multi_process = False
    cfg.run.epochs = 10


    def get_settings():
        return cfg
    """


def test_a_distribution_switch_whose_default_another_module_sets_is_named_with_it(
        tmp_path: Path):
    source = (FIXTURES / "distributed" / "config_flag_elsewhere" / "input.py").read_text()
    files = {"settings.py": SETTINGS, "train.py": source}
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    done = subprocess.run([SDP_CONVERT, "--check", "."], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    lines = [line for line in (done.stdout + done.stderr).splitlines()
             if "note_already_distributed" in line]
    assert lines == [
        "train.py:10:9: [note_already_distributed] left unchanged: already distributed with "
        "torch.distributed + torch DistributedDataParallel, but only when "
        "`cfg.run.multi_process` (cfg.run.multi_process is False by default, set in "
        "settings.py:8: started as usual, it runs on one process); to run it on N processes, "
        "launch it with `torchrun --nproc_per_node=N SCRIPT.py ...` with cfg.run.multi_process "
        "set"], done.stdout + done.stderr


HOROVOD_DOWNLOAD_AT_IMPORT = """\
    import sys
    import urllib.request

    import horovod.torch as hvd
    import torch

    urllib.request.urlretrieve("https://example.com/train.csv", filename="train.csv")


    def main():
        rows = open("train.csv").read().split()
        model = torch.nn.Linear(4, 1)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1 * hvd.size()),
                                       named_parameters=model.named_parameters(){op})
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        data = torch.randn(32, 4)[hvd.rank()::hvd.size()]
        for x in data.split(8):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()


    if __name__ == "__main__":
        hvd.init()
        main()
    """


def test_a_download_at_import_before_a_migrated_init_runs_after_an_earlier_init(tmp_path: Path):
    # The rank test and barrier need init() first: the migration puts hvd.init() before the
    # download (the script's own then does nothing, as in Horovod), the download on rank 0, then
    # a barrier; the contract's writes part holds on the converted file, with no note.
    [outcome] = check(tmp_path, {"train.py": HOROVOD_DOWNLOAD_AT_IMPORT.format(op="")})
    assert notes([outcome], "writes") == []
    writes = outcome.contract["parts"]["writes"]
    assert (writes["state"], writes["noted"]) == ("holds", False), writes
    assert (
        "hvd.init()\n\n"
        "if hvd.rank() == 0:\n"
        '    urllib.request.urlretrieve("https://example.com/train.csv", filename="train.csv")\n'
        "hvd.barrier()\n") in outcome.output.decode()
    assert outcome.output.decode().count("hvd.init()") == 2  # the script's own stays, in __main__
    [change] = [c for c in outcome.changes if c.line == 7]
    assert (change.transform, change.manual) == ("migrate_horovod", False)


@pytest.mark.parametrize("before", [
    'os.environ["NCCL_DEBUG"] = "INFO"', 'mp.set_start_method("spawn")'])
def test_a_download_at_import_before_a_migrated_init_is_told_to_move_after_it(
        tmp_path: Path, before: str):
    # Where the __main__ block sets what init() reads before it, an earlier init() would run
    # without it: nothing moves, and the note says what to do (the rank test and barrier it asks
    # for raise NotInitializedError before init()); the runtime is named as the file binds it.
    source = textwrap.dedent(HOROVOD_DOWNLOAD_AT_IMPORT.format(op="")).replace(
        "import sys\n", "import os\nimport sys\n\nimport torch.multiprocessing as mp\n").replace(
        "    hvd.init()\n", f"    {before}\n    hvd.init()\n")
    [outcome] = check(tmp_path, {"train.py": source})
    assert notes([outcome], "writes") == [
        "train.py:10: urllib.request.urlretrieve(...) writes the same files on every rank at "
        "once: it runs at import, before hvd.init() (train.py:28): move it after hvd.init() "
        "(into the `if __name__ == \"__main__\":` block, before what reads its files), and "
        "there run it on rank 0 only (`if hvd.rank() == 0:`), then `hvd.barrier()` [writes]"]
    assert outcome.output.decode().count("hvd.init()") == 1


def test_a_missing_name_in_one_branch_of_a_conditional_leaves_averaging_unknown(tmp_path: Path):
    # ``op=hvd.Adasum if <flag> else hvd.Average``: averaged with the flag off (NotProvidedError
    # with it on); the note says which branch reads the missing name, and the part it speaks
    # for is "unknown" (noted), not "missing".
    source = HOROVOD_DOWNLOAD_AT_IMPORT.format(
        op=", op=hvd.Adasum if '--adasum' in sys.argv else hvd.Average")
    [outcome] = check(tmp_path, {"train.py": source})
    averaging = outcome.contract["parts"]["averaging"]
    assert (averaging["state"], averaging["noted"]) == ("unknown", True), averaging
    assert averaging["detail"].startswith(
        "hvd.Adasum: not provided by sdp_runtime, evaluated only when `'--adasum' in sys.argv` "
        "is true (`hvd.Average` otherwise); ")
    [outcome] = check(tmp_path, {"train.py": HOROVOD_DOWNLOAD_AT_IMPORT.format(
        op=", op=hvd.Adasum")})
    assert outcome.contract["parts"]["averaging"]["state"] == "missing"


FLAGGED_FACTORY = """\
    import torch
    import sdp_runtime.torch as sdp

    sdp.init()


    def get_loader(dataset, shuffle=False, shard=False):
        sampler = (
            torch.utils.data.distributed.DistributedSampler(
                dataset, num_replicas=sdp.size(), rank=sdp.rank(), shuffle=shuffle
            )
            if shard
            else None
        )
        return torch.utils.data.DataLoader(dataset, batch_size=8,
                                           shuffle=False if shard else shuffle, sampler=sampler)


    def main():
        data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
        train_loader = get_loader(data, shuffle=True, shard=True)
        valid_loader = get_loader(data)
        model = sdp.DistributedDataParallel(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1 * sdp.size())
        for epoch in range(2):
            train_loader.sampler.set_epoch(epoch)
            for x, y in train_loader:
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
            with torch.no_grad():
                for x, y in valid_loader:
                    print(float(model(x).sum()))


    if __name__ == "__main__":
        main()
    """


def test_a_sampler_a_factorys_flag_chooses_is_read_on_the_training_calls_path(tmp_path: Path):
    """shard_shared_loader's edit: `DistributedSampler(...) if shard else None` in a factory
    shared with evaluation. The data is split where the training call sets the flag, and not
    where it does not (the sampler's code mentioning the rank is not enough)."""
    [outcome] = check(tmp_path, {"train.py": FLAGGED_FACTORY})
    assert outcome.contract["parts"]["data"]["state"] == "holds"
    unset = FLAGGED_FACTORY.replace("shuffle=True, shard=True)", "shuffle=True)")
    [outcome] = check(tmp_path, {"train.py": unset})
    assert outcome.contract["parts"]["data"]["state"] == "missing"
    assert any(n.startswith("train.py:15: the DataLoader built here feeds the training loop at "
                            "train.py:27 and has no DistributedSampler") for n in notes([outcome]))


def test_a_config_factory_making_a_dataloader_subclass_is_named_with_what_to_do(tmp_path: Path):
    """pytorch-template: the loop reads `config.init_obj("data_loader", module_data)`, an object of
    a class of that module the configuration names (here through `getattr(module, ...)` in the
    factory, `module` followed to what its caller passes): a DataLoader subclass building its own
    sampler (`loaders/` has no `__init__.py`, as there). The data line names the module, its
    classes, the subclass's base and the edit (it said only that the converter cannot tell)."""
    files = {
        "settings.py": """\
            class Settings(dict):
                def build(self, name, module, *args):
                    spec = self[name]
                    return getattr(module, spec["type"])(*args, **spec["args"])
            """,
        "base/__init__.py": "",
        "base/loader.py": """\
            import torch
            from torch.utils.data import DataLoader, SubsetRandomSampler


            class BaseLoader(DataLoader):
                def __init__(self, dataset, batch_size, held_out=0.0):
                    keep = int(len(dataset) * (1 - held_out))
                    self.rest = list(range(keep, len(dataset)))
                    super().__init__(dataset, batch_size=batch_size,
                                     sampler=SubsetRandomSampler(list(range(keep))))
            """,
        "loaders/toy.py": """\
            import torch
            from base.loader import BaseLoader


            class ToyLoader(BaseLoader):
                def __init__(self, batch_size):
                    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
                    super().__init__(data, batch_size)
            """,
        "train.py": """\
            import torch
            import loaders.toy as module_data
            from settings import Settings


            def main():
                settings = Settings({"data": {"type": "ToyLoader", "args": {"batch_size": 8}}})
                loader = settings.build("data", module_data)
                model = torch.nn.Linear(4, 1)
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
                for epoch in range(2):
                    for x, y in loader:
                        opt.zero_grad()
                        torch.nn.functional.mse_loss(model(x), y).backward()
                        opt.step()


            if __name__ == "__main__":
                main()
            """,
    }
    outcomes = check(tmp_path, files)
    [line] = notes(outcomes, "data")
    assert line.startswith(
        "settings.py:4: the loop at train.py:12 reads getattr(module, spec[\"type\"])(*args, "
        "**spec[\"args\"]): an instance of a class of loaders/toy.py that the call chooses "
        "(ToyLoader), a DataLoader "
        "subclass (BaseLoader at base/loader.py:5) whose own sampler the converter does not "
        "replace")
    assert "make the sampler it builds for training yield only this rank's part" in line
    [entry] = [o for o in outcomes if o.contract]
    assert entry.contract["parts"]["data"]["state"] == "unknown"


def test_write_notes_in_a_migrated_horovod_script_name_the_runtime_as_it_is_bound(tmp_path: Path):
    # After the migration the file binds the runtime as ``hvd``: advice spelled ``sdp.rank()``
    # would raise NameError where the user pastes it.
    source = HOROVOD_DOWNLOAD_AT_IMPORT.format(op="").replace(
        'urllib.request.urlretrieve("https://example.com/train.csv", filename="train.csv")\n', ""
    ).replace(
        "            opt.step()\n",
        "            opt.step()\n"
        "        open('every.log', 'a').write('step')\n"
        "        if hvd.local_rank() == 0:\n"
        "            open('machine.log', 'a').write('step')\n",
    )
    [outcome] = check(tmp_path, {"train.py": source})
    lines = notes([outcome], "writes")
    assert len(lines) == 2, lines
    assert all("hvd.rank() == 0" in line and "sdp." not in line for line in lines), lines


def test_a_set_epoch_left_to_the_user_by_the_shared_loader_edit_speaks_for_the_data(
    tmp_path: Path,
):
    # shard_shared_loader splits the training loader but cannot put set_epoch where the loader
    # may be unbound: its manual note says what is left, so the data part does not hold.
    source = """\
        import sys

        import torch
        from torch.utils.data import DataLoader, TensorDataset


        def get_loader(dataset, batch_size, shuffle=False):
            return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle)


        data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
        valid_loader = get_loader(data, 8)
        if len(sys.argv) > 1:
            train_loader = get_loader(data, 8, shuffle=True)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(3):
            for x, y in train_loader:
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
            with torch.no_grad():
                print(sum(float(model(x).sum()) for x, _ in valid_loader))
        """
    [outcome] = check(tmp_path, {"train.py": source})
    assert any(c.transform == "shard_shared_loader" and c.manual for c in outcome.changes)
    data = outcome.contract["parts"]["data"]
    assert (data["state"], data["noted"]) == ("missing", True), data


def test_writes_the_converter_cannot_see_or_that_race_never_hold(tmp_path: Path):
    """pytorch-template: a settings object made by a classmethod (`cls(values)`) makes a run
    folder with `exist_ok=fresh` (False unless the name is empty: every rank but the first raises
    FileExistsError), writes through a star-imported helper's `path.open("w")` (now repaired there),
    configures logging from a file (file handlers unseen) and makes a SummaryWriter of a module
    picked at run time. Each is named at its line and the writes part is not 'holds' (it said
    'holds', silently)."""
    files = {
        "tools/__init__.py": "from .files import *\n",
        "tools/files.py": """\
            from pathlib import Path


            def save_text(text, fname):
                fname = Path(fname)
                with fname.open("w") as handle:
                    handle.write(text)
            """,
        "tools/board.py": """\
            import importlib
            import logging.config


            def make_board(log_dir, config):
                logging.config.dictConfig(config)
                for name in ["torch.utils.tensorboard", "tensorboardX"]:
                    try:
                        return importlib.import_module(name).SummaryWriter(log_dir)
                    except ImportError:
                        pass
            """,
        "settings.py": """\
            import time
            from pathlib import Path

            from tools import save_text
            from tools.board import make_board


            class Settings(dict):
                def __init__(self, values, run_id=None):
                    super().__init__(values)
                    if run_id is None:
                        run_id = time.strftime("%H%M%S")
                    self.out = Path(values["out"]) / run_id
                    fresh = run_id == ""
                    self.out.mkdir(parents=True, exist_ok=fresh)
                    self.saved = save_text(str(values), self.out / "settings.txt")
                    self.board = make_board(self.out, {"version": 1})

                @classmethod
                def from_values(cls, values):
                    return cls(values)
            """,
        "train.py": """\
            import torch
            from settings import Settings


            def main():
                settings = Settings.from_values({"out": "runs"})
                model = torch.nn.Linear(4, 1)
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
                loader = torch.utils.data.DataLoader(
                    torch.utils.data.TensorDataset(torch.randn(32, 4)), batch_size=8)
                for (x,) in loader:
                    opt.zero_grad()
                    model(x).pow(2).mean().backward()
                    opt.step()


            if __name__ == "__main__":
                main()
            """,
    }
    outcomes = check(tmp_path, files)
    found = notes(outcomes, "writes")
    assert any(n.startswith("settings.py:15: self.out.mkdir(...) runs on every rank with "
                            "exist_ok=fresh, which may be False") for n in found), found
    # (Reached through `cls(values)` in the classmethod: before, a write nothing seemed to call.)
    assert [c.message for o in outcomes if o.path.endswith("files.py") for c in o.changes] == [
        "fname.open(...) runs on rank 0 only"]
    assert any(n.startswith("tools/board.py:6: logging.config.dictConfig(...) may add file "
                            "handlers") for n in found), found
    assert any(n.startswith("tools/board.py:9: importlib.import_module(name).SummaryWriter(...) "
                            "may make a SummaryWriter") for n in found), found
    [entry] = [o for o in outcomes if o.contract]
    assert entry.contract["parts"]["writes"]["state"] == "missing"


@pytest.mark.parametrize("evaluator", ["", "runs", "reads"])
def test_a_download_in_a_class_a_configuration_picks_is_in_the_program_and_ordered(
    tmp_path: Path, evaluator: str
):
    """pytorch-template: `getattr(module, spec["type"])(...)` makes a DataLoader subclass of
    `loaders/toy.py` (a folder without `__init__.py`, importing torchvision alone) whose
    `__init__` downloads MNIST. Nothing calls that class by name; it is the program's all the
    same: the module is among the contract's, and the download runs in `sdp.rank0_first()`; unless
    an evaluation script that never starts the runtime imports the module too (there
    `rank0_first()` would raise): then it is named, not made. A script that only reads the
    class (`DigitsLoader.__name__`, deeplabv3plus's predict.py reading a static method) runs
    no download: the repair is made."""
    files = {
        "settings.py": """\
            def build(spec, module):
                return getattr(module, spec["type"])(**spec["args"])
            """,
        "loaders/toy.py": """\
            from torch.utils.data import DataLoader
            from torchvision import datasets, transforms


            class DigitsLoader(DataLoader):
                def __init__(self, root, batch_size):
                    data = datasets.MNIST(root, download=True, transform=transforms.ToTensor())
                    super().__init__(data, batch_size=batch_size, shuffle=True)
            """,
        "train.py": """\
            import torch
            import loaders.toy as module_data
            from settings import build


            def main():
                loader = build({"type": "DigitsLoader", "args": {"root": "d", "batch_size": 8}},
                               module_data)
                model = torch.nn.Linear(784, 10)
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
                for x, y in loader:
                    opt.zero_grad()
                    torch.nn.functional.cross_entropy(model(x.flatten(1)), y).backward()
                    opt.step()


            if __name__ == "__main__":
                main()
            """,
    }
    if evaluator:
        use = ('len(module_data.DigitsLoader("d", 8))' if evaluator == "runs"
               else "module_data.DigitsLoader.__name__")
        files["evaluate.py"] = f"""\
            import loaders.toy as module_data

            if __name__ == "__main__":
                print({use})
            """
    outcomes = check(tmp_path, files)
    [entry] = [o for o in outcomes if o.contract]
    assert "loaders/toy.py" in entry.contract["modules"]
    [toy] = [o for o in outcomes if o.path.endswith("toy.py")]
    if evaluator == "runs":
        [note] = [c.message for c in toy.changes]
        assert note.startswith("datasets.MNIST(...) downloads on every rank at once")
        assert "(not made: evaluate.py imports loaders/toy.py too and runs without sdp.init())" in (
            note)
        return
    assert [(c.transform, c.line) for c in toy.changes] == [("order_downloads", 7)]
    assert b"with sdp.rank0_first():" in toy.output


# -- arrays handed to a library's pipeline builder, which shuffles and batches inside ----------

LIBRARY_BUILDER = {
    "lib/__init__.py": """\
        from lib.data import *
        """,
    "lib/data/__init__.py": """\
        from lib.data.dataset import *
        """,
    "lib/data/dataset.py": """\
        import tensorflow as tf


        def batch_dataset(dataset, batch_size, shuffle=True):
            if shuffle:
                dataset = dataset.shuffle(2048)
            return dataset.batch(batch_size, drop_remainder=True)


        def memory_data_batch_dataset(memory_data, batch_size, shuffle=True):
            dataset = tf.data.Dataset.from_tensor_slices(memory_data)
            return batch_dataset(dataset, batch_size, shuffle=shuffle)
        """,
    "data.py": """\
        import tensorflow as tf
        import lib as tl


        def make_32x32_dataset(name, batch_size):
            if name == 'mnist':
                (train_images, _), (_, _) = tf.keras.datasets.mnist.load_data()
            else:
                (train_images, _), (_, _) = tf.keras.datasets.fashion_mnist.load_data()
            dataset = tl.memory_data_batch_dataset(train_images, batch_size)
            return dataset, len(train_images) // batch_size


        def make_disk_dataset(img_paths, batch_size):
            return tl.memory_data_batch_dataset(img_paths, batch_size).map(tf.io.read_file)
        """,
    "train.py": """\
        import argparse
        import glob

        import tensorflow as tf

        import data

        parser = argparse.ArgumentParser()
        parser.add_argument('--dataset', default='mnist')
        parser.add_argument('--lr', type=float, default=0.0002)
        args = parser.parse_args()

        if args.dataset in ['mnist', 'fashion_mnist']:
            dataset, len_dataset = data.make_32x32_dataset(args.dataset, 32)
        LISTED
        model = tf.keras.Sequential([tf.keras.layers.Flatten(), tf.keras.layers.Dense(10)])
        optimizer = tf.keras.optimizers.Adam(learning_rate=args.lr)


        @tf.function
        def train_step(x):
            with tf.GradientTape() as t:
                loss = tf.reduce_mean(model(tf.cast(x, tf.float32)) ** 2)
            grads = t.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))


        for x in dataset:
            train_step(x)
        """,
}

LISTED = """\
elif args.dataset == 'faces':
            img_paths = LISTING
            dataset = data.make_disk_dataset(img_paths, 32)"""


#: Paths from a listing, in a list the converter does not sort (a listing call alone it does).
UNSORTED = "[p for p in glob.glob('faces/*.jpg')]"


def _library_builder(listing: str | None) -> dict[str, str]:
    files = dict(LIBRARY_BUILDER)
    files["train.py"] = files["train.py"].replace(
        "LISTED", "" if listing is None else LISTED.replace("LISTING", listing))
    return files


@pytest.mark.parametrize("listing", [None, "sorted(glob.glob('faces/*.jpg'))"])
def test_arrays_handed_to_a_library_pipeline_builder_are_split_where_handed_over(
    tmp_path: Path, listing: str | None
):
    # The library's builder (called once, or by another helper too) shuffles and batches what
    # it is given: the arrays (or the sorted paths) are split where they are handed to it, in
    # every branch that makes the training data; the library is left whole.
    by = {o.path: o for o in check(tmp_path, _library_builder(listing))}
    data_py, train = by["data.py"].output.decode(), by["train.py"].output.decode()
    assert "tl.memory_data_batch_dataset(sdp.shard(train_images), batch_size)" in data_py
    assert by["lib/data/dataset.py"].status == "unchanged"
    if listing is not None:
        assert "data.make_disk_dataset(sdp.shard(img_paths), 32)" in train
        assert "tl.memory_data_batch_dataset(img_paths, batch_size)" in data_py
    assert "Adam(learning_rate=args.lr * sdp.size())" in train
    assert not [c for o in by.values() for c in o.changes if c.manual]
    contract = by["train.py"].contract
    assert contract is not None and contract["parts"]["data"]["state"] == "holds"


def test_a_branch_whose_paths_come_from_a_listing_is_not_split_and_says_why(tmp_path: Path):
    by = {o.path: o for o in check(tmp_path, _library_builder(UNSORTED))}
    # The arrays' branch is split; the listed paths are not (their order may differ between
    # ranks, and a list made from a listing is not sorted by the converter: its items may not
    # sort), and the note says so; the rate stays as it is, since not every branch is split.
    assert "sdp.shard(train_images)" in by["data.py"].output.decode()
    train = by["train.py"].output.decode()
    assert "sdp.shard(img_paths)" not in train and "args.lr * sdp.size()" not in train
    [note] = notes(list(by.values()), "data")
    assert "come from glob.glob('faces/*.jpg') at train.py:16, a listing whose order may " \
           "differ between ranks" in note
    assert by["train.py"].contract["parts"]["data"]["state"] == "missing"


def test_data_split_on_some_paths_only_is_said_so_in_every_note(tmp_path: Path):
    # dcgan-tf2's shape: the default branch's arrays are split where they are handed to the
    # library's builder, the listed paths' branch is not. No note may say "not split" of the
    # data as a whole (false on the default path), nor "split": each says which path is which,
    # and the rate stays as it is (it would be N times too large on the unsplit path).
    by = {o.path: o for o in check(tmp_path, _library_builder(UNSORTED))}
    train = by["train.py"]
    assert "sdp.shard(train_images)" in by["data.py"].output.decode()
    assert "args.lr * sdp.size()" not in train.output.decode()
    partly = ("partly split: split on the path through make_32x32_dataset() (data.py:11); "
              "not split on the path through make_disk_dataset() (data.py:15)")
    [loop] = [c.message for c in train.changes if c.transform == "shard_tf_dataset"]
    assert loop.startswith(f"training data {partly}: "), loop
    rates = [c.message for c in train.changes if c.transform == "scale_keras_learning_rate"]
    assert rates and all("split on some of the paths that bind it only" in r
                         and "not split between" not in r for r in rates), rates
    assert train.contract["parts"]["data"]["state"] == "missing"
    assert train.contract["parts"]["data"]["detail"].startswith(partly), train.contract
    [note] = notes(list(by.values()), "data")
    assert note.split(": ", 1)[1].startswith(partly), note


def test_paths_listed_in_the_file_systems_order_are_sorted_where_listed_then_split(
    tmp_path: Path
):
    # cyclegan-tf2's shape: two path lists from a listing helper, handed to a builder of a zip
    # of two library pipelines (each shuffles and batches inside; a local packs the paths and
    # optional labels) that returns the zip and a length computed from the lists. Each list is
    # sorted where it is listed (every rank splits the same list) and split where the training
    # call hands it over; the evaluation call and the library stay whole; the length, made
    # from the split lists, counts each worker's steps: no note asks to divide it.
    files = {
        "lib/__init__.py": LIBRARY_BUILDER["lib/__init__.py"],
        "lib/data/__init__.py": LIBRARY_BUILDER["lib/data/__init__.py"],
        "lib/data/dataset.py": textwrap.dedent(LIBRARY_BUILDER["lib/data/dataset.py"])
        + textwrap.dedent("""\

        def disk_image_batch_dataset(img_paths, batch_size, labels=None, shuffle=True):
            if labels is None:
                memory_data = img_paths
            else:
                memory_data = (img_paths, labels)
            return memory_data_batch_dataset(memory_data, batch_size, shuffle=shuffle)
        """),
        "tools.py": """\
        import glob as _glob
        import os


        def glob(folder, pattern):
            return _glob.glob(os.path.join(folder, pattern))
        """,
        "data.py": """\
        import tensorflow as tf
        import lib as tl


        def make_dataset(img_paths, batch_size, training):
            return tl.disk_image_batch_dataset(img_paths, batch_size, shuffle=training)


        def make_zip_dataset(a_paths, b_paths, batch_size, training=True):
            a = make_dataset(a_paths, batch_size, training)
            b = make_dataset(b_paths, batch_size, training)
            return tf.data.Dataset.zip((a, b)), max(len(a_paths), len(b_paths)) // batch_size
        """,
        "train.py": """\
        import tensorflow as tf

        import data
        import tools

        a_paths = tools.glob('data/trainA', '*.jpg')
        b_paths = tools.glob('data/trainB', '*.jpg')
        dataset, len_dataset = data.make_zip_dataset(a_paths, b_paths, 4)
        test_a = tools.glob('data/testA', '*.jpg')
        test_dataset, _ = data.make_zip_dataset(test_a, test_a, 4, training=False)
        schedule = tf.keras.optimizers.schedules.PolynomialDecay(0.001, 10 * len_dataset)
        model = tf.keras.Sequential([tf.keras.layers.Flatten(), tf.keras.layers.Dense(10)])
        optimizer = tf.keras.optimizers.Adam(learning_rate=schedule)


        @tf.function
        def train_step(a, b):
            with tf.GradientTape() as t:
                loss = tf.reduce_mean((model(a) - model(b)) ** 2)
            grads = t.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))


        for epoch in range(10):
            for a, b in dataset:
                train_step(a, b)
        """,
    }
    import re

    by = {o.path: o for o in check(tmp_path, files)}
    train = by["train.py"].output.decode()
    assert "a_paths = sorted(tools.glob('data/trainA', '*.jpg'))" in train, train
    assert "b_paths = sorted(tools.glob('data/trainB', '*.jpg'))" in train
    assert "data.make_zip_dataset(sdp.shard(a_paths), sdp.shard(b_paths), 4)" in train
    assert "test_a = tools.glob('data/testA', '*.jpg')" in train
    assert "data.make_zip_dataset(test_a, test_a, 4, training=False)" in train
    assert re.search(r"PolynomialDecay\(\s*0\.001 \* sdp\.size\(\), 10 \* len_dataset,", train)
    for unchanged in ("data.py", "tools.py", "lib/data/dataset.py"):
        assert by[unchanged].status == "unchanged", by[unchanged].output.decode()
    assert not [(o.path, c.message) for o in by.values() for c in o.changes if c.manual]
    assert by["train.py"].contract["parts"]["data"]["state"] == "holds"
