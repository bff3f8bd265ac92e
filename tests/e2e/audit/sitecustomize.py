"""Put on PYTHONPATH by the e2e tests: logs which process writes which file of its run directory.

Python imports ``sitecustomize`` at start-up in every process of a run (the launcher and each rank
alike). When ``SDP_E2E_AUDIT`` names a directory, each process appends one line per distinct file it
writes under its working directory to ``SDP_E2E_AUDIT/writes.<pid>.log``::

    <RANK or ->\t<how>\t<path relative to the working directory>

``how`` is ``open`` (the interpreter's ``open`` audit event with a writing mode, which covers
``open(..., "w")``, ``json.dump`` to such a file, ``np.save``...) or ``torch.save`` (which writes
through C++ for a path, so it is wrapped when ``torch.serialization`` is first imported). Files
that TensorFlow and HDF5 write from C++ are noted where Python asks for them, as their modules are
first imported: ``h5py`` (``h5py.File`` opened to write: Keras ``save_weights``, ``.h5`` models),
``tf.train.Checkpoint`` (``<prefix>.index`` of each checkpoint written), ``CheckpointManager``'s
state file (``<directory>/checkpoint``) and ``tf.summary.create_file_writer`` (its log directory).
Nothing else changes: the calls go through unmodified.

When ``SDP_E2E_GPU_LOG`` names a file, each process that used CUDA appends one JSON line to it as
it exits: its RANK, the CUDA device it ran on, the most GPU memory it allocated and the
torch.distributed backend it used (the GPU runs of ``test_gpu_runs.py`` read it).
"""

from __future__ import annotations

import functools
import importlib.machinery
import os
import sys

_LOG_DIR = os.environ.get("SDP_E2E_AUDIT")


class _WrapOnImport:
    """Runs ``wrappers[name](module)`` once the module ``name`` has been executed."""

    def __init__(self, wrappers):  # type: ignore[no-untyped-def]
        self.wrappers = wrappers

    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        wrap = self.wrappers.get(name)
        if wrap is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_wrap(module):  # type: ignore[no-untyped-def]
            exec_module(module)
            wrap(module)

        spec.loader.exec_module = exec_and_wrap  # type: ignore[method-assign]
        return spec


def _install(log_dir: str) -> None:
    root = os.getcwd()
    log_file = os.path.join(log_dir, f"writes.{os.getpid()}.log")
    seen: set[tuple[str, str]] = set()
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT

    def note(how: str, path: object) -> None:
        try:
            full = os.path.abspath(os.fspath(path))  # type: ignore[arg-type]
        except TypeError:
            return
        if not full.startswith(root + os.sep) or "__pycache__" in full:
            return  # also keeps the log's own writes (outside root) from recursing
        rel = os.path.relpath(full, root)
        if (how, rel) in seen:
            return
        seen.add((how, rel))
        with open(log_file, "a") as f:
            f.write(f"{os.environ.get('RANK', '-')}\t{how}\t{rel}\n")

    def hook(event: str, args: tuple) -> None:
        if event != "open" or isinstance(args[0], int):
            return
        path, mode, flags = args
        writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool(
            isinstance(flags, int) and flags & write_flags
        )
        if writes:
            note("open", path)

    class WrapTorchSave:
        """Finds ``torch.serialization`` like the path finder does and wraps its ``save``."""

        def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
            if name != "torch.serialization":
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return spec
            exec_module = spec.loader.exec_module

            def exec_and_wrap(module):  # type: ignore[no-untyped-def]
                exec_module(module)
                save = module.save

                @functools.wraps(save)
                def audited_save(obj, f, *args, **kwargs):  # type: ignore[no-untyped-def]
                    if isinstance(f, (str, os.PathLike)):
                        note("torch.save", f)
                    return save(obj, f, *args, **kwargs)

                module.save = audited_save

            spec.loader.exec_module = exec_and_wrap  # type: ignore[method-assign]
            return spec

    def wrap_h5py_file(module):  # type: ignore[no-untyped-def]
        init = module.File.__init__

        @functools.wraps(init)
        def audited_init(self, name, mode="r", *args, **kwargs):  # type: ignore[no-untyped-def]
            if isinstance(name, (str, os.PathLike)) and mode in ("w", "w-", "x", "a", "r+"):
                note("h5py", name)
            return init(self, name, mode, *args, **kwargs)

        module.File.__init__ = audited_init

    def wrap_tf_checkpoint(module):  # type: ignore[no-untyped-def]
        for name in ("Checkpoint", "CheckpointV1"):
            cls = getattr(module, name, None)
            if cls is None or not hasattr(cls, "_write"):
                continue

            def audited_write(self, file_prefix, *args, _write=cls._write, **kwargs):  # type: ignore[no-untyped-def]
                path = _write(self, file_prefix, *args, **kwargs)
                prefix = path if isinstance(path, (str, bytes)) else file_prefix
                if isinstance(prefix, (str, bytes, os.PathLike)):
                    note("tf.train.Checkpoint", os.fsdecode(prefix) + ".index")
                return path

            cls._write = functools.wraps(cls._write)(audited_write)

    def wrap_tf_checkpoint_state(module):  # type: ignore[no-untyped-def]
        update = module.update_checkpoint_state_internal

        @functools.wraps(update)
        def audited_update(save_dir, *args, **kwargs):  # type: ignore[no-untyped-def]
            latest = kwargs.get("latest_filename") or "checkpoint"
            note("tf.train.CheckpointManager", os.path.join(os.fsdecode(save_dir), latest))
            return update(save_dir, *args, **kwargs)

        module.update_checkpoint_state_internal = audited_update

    def wrap_tf_summary(module):  # type: ignore[no-untyped-def]
        create = module.create_file_writer_v2

        @functools.wraps(create)
        def audited_create(logdir, *args, **kwargs):  # type: ignore[no-untyped-def]
            if isinstance(logdir, (str, bytes, os.PathLike)):
                note("tf.summary", os.fsdecode(logdir))
            return create(logdir, *args, **kwargs)

        module.create_file_writer_v2 = audited_create

    sys.addaudithook(hook)
    sys.meta_path.insert(0, WrapTorchSave())
    sys.meta_path.insert(0, _WrapOnImport({
        "h5py._hl.files": wrap_h5py_file,
        "tensorflow.python.checkpoint.checkpoint": wrap_tf_checkpoint,
        "tensorflow.python.checkpoint.checkpoint_management": wrap_tf_checkpoint_state,
        "tensorflow.python.ops.summary_ops_v2": wrap_tf_summary,
    }))


def _log_gpu_use(log_file: str) -> None:
    import atexit
    import json

    backends: list[str] = []

    def remember_backend(module):  # type: ignore[no-untyped-def]
        init = module.init_process_group

        @functools.wraps(init)
        def watched(*args, **kwargs):  # type: ignore[no-untyped-def]
            result = init(*args, **kwargs)
            backends.append(str(module.get_backend()))
            return result

        module.init_process_group = watched

    def report() -> None:
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_initialized():
            return
        line = {"rank": os.environ.get("RANK", "-"), "device": torch.cuda.current_device(),
                "name": torch.cuda.get_device_name(), "backends": backends,
                "max_memory_allocated": torch.cuda.max_memory_allocated()}
        with open(log_file, "a") as f:
            f.write(json.dumps(line) + "\n")

    sys.meta_path.insert(0, _WrapOnImport({"torch.distributed.distributed_c10d": remember_backend}))
    atexit.register(report)


if _LOG_DIR:
    _install(_LOG_DIR)
if os.environ.get("SDP_E2E_GPU_LOG"):
    _log_gpu_use(os.environ["SDP_E2E_GPU_LOG"])
