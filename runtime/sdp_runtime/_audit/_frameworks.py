"""Hook the frameworks as they are imported (or at once, when they already are)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


def install(rec: Any) -> None:
    """Patch torch and TensorFlow/Keras for the audit, now or when each module is first
    imported, whichever comes first."""
    from . import _tf, _torch

    wrappers: dict[str, Callable[[Any], None]] = {
        "torch.optim.optimizer": lambda m: _torch.patch_optimizer(rec, m),
        "torch.nn.parallel.distributed": lambda m: _torch.patch_ddp(rec, m),
        "torch.serialization": lambda m: _torch.patch_save(rec, m),
        "torch.utils.data.dataloader": lambda m: _torch.patch_loader(rec, m),
        "tensorflow.python.eager.backprop": lambda m: _tf.patch_tape(rec, m),
        "keras.src.models.model": lambda m: _tf.patch_fit(rec, m),
        "keras.src.backend.tensorflow.trainer": lambda m: _tf.patch_epoch_iterator(rec, m),
        "keras.src.optimizers.base_optimizer": lambda m: _tf.patch_optimizer(rec, m),
    }
    pending = {}
    for name, wrap in wrappers.items():
        module = sys.modules.get(name)
        if module is not None:
            wrap(module)
        else:
            pending[name] = wrap
    if pending:
        sys.meta_path.insert(0, _WrapOnImport(pending))


class _WrapOnImport:
    """Runs ``wrappers[name](module)`` once the module ``name`` has been executed."""

    def __init__(self, wrappers: dict[str, Callable[[Any], None]]):
        self.wrappers = wrappers

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        wrap = self.wrappers.pop(name, None)
        if wrap is None:
            return None
        spec = None
        # Ask the finders after this one (another import hook may wrap the same module).
        for finder in sys.meta_path[sys.meta_path.index(self) + 1:]:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_wrap(module: Any) -> None:
            exec_module(module)
            try:
                wrap(module)
            except Exception as error:  # the audit must never break the job
                print(f"sdp audit: could not hook {name}: {error}", file=sys.stderr)

        spec.loader.exec_module = exec_and_wrap  # type: ignore[method-assign]
        return spec
