from __future__ import annotations

from .helpers import check_noop, check_transformed, messages, run

ONLY = "guard_rank0_writes"

# A training step, so that the file is a training script; sdp is initialised already so that
# check_noop sees only this transform.
HEAD = """\
import torch
import sdp_runtime.torch as sdp

sdp.init()
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.ones(1, 2)).sum().backward()
opt.step()
"""


def guarded(result):
    return [(c.line, c.message) for c in result.changes if c.transform == ONLY and not c.manual]


def test_torch_save_and_consecutive_writes_share_one_guard():
    result = check_transformed(
        HEAD
        + """\
import json
import numpy as np

torch.save(model.state_dict(), "model.pt")
# the history too
with open("history.json", "w") as f:
    json.dump([1, 2], f)
print("saved")
np.save("losses.npy", np.zeros(3))
""",
        HEAD
        + """\
import json
import numpy as np

if sdp.rank() == 0:
    torch.save(model.state_dict(), "model.pt")
    # the history too
    with open("history.json", "w") as f:
        json.dump([1, 2], f)
print("saved")
if sdp.rank() == 0:
    np.save("losses.npy", np.zeros(3))
""",
        only=ONLY,
    )
    assert guarded(result) == [
        (12, "torch.save(...) runs on rank 0 only"),
        (14, 'open(..., "w") runs on rank 0 only'),
        (17, "np.save(...) runs on rank 0 only"),
    ]


def test_alias_imports_and_every_write_kind():
    check_transformed(
        HEAD
        + """\
from torch import save as torch_save
import pickle as pk
import shutil, os
import yaml
import matplotlib.pyplot as plt
from pathlib import Path

torch_save(model, "m.pt")
pk.dump(model, fh)
yaml.safe_dump({"a": 1}, fh)
shutil.copy("a.pt", "b.pt")
os.replace("a.tmp", "a.pt")
plt.savefig("loss.png")
Path("notes.txt").write_text("done")
df.to_csv("metrics.csv")
out = open("log.txt", mode="a")
""",
        HEAD
        + """\
from torch import save as torch_save
import pickle as pk
import shutil, os
import yaml
import matplotlib.pyplot as plt
from pathlib import Path

if sdp.rank() == 0:
    torch_save(model, "m.pt")
    pk.dump(model, fh)
    yaml.safe_dump({"a": 1}, fh)
    shutil.copy("a.pt", "b.pt")
    os.replace("a.tmp", "a.pt")
    plt.savefig("loss.png")
    Path("notes.txt").write_text("done")
    df.to_csv("metrics.csv")
out = open("log.txt", mode="a") if sdp.rank() == 0 else None
""",
        only=ONLY,
    )


def test_reads_prints_buffers_and_makedirs_stay_on_every_rank():
    check_noop(
        HEAD
        + """\
import io
import os
import yaml

os.makedirs("out", exist_ok=True)
with open("config.json") as f:
    config = f.read()
data = open("data.bin", "rb").read()
buf = io.BytesIO()
torch.save(model.state_dict(), buf)
text = yaml.dump({"a": 1})
summary = df.to_csv()
print("loss", 0.1)
""",
        only=ONLY,
    )


def test_already_guarded_writes_are_left_alone():
    check_noop(
        HEAD
        + """\
import torch.distributed as dist

if sdp.rank() == 0:
    torch.save(model, "a.pt")
if dist.get_rank() == 0:
    torch.save(model, "b.pt")
if not sdp.rank():
    torch.save(model, "c.pt")
writer = open("log.txt", "w") if sdp.rank() == 0 else None
""",
        only=ONLY,
    )


def test_write_inside_a_function_called_everywhere_is_guarded_inside():
    result = check_transformed(
        HEAD
        + """\
import os


def save_checkpoint(path):
    torch.save(model.state_dict(), path + ".tmp")
    os.replace(path + ".tmp", path)


def save_final():
    torch.save(model, "final.pt")


for epoch in range(3):
    save_checkpoint("ckpt.pt")
if sdp.rank() == 0:
    save_final()
""",
        HEAD
        + """\
import os


def save_checkpoint(path):
    if sdp.rank() == 0:
        torch.save(model.state_dict(), path + ".tmp")
        os.replace(path + ".tmp", path)


def save_final():
    torch.save(model, "final.pt")


for epoch in range(3):
    save_checkpoint("ckpt.pt")
if sdp.rank() == 0:
    save_final()
""",
        only=ONLY,
    )
    assert [line for line, _ in guarded(result)] == [13, 14]


def test_summary_writer_is_none_on_other_ranks_and_its_uses_are_guarded():
    result = check_transformed(
        HEAD
        + """\
from torch.utils.tensorboard import SummaryWriter


def log_metrics(w, step, value):
    w.add_scalar("loss", value, step)


writer = SummaryWriter("runs/exp")
for step in range(3):
    writer.add_scalar("lr", 0.1, step)
    log_metrics(writer, step, 0.5)
    if writer is not None:
        writer.flush()
writer.close()
""",
        HEAD
        + """\
from torch.utils.tensorboard import SummaryWriter


def log_metrics(w, step, value):
    if sdp.rank() == 0:
        w.add_scalar("loss", value, step)


writer = SummaryWriter("runs/exp") if sdp.rank() == 0 else None
for step in range(3):
    if sdp.rank() == 0:
        writer.add_scalar("lr", 0.1, step)
    log_metrics(writer, step, 0.5)
    if writer is not None:
        writer.flush()
if sdp.rank() == 0:
    writer.close()
""",
        only=ONLY,
    )
    assert [line for line, _ in guarded(result)] == [13, 16, 18, 22]
    assert guarded(result)[1][1] == (
        "SummaryWriter(...) on rank 0 only (writer is None on the other ranks)"
    )


def test_self_attribute_handle_in_a_class():
    check_transformed(
        HEAD
        + """\
import tensorboardX


class Trainer:
    def __init__(self):
        self.tb = tensorboardX.SummaryWriter()

    def log(self, step):
        self.tb.add_scalar("x", 1.0, step)
""",
        HEAD
        + """\
import tensorboardX


class Trainer:
    def __init__(self):
        self.tb = tensorboardX.SummaryWriter() if sdp.rank() == 0 else None

    def log(self, step):
        if sdp.rank() == 0:
            self.tb.add_scalar("x", 1.0, step)
""",
        only=ONLY,
    )


def test_open_handle_and_a_writer_made_from_it():
    check_transformed(
        HEAD
        + """\
import csv

log = open("metrics.csv", "w", newline="")
rows = csv.writer(log)
rows.writerow(["step", "loss"])
print("header written", file=log)
log.close()
""",
        HEAD
        + """\
import csv

log = open("metrics.csv", "w", newline="") if sdp.rank() == 0 else None
rows = csv.writer(log) if sdp.rank() == 0 else None
if sdp.rank() == 0:
    rows.writerow(["step", "loss"])
    print("header written", file=log)
    log.close()
""",
        only=ONLY,
    )


def test_with_open_around_training_guards_only_the_writes():
    result = check_transformed(
        HEAD
        + """\
with open("train.log", "a") as log:
    for step in range(3):
        loss = model(torch.ones(1, 2)).sum()
        loss.backward()
        opt.step()
        log.write(f"{loss.item()}\\n")
""",
        HEAD.replace("as sdp\n", "as sdp\nimport contextlib\n")
        + """\
with open("train.log", "a") if sdp.rank() == 0 else contextlib.nullcontext() as log:
    for step in range(3):
        loss = model(torch.ones(1, 2)).sum()
        loss.backward()
        opt.step()
        if sdp.rank() == 0:
            log.write(f"{loss.item()}\\n")
""",
        only=ONLY,
    )
    assert [line for line, _ in guarded(result)] == [9, 14]
    assert guarded(result)[0][1] == (
        'open(..., "a") on rank 0 only (contextlib.nullcontext() on the other ranks)'
    )


def test_one_line_if_is_guarded_whole():
    check_transformed(
        HEAD
        + """\
for epoch in range(3):
    if epoch % 2 == 0: torch.save(model, f"m{epoch}.pt")
""",
        HEAD
        + """\
for epoch in range(3):
    if sdp.rank() == 0:
        if epoch % 2 == 0: torch.save(model, f"m{epoch}.pt")
""",
        only=ONLY,
    )


def test_unsafe_spots_get_manual_notes():
    result = check_noop(
        HEAD
        + """\
import shutil

f = open(path, mode)
if torch.save(model, "x.pt") is None:
    pass
def save(): torch.save(model, "y.pt")
size = shutil.copy("a", "b")
print(size)


def make_log():
    out = open("log.txt", "w")
    return out
""",
        only=ONLY,
    )
    notes = [(c.line, c.message) for c in result.changes if c.manual]
    assert [line for line, _ in notes] == [11, 12, 14, 15, 20]
    assert "mode known only at run time" in notes[0][1]
    assert "it is in a condition" in notes[1][1]
    assert "shares its line with a def" in notes[2][1]
    # Every rank needs ``size``: never "run it on rank 0 only"; a cache goes first on rank 0.
    assert "every rank uses the name it assigns" in notes[3][1]
    assert "rank0_first()" in notes[3][1] and "make it run on rank 0 only" not in notes[3][1]
    assert notes[4][1].startswith('open(..., "w") writes on every rank, and its handle is used')
    assert "(`return out`)" in notes[4][1]


def test_idempotent():
    result = check_transformed(
        HEAD
        + """\
from torch.utils.tensorboard import SummaryWriter

writer = SummaryWriter()
with open("a.txt", "w") as f:
    f.write("x")
writer.add_scalar("a", 1.0, 0)
""",
        HEAD
        + """\
from torch.utils.tensorboard import SummaryWriter

writer = SummaryWriter() if sdp.rank() == 0 else None
if sdp.rank() == 0:
    with open("a.txt", "w") as f:
        f.write("x")
    writer.add_scalar("a", 1.0, 0)
""",
        only=ONLY,
    )
    again = check_noop(result.output.decode(), only=ONLY)
    assert messages(again, ONLY) == []


def test_rank_held_in_a_variable_counts_as_a_guard():
    check_noop(
        HEAD
        + """\
import torch.distributed as dist

rank = dist.get_rank()
args.rank = world_rank = sdp.rank()
if rank == 0:
    torch.save(model, "a.pt")
if 0 == world_rank:
    torch.save(model, "b.pt")
""",
        only=ONLY,
    )
    result = check_transformed(
        HEAD
        + """\
rank = compute_rank()
if rank == 0:
    torch.save(model, "a.pt")
""",
        HEAD
        + """\
rank = compute_rank()
if rank == 0:
    if sdp.rank() == 0:
        torch.save(model, "a.pt")
""",
        only=ONLY,
    )
    assert guarded(result) == [(11, "torch.save(...) runs on rank 0 only")]


TF_HEAD = """\
import numpy as np
import tensorflow as tf
import sdp_runtime.tensorflow as sdp

sdp.init()
model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
opt = tf.keras.optimizers.SGD(0.1)
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(model(tf.ones((1, 2))))
tape = sdp.DistributedGradientTape(tape)
opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
"""


def test_tensorflow_saves_checkpoints_and_summary_writer():
    result = check_transformed(
        TF_HEAD
        + """\
ckpt = tf.train.Checkpoint(model=model, optimizer=opt)
manager = tf.train.CheckpointManager(ckpt, "ckpts", max_to_keep=2)
ckpt.restore(manager.latest_checkpoint)
writer = tf.summary.create_file_writer("logs")
with writer.as_default():
    tf.summary.scalar("loss", loss, step=0)
manager.save()
ckpt.save("ckpt/model")
model.save("model.keras")
model.save_weights("final.weights.h5")
tf.saved_model.save(model, "exported")
np.save("loss.npy", np.zeros(1))
print(ckpt.restore("ckpt/model-1"))
""",
        TF_HEAD
        + """\
ckpt = tf.train.Checkpoint(model=model, optimizer=opt)
manager = tf.train.CheckpointManager(ckpt, "ckpts", max_to_keep=2)
ckpt.restore(manager.latest_checkpoint)
writer = tf.summary.create_file_writer("logs") if sdp.rank() == 0 else tf.summary.create_noop_writer()
with writer.as_default():
    tf.summary.scalar("loss", loss, step=0)
if sdp.rank() == 0:
    manager.save()
    ckpt.save("ckpt/model")
    model.save("model.keras")
    model.save_weights("final.weights.h5")
    tf.saved_model.save(model, "exported")
    np.save("loss.npy", np.zeros(1))
print(ckpt.restore("ckpt/model-1"))
""",
        only=ONLY,
    )
    assert [m for _, m in guarded(result)] == [
        "tf.summary.create_file_writer(...) on rank 0 only (tf.summary.create_noop_writer() on "
        "the others)",
        "manager.save(...) runs on rank 0 only",
        "ckpt.save(...) runs on rank 0 only",
        "model.save(...) runs on rank 0 only",
        "model.save_weights(...) runs on rank 0 only",
        "tf.saved_model.save(...) runs on rank 0 only",
        "np.save(...) runs on rank 0 only",
    ]


def test_tensorflow_writes_already_on_rank0_are_left_alone():
    check_noop(
        TF_HEAD
        + """\
if sdp.rank() == 0:
    model.save_weights("final.weights.h5")
writer = tf.summary.create_file_writer("logs") if sdp.rank() == 0 else tf.summary.create_noop_writer()
""",
        only=ONLY,
    )


def test_image_writers_trackers_and_pil_saves_are_writes():
    """Issue 18: dcgan's save_image, PIL saves and experiment trackers ran on every rank."""
    from .helpers import run

    result = run(
        """\
        import mlflow
        import torch
        import torchvision.utils as vutils
        import wandb
        from PIL import Image

        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        wandb.init(project="p")
        with mlflow.start_run():
            for x, y in loader:
                optimizer.zero_grad()
                loss_fn(model(x), y).backward()
                optimizer.step()
                wandb.log({"loss": 1.0})
                mlflow.log_metric("loss", 1.0)
            vutils.save_image(fake, "samples.png", normalize=True)
        img = Image.fromarray(grid).convert("RGB")
        img.save("grid.png")
        other.save("not_an_image")
        """,
        "guard_rank0_writes",
    )
    code = result.output.decode()
    assert 'if sdp.rank() == 0:\n    wandb.init(project="p")' in code
    assert "with mlflow.start_run() if sdp.rank() == 0 else contextlib.nullcontext():" in code
    assert 'if sdp.rank() == 0:\n            wandb.log({"loss": 1.0})\n            mlflow.log_metric' in code
    assert 'if sdp.rank() == 0:\n        vutils.save_image(fake, "samples.png"' in code
    assert 'if sdp.rank() == 0:\n    img.save("grid.png")' in code
    assert '\nother.save("not_an_image")' in code


def test_writes_into_a_temporary_directory_of_the_process_stay_on_every_rank():
    from .helpers import run

    result = run(
        """\
        import os
        import tempfile

        import torch

        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loss_fn(model(x), y).backward()
        optimizer.step()
        with tempfile.TemporaryDirectory() as tmp:
            torch.save(model.state_dict(), os.path.join(tmp, "m.pt"))
        """,
        "guard_rank0_writes",
    )
    assert "rank() == 0" not in result.output.decode()


# -- deletions: rank 0 deletes, every rank waits for it -------------------------------------------


def test_deletion_under_an_existence_test_goes_to_rank0_with_it_then_a_barrier():
    # dragen1860 conv_train.py: checkpoint.restore on another rank must not find the old files.
    result = check_transformed(
        HEAD
        + """\
import os
import shutil

MODEL_DIR = "/tmp/mnist"


def apply_clean():
    if os.path.exists(MODEL_DIR):
        print("Removing existing model dir")
        shutil.rmtree(MODEL_DIR)


apply_clean()
os.makedirs(MODEL_DIR)
""",
        HEAD
        + """\
import os
import shutil

MODEL_DIR = "/tmp/mnist"


def apply_clean():
    if sdp.rank() == 0:
        if os.path.exists(MODEL_DIR):
            print("Removing existing model dir")
            shutil.rmtree(MODEL_DIR)
    sdp.barrier()


apply_clean()
os.makedirs(MODEL_DIR)
""",
        ONLY,
    )
    assert any("then sdp.barrier()" in m for m in messages(result, ONLY, manual=False))


def test_consecutive_deletions_share_one_guard_and_one_barrier():
    check_transformed(
        HEAD
        + """\
import glob
import os
import shutil
from pathlib import Path

shutil.rmtree("logs", ignore_errors=True)
for f in glob.glob("ckpt/*.pt"):
    os.remove(f)
Path("stale.lock").unlink(missing_ok=True)
os.rmdir("empty")
print("clean")
""",
        HEAD
        + """\
import glob
import os
import shutil
from pathlib import Path

if sdp.rank() == 0:
    shutil.rmtree("logs", ignore_errors=True)
    for f in glob.glob("ckpt/*.pt"):
        os.remove(f)
    Path("stale.lock").unlink(missing_ok=True)
    os.rmdir("empty")
sdp.barrier()
print("clean")
""",
        ONLY,
    )


def test_tf_gfile_rmtree_is_guarded_with_a_barrier():
    check_transformed(
        """\
import tensorflow as tf
import sdp_runtime.tensorflow as sdp

sdp.init()
model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
opt = tf.keras.optimizers.SGD(0.1)
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(model(tf.ones((1, 2))))
opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
if tf.io.gfile.exists("/tmp/model"):
    tf.io.gfile.rmtree("/tmp/model")
tf.io.gfile.remove("/tmp/old.index")
""",
        """\
import tensorflow as tf
import sdp_runtime.tensorflow as sdp

sdp.init()
model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
opt = tf.keras.optimizers.SGD(0.1)
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(model(tf.ones((1, 2))))
opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
if sdp.rank() == 0:
    if tf.io.gfile.exists("/tmp/model"):
        tf.io.gfile.rmtree("/tmp/model")
    tf.io.gfile.remove("/tmp/old.index")
sdp.barrier()
""",
        ONLY,
    )


def test_deletion_in_a_loop_gets_no_barrier_the_ranks_may_not_all_get_there():
    result = check_transformed(
        HEAD
        + """\
import os

for epoch in range(3):
    if epoch > 0 and os.path.exists(f"ckpt{epoch - 1}.pt"):
        os.remove(f"ckpt{epoch - 1}.pt")
""",
        HEAD
        + """\
import os

for epoch in range(3):
    if sdp.rank() == 0:
        if epoch > 0 and os.path.exists(f"ckpt{epoch - 1}.pt"):
            os.remove(f"ckpt{epoch - 1}.pt")
""",
        ONLY,
    )
    assert any("no barrier" in m for m in messages(result, ONLY, manual=False))


def test_existence_test_that_binds_a_name_used_later_stays_and_the_deletion_alone_is_guarded():
    # ``found`` is read after the ``if``: the test cannot go to rank 0, so no barrier either
    # (another rank could skip the branch and never reach it).
    check_transformed(
        HEAD
        + """\
import os

found = False
if os.path.exists("old.pt"):
    os.remove("old.pt")
    found = True
print(found)
""",
        HEAD
        + """\
import os

found = False
if os.path.exists("old.pt"):
    if sdp.rank() == 0:
        os.remove("old.pt")
    found = True
print(found)
""",
        ONLY,
    )


def test_deletions_in_a_private_temporary_directory_stay_on_every_rank():
    check_noop(
        HEAD
        + """\
import shutil
import tempfile
from pathlib import Path

tmp = tempfile.mkdtemp()
(Path(tmp) / "x.pt").unlink()
shutil.rmtree(tmp)
""",
        ONLY,
    )


def test_deletion_already_on_rank0_is_left_alone():
    check_noop(
        HEAD
        + """\
import shutil

if sdp.rank() == 0:
    shutil.rmtree("logs")
sdp.barrier()
""",
        ONLY,
    )


def test_a_write_that_calls_the_wrapped_model_is_not_moved_onto_rank_0():
    # On rank 0 alone, a DDP model's forward (BatchNorm buffers) waits for the others: a hang.
    source = """\
        import torch

        def main():
            model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for x in loader:
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
            with open("preds.txt", "w") as f:
                f.write(str(model(probe).tolist()))
            torch.save(model.state_dict(), "m.pt")
        """
    result = run(source)
    out = result.output.decode()
    assert '    with open("preds.txt", "w") as f:\n        f.write(' in out
    assert '    if sdp.rank() == 0:\n        torch.save(model.state_dict(), "m.pt")' in out
    [note] = [m for m in messages(result, "guard_rank0_writes", manual=True)]
    assert "also calls model(...), which every rank must run together" in note


def test_a_tokenizers_save_is_a_write_and_another_objects_save_is_not():
    """Issue 30: ``tokenizer.save("tokenizer.json")`` of a Hugging Face tokenizers tokenizer ran
    on every rank (``save`` is no write of its own in a PyTorch script)."""
    from .helpers import run

    result = run(
        """\
        import torch
        from tokenizers import Tokenizer
        from tokenizers.models import BPE

        tokenizer = Tokenizer(BPE(unk_token="[UNK]"))
        tokenizer.train(["corpus.txt"])
        tokenizer.save("tokenizer.json")
        loaded = Tokenizer.from_file("tokenizer.json")
        loaded.save("copy.json")
        scaler.save("not_a_tokenizer")
        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
        """,
        "guard_rank0_writes",
    )
    code = result.output.decode()
    assert 'if sdp.rank() == 0:\n    tokenizer.save("tokenizer.json")\n' in code
    assert 'if sdp.rank() == 0:\n    loaded.save("copy.json")\n' in code
    assert '\nscaler.save("not_a_tokenizer")\n' in code


def test_image_writers_of_the_field_are_writes():
    # unet-keras data.py: saveResult's skimage.io.imsave wrote the result images on every rank.
    check_transformed(
        HEAD
        + """\
import skimage.io as io
import imageio
import cv2

io.imsave("mask.png", img)
imageio.imwrite("a.png", img)
cv2.imwrite("b.png", img)
""",
        HEAD
        + """\
import skimage.io as io
import imageio
import cv2

if sdp.rank() == 0:
    io.imsave("mask.png", img)
    imageio.imwrite("a.png", img)
    cv2.imwrite("b.png", img)
""",
        only=ONLY,
    )


def test_keras_plot_model_writes_its_picture_on_rank_0_only():
    # plot_model writes model.png (its to_file default) with no path given too.
    result = run(
        """\
        import numpy as np
        from tensorflow import keras

        inputs = keras.Input(shape=(8,))
        model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
        keras.utils.plot_model(model, "model.png", show_shapes=True)
        keras.utils.plot_model(model)
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
        model.fit(np.zeros((64, 8)), np.zeros((64, 1)), batch_size=16)
        """,
        ONLY,
    )
    assert (
        '    keras.utils.plot_model(model, "model.png", show_shapes=True)\n'
        "    keras.utils.plot_model(model)\n" in result.output.decode()
    )
    assert messages(result, ONLY) == ["keras.utils.plot_model(...) runs on rank 0 only"] * 2
