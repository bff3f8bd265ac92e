"""File-writing APIs as data: calls, methods, openers and handles that write files, per
framework, with where their destination argument is (it may be an in-memory buffer)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from .scopes import assigned_values

if TYPE_CHECKING:
    from .model import FileModel

# Calls that write a file, with where their destination is (positional index, keyword) when it
# may be an in-memory buffer. Generic Python here; frameworks add theirs in FRAMEWORK_WRITES.
# Deletions (``shutil.rmtree``, ``os.remove``, ...) are ``program.deletions``'s.
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
    "os.rename": None,
    "os.replace": None,
    "matplotlib.pyplot.savefig": (0, "fname"),
    "matplotlib.pyplot.imsave": (0, "fname"),
    "joblib.dump": (1, "filename"),
    "imageio.imwrite": (0, "uri"),
    "imageio.imsave": (0, "uri"),
    "imageio.v2.imwrite": (0, "uri"),
    "imageio.v3.imwrite": (0, "uri"),
    "cv2.imwrite": None,
    "skimage.io.imsave": (0, "fname"),
    "scipy.io.savemat": (0, "file_name"),
    "scipy.io.wavfile.write": (0, "filename"),
    "soundfile.write": (0, "file"),
    # Experiment trackers: one run, logged once, by rank 0.
    "wandb.log": None,
    "wandb.save": None,
    "wandb.log_artifact": None,
    "mlflow.log_metric": None,
    "mlflow.log_metrics": None,
    "mlflow.log_param": None,
    "mlflow.log_params": None,
    "mlflow.log_artifact": None,
    "mlflow.log_artifacts": None,
    "mlflow.log_dict": None,
    "mlflow.log_figure": None,
    "mlflow.log_image": None,
    "mlflow.log_text": None,
    "mlflow.set_tag": None,
    "mlflow.set_tags": None,
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
    "torch": {
        "torch.save": (1, "f"),
        "torch.jit.save": (1, "f"),
        "torch.onnx.export": (2, "f"),
        "torchvision.utils.save_image": (1, "fp"),
        "torchvision.io.write_png": (1, "filename"),
        "torchvision.io.write_jpeg": (1, "filename"),
        "torchvision.io.write_video": (0, "filename"),
        "torchaudio.save": (0, "uri"),
        "mlflow.pytorch.log_model": None,
        "mlflow.pytorch.save_model": None,
    },
    "tensorflow": {
        "tensorflow.saved_model.save": None,
        "tensorflow.keras.models.save_model": None,
        "tensorflow.keras.saving.save_model": None,
        "keras.models.save_model": None,
        "keras.saving.save_model": None,
        "tensorflow.io.write_file": None,
        # ``to_file`` defaults to "model.png": it writes without the argument too.
        "tensorflow.keras.utils.plot_model": (1, "to_file"),
        "keras.utils.plot_model": (1, "to_file"),
        "mlflow.tensorflow.log_model": None,
        "mlflow.keras.log_model": None,
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
HANDLES = ("tensorboardX.SummaryWriter", "wandb.init", "mlflow.start_run")


FRAMEWORK_HANDLES: dict[str, tuple[str, ...]] = {
    "torch": (
        "torch.utils.tensorboard.SummaryWriter",
        "torch.utils.tensorboard.writer.SummaryWriter",
    ),
    "tensorflow": ("tensorflow.summary.create_file_writer",),
}


# Calls whose files the converter cannot see: a logging configuration read at run time may add
# file handlers (``RotatingFileHandler``, ``FileHandler``), on every rank that runs it.
UNSEEN_WRITES = ("logging.config.dictConfig", "logging.config.fileConfig")


def handle_names() -> frozenset[str]:
    """The last names of the handles that write files (``SummaryWriter``): what a call of a
    module picked at run time (``importlib.import_module(name).SummaryWriter(d)``) may make."""
    names = (*HANDLES, *(h for hs in FRAMEWORK_HANDLES.values() for h in hs))
    return frozenset(n.rsplit(".", 1)[-1] for n in names)


def is_mode(text: str) -> bool:
    """``"wt"``, ``"rb"``, ``"a+"``: a file mode, not a path (``Image.open("a.png")``)."""
    return 0 < len(text) <= 4 and all(c in "rwaxbtU+" for c in text)


# Handles whose library has a do-nothing twin with the same methods (given to the other ranks).
NOOP_TWINS = {"tensorflow.summary.create_file_writer": "create_noop_writer"}


MEMORY_BUFFERS = ("io.BytesIO", "io.StringIO")


# Calls a rank must not skip: the others would wait for it.
COLLECTIVE_PREFIXES = ("sdp_runtime", "torch.distributed")


def in_memory(fm: FileModel, arg: cst.Arg | None) -> bool:
    if arg is None:
        return False
    values = [arg.value]
    if isinstance(arg.value, cst.Name):
        values = assigned_values(fm, arg.value)
    return any(
        isinstance(v, cst.Call) and fm.refers_to(v.func, *MEMORY_BUFFERS) for v in values
    )


def noop_twin(call: cst.Call, names: set[str]) -> cst.Call | None:
    """``tf.summary.create_noop_writer()`` for ``tf.summary.create_file_writer(...)`` (``names``:
    the call's qualified names): what the other ranks get instead of a writer."""
    twin = next((NOOP_TWINS[n] for n in names if n in NOOP_TWINS), None)
    if twin is None or not isinstance(call.func, cst.Attribute):
        return None
    return cst.Call(func=call.func.with_changes(attr=cst.Name(twin)))


def module_function_call(fm: FileModel, call: cst.Call) -> bool:
    """``x.save()`` where ``x.save`` resolves to a function of an imported module (``np.save``,
    ``torch.save``), not a method of an object: the write tables decide about those."""
    roots = {i.split(".")[0] for i in fm.info.imports}
    return any(n.split(".")[0] in roots for n in fm.qualified_names(call.func))


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


def writes_in(mode: str) -> bool:
    """Whether a file opened in ``mode`` is written: ``w``, ``a``, ``x``, or ``+`` (``r+``)."""
    return any(c in mode for c in "wax+")


#: Calls making an object whose ``save(path)`` writes a file: a PIL image (``Image.fromarray``,
#: ``to_pil_image``, SciPy's old ``scipy.misc.toimage``), a Hugging Face ``tokenizers`` tokenizer
#: (``Tokenizer(BPE())``, ``Tokenizer.from_file(p)``).
SAVING_OBJECTS = ("PIL.Image.", "torchvision.transforms.functional.to_pil_image",
                  "scipy.misc.toimage", "scipy.misc.pilutil.toimage", "tokenizers.")


def object_saves(fm: FileModel) -> list[cst.Call]:
    """``<object>.save(path)`` of a PIL image or a tokenizer made in this file
    (``Image.fromarray(a)``, ``Image.open(p).convert("RGB")``, ``to_pil_image(t)``,
    ``Tokenizer(BPE(unk_token="[UNK]"))``)."""
    found = []
    for call in fm.method_calls("save"):
        func = call.func
        if not (isinstance(func, cst.Attribute) and call.args):
            continue
        receiver = func.value
        values = assigned_values(fm, receiver) if isinstance(receiver, cst.Name) else [receiver]
        if values and all(_makes_saving_object(fm, v) for v in values):
            found.append(call)
    return found


def _makes_saving_object(fm: FileModel, value: cst.BaseExpression) -> bool:
    # ``Image.open(p).convert("RGB").resize(...)``: the innermost call of the chain decides.
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and isinstance(
        value.func.value, cst.Call
    ):
        value = value.func.value
    if not isinstance(value, cst.Call):
        return False
    names = fm.qualified_names(value.func)
    return any(n.startswith(p) or n == p for n in names for p in SAVING_OBJECTS)


def describe_write(fm: FileModel, node: cst.CSTNode) -> str:
    """How the report names a write: ``torch.save(...)``, ``open(..., "w")``, or the first line
    of a statement."""
    if isinstance(node, cst.Call):
        func = fm.code(node.func)
        if fm.refers_to(node.func, *OPENERS):
            mode = argument(node, 1, "mode")
            if mode is not None:
                return f"{func}(..., {fm.code(mode.value)})"
        return f"{func}(...)"
    return fm.code(node).strip().splitlines()[0]


def use_message(fm: FileModel, stmt: cst.CSTNode, holder: str) -> str:
    """The report's line for a use of a rank-0-only handle ``holder`` guarded at ``stmt``."""
    head = fm.code(stmt).strip().splitlines()[0]
    if len(head) > 60:
        head = head[:57] + "..."
    return f"{head} runs on rank 0 only ({holder} exists there only)"
