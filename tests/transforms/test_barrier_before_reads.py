"""barrier_before_reads: every rank waits for rank 0 before reading back what it wrote."""

from __future__ import annotations

from .helpers import check_noop, check_transformed, messages, run

ONLY = "barrier_before_reads"
LOOP = """\
import torch

model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    optimizer.zero_grad()
    loss_fn(model(x), y).backward()
    optimizer.step()
"""


def test_whole_model_saved_by_rank0_then_loaded_waits_word_language_model_style():
    result = run(
        LOOP
        + """\
    if best is None or loss < best:
        with open(args.save, "wb") as f:
            torch.save(model, f)

with open(args.save, "rb") as f:
    model = torch.load(f, weights_only=False)
"""
    )
    code = result.output.decode()
    assert (
        "            with open(args.save, \"wb\") as f:\n                torch.save(model, f)\n\n"
        "sdp.barrier()\nwith open(args.save, \"rb\") as f:\n" in code
    ), code
    assert messages(result, ONLY) == [
        "sdp.barrier() before reading args.save: rank 0 alone writes it"
    ]


def test_a_write_the_script_guards_itself():
    check_transformed(
        """\
        import sdp_runtime.torch as sdp
        import torch

        sdp.init()
        if sdp.rank() == 0:
            torch.save(model.state_dict(), "best.pt")
        model.load_state_dict(torch.load("best.pt"))
        loss.backward()
        optimizer.step()
        """,
        """\
        import sdp_runtime.torch as sdp
        import torch

        sdp.init()
        if sdp.rank() == 0:
            torch.save(model.state_dict(), "best.pt")
        sdp.barrier()
        model.load_state_dict(torch.load("best.pt"))
        loss.backward()
        optimizer.step()
        """,
        only=ONLY,
    )


def test_no_barrier_for_another_path_a_rank0_read_or_an_existing_barrier():
    check_noop(
        """\
        import sdp_runtime.torch as sdp
        import torch

        sdp.init()
        if sdp.rank() == 0:
            torch.save(model.state_dict(), "best.pt")
            model.load_state_dict(torch.load("best.pt"))
        model.load_state_dict(torch.load("other.pt"))
        sdp.barrier()
        model.load_state_dict(torch.load("best.pt"))
        loss.backward()
        optimizer.step()
        """,
        only=ONLY,
    )


def test_a_read_before_the_write_or_in_another_function_gets_none():
    check_noop(
        """\
        import sdp_runtime.torch as sdp
        import torch

        sdp.init()


        def save():
            if sdp.rank() == 0:
                torch.save(model.state_dict(), "best.pt")


        model.load_state_dict(torch.load("best.pt"))
        save()
        loss.backward()
        optimizer.step()
        """,
        only=ONLY,
    )


def test_keras_weights_and_checkpoint_manager():
    check_transformed(
        """\
        import sdp_runtime.tensorflow as sdp
        import tensorflow as tf

        sdp.init()
        with tf.GradientTape() as tape:
            loss = model(x)
        optimizer.apply_gradients(zip(tape.gradient(loss, v), v))
        if sdp.rank() == 0:
            model.save_weights("w.weights.h5")
            manager.save()
        model.load_weights("w.weights.h5")
        checkpoint.restore(manager.latest_checkpoint)
        """,
        """\
        import sdp_runtime.tensorflow as sdp
        import tensorflow as tf

        sdp.init()
        with tf.GradientTape() as tape:
            loss = model(x)
        optimizer.apply_gradients(zip(tape.gradient(loss, v), v))
        if sdp.rank() == 0:
            model.save_weights("w.weights.h5")
            manager.save()
        sdp.barrier()
        model.load_weights("w.weights.h5")
        sdp.barrier()
        checkpoint.restore(manager.latest_checkpoint)
        """,
        only=ONLY,
    )


def test_temporary_directories_are_every_ranks_own():
    result = run(
        (LOOP
        + """\
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "model.pt")
    torch.save(model.state_dict(), path)
    model.load_state_dict(torch.load(path))
scratch = tempfile.mkdtemp()
np.save(os.path.join(scratch, "x.npy"), x)
""").replace("import torch\n", "import os\nimport tempfile\n\nimport numpy as np\nimport torch\n")
    )
    code = result.output.decode()
    assert "rank() == 0" not in code and "barrier" not in code, code


def test_reads_of_what_rank0_wrote_in_the_vocabulary_of_issue_30_wait_for_it():
    # A plot opened with PIL, a Hugging Face model saved then loaded, a SavedModel.
    result = run(
        LOOP
        + """\
import matplotlib.pyplot as plt
from PIL import Image
from transformers import AutoModel

plt.savefig(out)
preview = Image.open(out)
model.save_pretrained(export_dir)
again = AutoModel.from_pretrained(export_dir)
"""
    )
    assert messages(result, ONLY) == [
        "sdp.barrier() before reading out: rank 0 alone writes it",
        "sdp.barrier() before reading export_dir: rank 0 alone writes it",
    ]
    code = result.output.decode()
    assert "sdp.barrier()\npreview = Image.open(out)" in code
    # from_pretrained also downloads (order_downloads): the barrier comes before that block.
    assert ("sdp.barrier()\nwith sdp.rank0_first():\n"
            "    again = AutoModel.from_pretrained(export_dir)") in code


def test_keras_best_weights_read_after_fit_wait_and_a_resume_before_fit_does_not():
    source = """\
        import os
        import tensorflow as tf

        def main():
            model.compile(optimizer="sgd", loss="mse")
            best = tf.keras.callbacks.ModelCheckpoint(path, save_best_only=True)
            if os.path.exists(path):
                model.load_weights(path)
            model.fit(x, y, callbacks=[best])
            model.load_weights(path)
            tf.saved_model.save(model, export)
            served = tf.saved_model.load(export)
        """
    result = run(source)
    assert messages(result, ONLY) == [
        "sdp.barrier() before reading path: rank 0 alone writes it",
        "sdp.barrier() before reading export: rank 0 alone writes it",
    ]
    code = result.output.decode()
    # The resume before fit reads what an earlier run wrote: no barrier, no note there.
    assert "    if os.path.exists(path):\n        model.load_weights(path)" in code
    assert "    sdp.barrier()\n    model.load_weights(path)\n" in code


def test_a_checkpoint_of_fit_generator_read_back_in_other_quotes_waits():
    # Keras 2's fit_generator is the fit the checkpoint writes during (ported to fit), and
    # 'best.h5' is the "best.h5" read back: one file, whatever quotes spell it.
    source = """\
        from tensorflow import keras
        from tensorflow.keras.callbacks import ModelCheckpoint

        model.compile(optimizer="adam", loss="mse")
        best = ModelCheckpoint('best.h5', monitor='loss', save_best_only=True)
        model.fit_generator(batches(), steps_per_epoch=10, epochs=1, callbacks=[best])
        model.load_weights("best.h5")
        model.load_weights("other.h5")
        """
    result = run(source)
    assert messages(result, ONLY) == [
        "sdp.barrier() before reading \"best.h5\": rank 0 alone writes it",
    ]
    assert 'sdp.barrier()\nmodel.load_weights("best.h5")\n' in result.output.decode()


def test_every_rank_waits_after_the_calls_of_a_helper_that_copies_on_rank0():
    # make_subset's copies run on rank 0 only; the folder it fills is listed next by every
    # rank: one barrier after the last of the calls in a row (none inside the helper).
    source = """\
        import os, shutil, pathlib
        import tensorflow as tf

        def make_subset(name, start, end):
            folder = pathlib.Path("small") / name
            os.makedirs(folder, exist_ok=True)
            for i in range(start, end):
                shutil.copyfile(f"all/{i}.jpg", folder / f"{i}.jpg")

        make_subset("train", 0, 100)
        make_subset("validation", 100, 150)
        train = tf.keras.utils.image_dataset_from_directory("small/train")
        model.compile(optimizer="adam", loss="mse")
        model.fit(train, epochs=1)
        """
    result = run(source)
    assert messages(result, ONLY) == [
        "sdp.barrier() after this: rank 0 alone copies the files it makes, which every rank "
        "may read next",
    ]
    code = result.output.decode()
    assert ('make_subset("validation", 100, 150)\nsdp.barrier()\n'
            'train = tf.keras.utils.image_dataset_from_directory') in code
    assert code.count("sdp.barrier()") == 1
    assert "if sdp.rank() == 0:\n            shutil.copyfile" in code
