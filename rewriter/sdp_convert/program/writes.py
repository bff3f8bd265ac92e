"""File-writing APIs as data: calls, methods, openers and handles that write files, per
framework, with where their destination argument is (it may be an in-memory buffer)."""

from __future__ import annotations

import libcst as cst

from ..base import Transform
from .scopes import assigned_values

# Calls that write a file, with where their destination is (positional index, keyword) when it
# may be an in-memory buffer. Generic Python here; frameworks add theirs in FRAMEWORK_WRITES.
WRITES: dict[str, tuple[int, str] | None] = {
    "json.dump": (1, "fp"),
    "pickle.dump": (1, "file"),
    "numpy.save": (0, "file"),
    "numpy.savez": (0, "file"),
    "numpy.savez_compressed": (0, "file"),
    "numpy.savetxt": (0, "fname"),
    "shutil.copy": None,
    "shutil.copy2": None,
    "shutil.copyfile": None,
    "shutil.copytree": None,
    "shutil.move": None,
    "shutil.rmtree": None,
    "os.remove": None,
    "os.unlink": None,
    "os.rename": None,
    "os.replace": None,
    "matplotlib.pyplot.savefig": (0, "fname"),
}


# Writes only when given a stream (without one they return a string).
STREAM_WRITES: dict[str, tuple[int, str]] = {
    "yaml.dump": (1, "stream"),
    "yaml.safe_dump": (1, "stream"),
    "yaml.dump_all": (1, "stream"),
    "yaml.safe_dump_all": (1, "stream"),
}


# ``<object>.<method>(destination, ...)``: the object's type is unknown, the method name is telling.
METHOD_WRITES = (
    "savefig",
    "write_text",
    "write_bytes",
    "to_csv",
    "to_json",
    "to_parquet",
    "to_pickle",
    "save_pretrained",
)


FRAMEWORK_WRITES: dict[str, dict[str, tuple[int, str] | None]] = {
    "torch": {"torch.save": (1, "f"), "torch.jit.save": (1, "f"), "torch.onnx.export": (2, "f")},
    "tensorflow": {
        "tensorflow.saved_model.save": None,
        "tensorflow.keras.models.save_model": None,
        "tensorflow.keras.saving.save_model": None,
        "keras.models.save_model": None,
        "keras.saving.save_model": None,
        "tensorflow.io.write_file": None,
    },
}


# Methods that write in a script of that framework, whatever the object: ``model.save(path)``,
# ``model.save_weights(path)``, ``checkpoint.save(prefix)``, ``manager.save()`` (no argument).
FRAMEWORK_METHOD_WRITES: dict[str, tuple[str, ...]] = {
    "torch": (),
    "tensorflow": ("save", "save_weights"),
}


# Calls opening a file: (default mode, position of the mode argument).
OPENERS: dict[str, tuple[str, int]] = {
    "builtins.open": ("r", 1),
    "io.open": ("r", 1),
    "codecs.open": ("r", 1),
    "gzip.open": ("rb", 1),
    "bz2.open": ("rb", 1),
    "lzma.open": ("rb", 1),
}


# Objects that write files as they are used (a handle, like an open file).
HANDLES = ("tensorboardX.SummaryWriter",)


FRAMEWORK_HANDLES: dict[str, tuple[str, ...]] = {
    "torch": (
        "torch.utils.tensorboard.SummaryWriter",
        "torch.utils.tensorboard.writer.SummaryWriter",
    ),
    "tensorflow": ("tensorflow.summary.create_file_writer",),
}


# Handles whose library has a do-nothing twin with the same methods (given to the other ranks).
NOOP_TWINS = {"tensorflow.summary.create_file_writer": "create_noop_writer"}


MEMORY_BUFFERS = ("io.BytesIO", "io.StringIO")


# Calls a rank must not skip: the others would wait for it.
COLLECTIVE_PREFIXES = ("sdp_runtime", "torch.distributed")


def in_memory(t: Transform, arg: cst.Arg | None) -> bool:
    if arg is None:
        return False
    values = [arg.value]
    if isinstance(arg.value, cst.Name):
        values = assigned_values(t, arg.value)
    return any(
        isinstance(v, cst.Call) and t.refers_to(v.func, *MEMORY_BUFFERS) for v in values
    )


def argument(call: cst.Call, position: int, keyword: str) -> cst.Arg | None:
    positional = [a for a in call.args if a.keyword is None and not a.star]
    if position < len(positional):
        return positional[position]
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == keyword:
            return arg
    return None


def open_mode(call: cst.Call, default: str, position: int) -> str | None:
    """The mode string of an ``open``-like call; None when it is not a literal."""
    arg = argument(call, position, "mode")
    if arg is None:
        return None if any(a.star for a in call.args) else default
    if isinstance(arg.value, cst.SimpleString):
        value = arg.value.evaluated_value
        return value if isinstance(value, str) else None
    return None
