"""The audit's TensorFlow/Keras hooks.

- The runtime's gradient reductions (``DistributedGradientTape.gradient``, the Keras
  ``DistributedOptimizer``'s ``apply``, hence ``fit``) hand the audit the local gradients, as
  torch views inside the eager step that reduces them (inside a ``tf.function`` too: the same
  ``py_function``, no extra call out of the graph): per variable the sum and the sum of |x| for
  the first K reductions; the variables' values before the first and after steps 1, 2, K (and
  every N) are read there too.
- ``tf.GradientTape.gradient`` (patched) and ``keras.Model.fit`` (patched) register the trained
  variables, so that their values are compared at the end even where no gradient was averaged
  (a tape that was never wrapped).

Only trainable variables are compared: batch-norm statistics are kept per rank, as in Horovod.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
from typing import Any

from . import _fingerprint


class _State:
    def __init__(self, rec: Any):
        self.rec = rec
        self.k = rec.conf.steps
        self.every = rec.conf.every
        self.variables: dict[int, Any] = {}  # id -> variable (trained, registered in order)
        self.sites: dict[tuple[str, ...], int] = {}  # the variables a reduction is for -> count
        self.optimizers: list[Any] = []


_state: _State | None = None


def _get(rec: Any) -> _State:
    global _state
    if _state is None:
        _state = _State(rec)
        rec.end_parts.append(_end)
    return _state


def name_of(v: Any) -> str:
    return str(getattr(v, "path", None) or getattr(v, "name", None) or f"<variable {id(v)}>")


def _register(state: _State, variables: Any) -> list[Any]:
    import tensorflow as tf

    found = []
    for v in tf.nest.flatten(variables):
        if v is None or not hasattr(v, "assign") or not getattr(v, "trainable", True):
            continue
        state.variables.setdefault(id(v), v)
        found.append(v)
    return found


def observer(rec: Any, variables: Any) -> Any:
    """A callable ``(positions, local_grads)`` for one gradient reduction of ``variables``."""
    import tensorflow as tf

    state = _get(rec)
    flat = list(tf.nest.flatten(variables)) if variables is not None else []
    _register(state, flat)
    names = [name_of(v) if v is not None else "" for v in flat]
    site = tuple(names)

    def observe(positions: list[int], grads: list[Any]) -> None:
        count = state.sites.get(site, 0) + 1
        state.sites[site] = count
        if count > state.k + 1 and not (state.every and (count - 1) % state.every == 0):
            return
        try:
            done = count - 1  # steps of this site already applied
            if done in (0, 1, 2, state.k) or (state.every and done and done % state.every == 0):
                _weights(state, site, flat, done)
            if count <= state.k:
                local = {}
                for pos, g in zip(positions, grads, strict=False):
                    if pos < len(names):
                        local[names[pos]] = _fingerprint.grads(g)
                rec.emit({"kind": "grads", "opt": "tf:" + _site_name(site), "step": count,
                          "local": local})
        except Exception as error:
            import sys

            print(f"sdp audit: TF gradient fingerprint failed: {error!r}", file=sys.stderr)

    return observe


def _site_name(site: tuple[str, ...]) -> str:
    """A name for the variables of one gradient reduction (two models' sites never share one:
    a GAN's generator and discriminator are compared each with itself)."""
    if len(site) == 1:
        return site[0]
    digest = hashlib.blake2b("|".join(site).encode(), digest_size=4).hexdigest()
    return f"{len(site)} variables ({site[0] if site else ''}... #{digest})"


def _weights(state: _State, site: tuple[str, ...], variables: list[Any], step: int) -> None:
    state.rec.emit({"kind": "weights", "opt": "tf:" + _site_name(site), "step": step,
                    "params": _values(variables), "buffers": {}})


def _values(variables: list[Any]) -> dict[str, Any]:
    import torch

    out = {}
    for v in variables:
        if v is None or not hasattr(v, "numpy"):
            continue
        with contextlib.suppress(Exception):
            out[name_of(v)] = _fingerprint.weights(torch.from_numpy(_numpy(v)))
    return out


def _numpy(v: Any) -> Any:
    import numpy as np

    return np.array(v.numpy(), copy=True)


def patch_tape(rec: Any, module: Any) -> None:
    state = _get(rec)
    cls = module.GradientTape
    gradient = cls.gradient

    @functools.wraps(gradient)
    def audited_gradient(self: Any, target: Any, sources: Any, *args: Any, **kwargs: Any) -> Any:
        with contextlib.suppress(Exception):
            _register(state, sources)
        return gradient(self, target, sources, *args, **kwargs)

    cls.gradient = audited_gradient


def patch_fit(rec: Any, module: Any) -> None:
    state = _get(rec)
    cls = module.Model
    fit = cls.fit

    @functools.wraps(fit)
    def audited_fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = fit(self, *args, **kwargs)
        with contextlib.suppress(Exception):
            _register(state, self.trainable_weights)
            opt = getattr(self, "optimizer", None)
            if opt is not None and all(o is not opt for o in state.optimizers):
                state.optimizers.append(opt)
        return result

    cls.fit = audited_fit


def patch_optimizer(rec: Any, module: Any) -> None:
    """Keras optimizers register themselves at ``apply`` (once per trace inside a
    ``tf.function``), so that their ``iterations`` are compared at the end."""
    state = _get(rec)
    cls = module.BaseOptimizer
    apply = cls.apply

    @functools.wraps(apply)
    def audited_apply(self: Any, *args: Any, **kwargs: Any) -> Any:
        if all(o is not self for o in state.optimizers):
            state.optimizers.append(self)
        return apply(self, *args, **kwargs)

    cls.apply = audited_apply


def _end(record: dict[str, Any]) -> None:
    state = _state
    if state is None:
        return
    record["tf_steps"] = {_site_name(s): n for s, n in state.sites.items()}
    iterations = []
    for opt in state.optimizers:
        with contextlib.suppress(Exception):
            iterations.append(int(opt.iterations.numpy()))
    record["keras_iterations"] = iterations
    record["tf_weights"] = _values(list(state.variables.values()))
