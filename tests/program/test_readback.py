"""program.readback: the paths of writes and reads, and files private to one process."""

from __future__ import annotations

import libcst.matchers as m
from sdp_convert.program.readback import (
    checkpoint_fits,
    is_barrier,
    is_private_temp,
    read_path,
    writes_private_temp,
    written_path,
)

from .helpers import code, find, probe

HEAD = "import io, os, pickle, shutil, tempfile\nimport numpy as np\nimport torch\n"


def _written(source: str, text: str, framework: str = "torch") -> str | None:
    t = probe(HEAD + source)
    return written_path(t, find(t, m.Call(), text), framework)


def _read(source: str, text: str, framework: str = "torch") -> str | None:
    t = probe(HEAD + source)
    return read_path(t, find(t, m.Call(), text), framework)


def test_the_path_of_a_write():
    assert _written('torch.save(m, "a.pt")\n', 'torch.save(m, "a.pt")') == '"a.pt"'
    assert _written("torch.save(m, f=args.out)\n", "torch.save(m, f=args.out)") == "args.out"
    assert _written('open(p, "wb")\n', 'open(p, "wb")') == "p"
    assert _written('np.save(os.path.join(d, "x"), a)\n', 'np.save(os.path.join(d, "x"), a)') == (
        'os.path.join(d, "x")'
    )


def test_what_is_no_write_to_a_path():
    assert _written('open(p, "r")\n', 'open(p, "r")') is None
    assert _written("buf = io.BytesIO()\ntorch.save(m, buf)\n", "torch.save(m, buf)") is None
    # torch.save(m, f) into ``with open(p, "wb") as f``: the opening names the path
    source = 'with open(p, "wb") as f:\n    torch.save(m, f)\n'
    assert _written(source, "torch.save(m, f)") is None
    assert _written(source, 'open(p, "wb")') == "p"


def test_framework_methods_and_the_checkpoint_manager():
    assert _written('model.save_weights("w.h5")\n', 'model.save_weights("w.h5")', "tensorflow") == (
        '"w.h5"'
    )
    assert _written("manager.save()\n", "manager.save()", "tensorflow") == (
        "manager.latest_checkpoint"
    )
    assert _written('model.save("w.h5")\n', 'model.save("w.h5")', "torch") is None


def test_the_path_of_a_read():
    assert _read('torch.load("a.pt")\n', 'torch.load("a.pt")') == '"a.pt"'
    assert _read("open(args.save)\n", "open(args.save)") == "args.save"
    assert _read('open(p, "rb")\n', 'open(p, "rb")') == "p"
    assert _read('open(p, "a")\n', 'open(p, "a")') is None
    assert _read('np.load("x.npy")\n', 'np.load("x.npy")') == '"x.npy"'
    tf = "tensorflow"
    assert _read('model.load_weights("w.h5")\n', 'model.load_weights("w.h5")', tf) == '"w.h5"'
    assert _read("ckpt.restore(manager.latest_checkpoint)\n",
                 "ckpt.restore(manager.latest_checkpoint)", tf) == "manager.latest_checkpoint"
    source = 'with open(p, "rb") as f:\n    torch.load(f)\n'
    assert _read(source, "torch.load(f)") is None


def test_private_temporary_directories():
    t = probe(HEAD + 'tmp = tempfile.mkdtemp()\npath = os.path.join(tmp, "m.pt")\n'
              "torch.save(m, path)\nshutil.copy(path, 'out.pt')\nshutil.copy('out.pt', path)\n")
    assert writes_private_temp(t, find(t, m.Call(), "torch.save(m, path)"), "torch")
    assert not writes_private_temp(t, find(t, m.Call(), "shutil.copy(path, 'out.pt')"), "torch")
    assert writes_private_temp(t, find(t, m.Call(), "shutil.copy('out.pt', path)"), "torch")
    t = probe(HEAD + 'with tempfile.TemporaryDirectory() as d:\n    np.save(f"{d}/a.npy", x)\n'
              'np.save("b.npy", x)\n')
    assert writes_private_temp(t, find(t, m.Call(), 'np.save(f"{d}/a.npy", x)'), "torch")
    assert not writes_private_temp(t, find(t, m.Call(), 'np.save("b.npy", x)'), "torch")
    t = probe(HEAD + 'd = tempfile.gettempdir()\nnp.save(d + "/a.npy", x)\n')
    # gettempdir() is shared by every process on the machine: not private
    assert not is_private_temp(t, find(t, m.BinaryOperation()))


def test_barrier_statements():
    t = probe(HEAD + "import sdp_runtime.torch as sdp\nsdp.barrier()\nsdp.rank()\n")
    statements = t.module.body
    assert is_barrier(t, statements[-2]) and not is_barrier(t, statements[-1])


def test_the_fits_a_checkpoint_callback_writes_during():
    t = probe("""
        from tensorflow.keras.callbacks import ModelCheckpoint

        def make_callbacks(weights, logs):
            return [ModelCheckpoint(filepath=weights)]

        def train(cfg):
            callbacks = make_callbacks(cfg["weights"], cfg["logs"])
            model.fit_generator(gen, callbacks=callbacks)
            model.fit(x, callbacks=[ModelCheckpoint("best.h5")])

        def other(path):
            path = path + ".h5"
            cb = ModelCheckpoint(filepath=path)
        """)
    # Made in a factory: the caller's argument, at the first fit (a Keras 2 fit_generator too).
    factory = find(t, m.Call(), "ModelCheckpoint(filepath=weights)")
    fits = checkpoint_fits(t, factory, factory.args[0].value)
    assert [(code(t, f), p) for f, p in fits] == [
        ("model.fit_generator(gen, callbacks=callbacks)", 'cfg["weights"]')]
    direct = find(t, m.Call(), 'ModelCheckpoint("best.h5")')
    assert [p for _, p in checkpoint_fits(t, direct, direct.args[0].value)] == ['"best.h5"']
    # A parameter rebound in the function is not the caller's argument: nothing followed.
    rebound = find(t, m.Call(), "ModelCheckpoint(filepath=path)")
    assert checkpoint_fits(t, rebound, rebound.args[0].value) == []
