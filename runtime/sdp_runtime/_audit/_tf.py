"""The audit's TensorFlow/Keras hooks.

- The runtime's gradient reductions (``DistributedGradientTape.gradient``, the Keras
  ``DistributedOptimizer``'s ``apply``, hence ``fit``) hand the audit the local gradients, as
  torch views inside the eager step that reduces them (inside a ``tf.function`` too: the same
  ``py_function``, no extra call out of the graph): per variable the sum and the sum of |x| for
  the first K reductions; the variables' values before the first and after steps 1, 2, K (and
  every N) are read there too.
- Every Keras optimizer's ``apply`` (patched; ``apply_gradients`` and ``fit`` go through it):
  for its first K steps, the gradients it applies (averaged or not: a tape never wrapped hands it
  each rank's own), and the trained variables and the non-trainable weights of the models that
  own them before step 1 and after steps 1, 2, K (and every N). Inside a ``tf.function`` this is
  one ``tf.py_function`` under a ``tf.cond`` on the optimizer's step counter: after step K (and
  between every-N points) the step pays for one comparison. Not inside XLA-compiled functions.
- ``keras.Model.fit`` (patched) hashes each sample of its first K training batches: the first
  ``TFEpochIterator`` a ``fit`` call makes (the training data; validation comes after) gets an
  ``enumerate().map`` whose ``tf.cond`` calls a ``py_function`` for the batches before K only.
- ``tf.GradientTape.gradient`` (patched) and ``keras.Model.fit`` register the trained variables,
  so that their values are compared at the end even where no gradient was seen.

Batch-norm moving statistics are updated by each rank's own batches (kept per rank, as in
Horovod): recorded, marked ``statistics``, not compared. Other non-trainable weights (a frozen
layer's) are compared.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import sys
from typing import Any

from . import _fingerprint
from ._singleton import Singleton


class _State:
    def __init__(self, rec: Any):
        self.rec = rec
        self.k = rec.conf.steps
        self.every = rec.conf.every
        self.variables: dict[int, Any] = {}  # id -> variable (trained, registered in order)
        self.sites: dict[tuple[str, ...], int] = {}  # the variables a reduction is for -> count
        self.optimizers: list[Any] = []
        self.buffers: dict[int, list[tuple[str, Any, str]]] = {}  # optimizer -> non-trainables
        self.fit_depth = 0  # fit calls running
        self.fit_wrapped = False  # this fit call's training iterator is hashed
        self.fit_batches = 0  # training batches hashed so far (all fit calls)


_get: Singleton[_State] = Singleton(_State, lambda record: _end(record))


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
            if _checkpoint(state, done):
                _weights(state, "tf:" + _site_name(site), flat, done)
            if count <= state.k:
                local = {}
                for pos, g in zip(positions, grads, strict=False):
                    if pos < len(names):
                        local[names[pos]] = _fingerprint.grads(g)
                rec.emit({"kind": "grads", "opt": "tf:" + _site_name(site), "step": count,
                          "local": local})
        except Exception as error:
            print(f"sdp audit: TF gradient fingerprint failed: {error!r}", file=sys.stderr)

    return observe


def _checkpoint(state: _State, done: int) -> bool:
    """Whether the weights are compared after ``done`` steps (0: before the first)."""
    return done in (0, 1, 2, state.k) or bool(state.every and done and done % state.every == 0)


def _site_name(site: tuple[str, ...]) -> str:
    """A name for the variables of one gradient reduction (two models' sites never share one:
    a GAN's generator and discriminator are compared each with itself)."""
    if len(site) == 1:
        return site[0]
    digest = hashlib.blake2b("|".join(site).encode(), digest_size=4).hexdigest()
    return f"{len(site)} variables ({site[0] if site else ''}... #{digest})"


def _weights(state: _State, key: str, variables: list[Any], step: int) -> None:
    state.rec.emit({"kind": "weights", "opt": key, "step": step, "params": _values(variables),
                    "buffers": {}})


def _values(variables: list[Any]) -> dict[str, Any]:
    out = {}
    for v in variables:
        if v is None or not hasattr(v, "numpy"):
            continue
        with contextlib.suppress(Exception):
            out[name_of(v)] = _fingerprint.weights(_torch(v))
    return out


def _torch(value: Any) -> Any:
    """A torch copy of a TF value (variable, tensor or numpy array)."""
    import numpy as np
    import torch

    raw = value.numpy() if hasattr(value, "numpy") else value
    return torch.from_numpy(np.array(raw, copy=True))


# --------------------------------------------------------------------------------------------
# Keras optimizers: the gradients each step applies, the weights around the first steps


def patch_optimizer(rec: Any, module: Any) -> None:
    """Keras optimizers register themselves at ``apply`` (their ``iterations`` are compared at
    the end) and fingerprint the gradients they apply in their first K steps."""
    state = _get(rec)
    cls = module.BaseOptimizer
    apply = cls.apply

    @functools.wraps(apply)
    def audited_apply(self: Any, grads: Any, trainable_variables: Any = None) -> Any:
        if all(o is not self for o in state.optimizers):
            state.optimizers.append(self)
        try:
            _observe_apply(state, self, grads, trainable_variables)
        except Exception as error:  # the audit must never break the job
            print(f"sdp audit: Keras optimizer hook failed: {error!r}", file=sys.stderr)
        return apply(self, grads, trainable_variables)

    cls.apply = audited_apply


def _observe_apply(state: _State, opt: Any, grads: Any, trainable_variables: Any) -> None:
    import tensorflow as tf

    grads = list(grads)
    variables = list(trainable_variables if trainable_variables is not None
                     else getattr(opt, "_trainable_variables", None) or [])
    if not grads or len(variables) != len(grads):
        return
    _register(state, variables)
    key = "keras:" + str(next(i for i, o in enumerate(state.optimizers) if o is opt))
    dense = [i for i, g in enumerate(grads)
             if g is not None and not isinstance(g, tf.IndexedSlices)]
    record = functools.partial(_record_apply, state, opt, key, variables, dense)
    if not tf.inside_function():
        record(opt.iterations.numpy(), *[grads[i] for i in dense])
        return
    if _in_xla():
        return  # a py_function cannot be compiled; the end's comparison still holds
    count = tf.convert_to_tensor(_tf_variable(opt.iterations))
    wanted = count <= state.k
    if state.every:
        wanted = tf.logical_or(wanted, tf.equal(count % state.every, 0))
    inputs = [grads[i] for i in dense]
    # The variables are read as inputs of the branch: ordered before this step's updates.
    tf.cond(wanted,
            lambda: tf.py_function(record, [count, *inputs,
                                            *[_tf_variable(v) for v in variables]], tf.int64),
            lambda: tf.constant(0, tf.int64))


def _tf_variable(v: Any) -> Any:
    return getattr(v, "value", v)


def _in_xla() -> bool:
    try:
        import tensorflow as tf
        from tensorflow.python.ops.control_flow_util import GraphOrParentsInXlaContext
    except ImportError:
        return True
    return bool(GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


def _record_apply(state: _State, opt: Any, key: str, variables: list[Any], dense: list[int],
                  count: Any, *tensors: Any) -> int:
    """Before step ``count + 1`` of ``opt``: the weights after ``count`` steps (at the check
    points) and the gradients this step applies (the first K steps)."""
    try:
        done = int(count.numpy() if hasattr(count, "numpy") else count)
        grads = tensors[:len(dense)]
        values = tensors[len(dense):]
        if _checkpoint(state, done):
            current = values if len(values) == len(variables) else variables
            params = {}
            for v, value in zip(variables, current, strict=True):
                with contextlib.suppress(Exception):
                    params[name_of(v)] = _fingerprint.weights(_torch(value))
            kept = {}
            for bname, b, why in _buffers(state, opt, variables):
                with contextlib.suppress(Exception):
                    kept[bname] = _fingerprint.weights(_torch(b)) + [why]
            state.rec.emit({"kind": "weights", "opt": key, "step": done, "params": params,
                            "buffers": kept})
        if done < state.k:
            applied = {}
            for i, g in zip(dense, grads, strict=True):
                with contextlib.suppress(Exception):
                    applied[name_of(variables[i])] = _fingerprint.grads(_torch(g))
            state.rec.emit({"kind": "grads", "opt": key, "step": done + 1, "local": {},
                            "applied": applied})
    except Exception as error:
        print(f"sdp audit: Keras step fingerprint failed: {error!r}", file=sys.stderr)
    return 0


def _buffers(state: _State, opt: Any, variables: list[Any]) -> list[tuple[str, Any, str]]:
    """The non-trainable weights of the Keras models that own ``variables`` (found once per
    optimizer, by one look over the live objects): (name, variable, why it is kept per rank:
    ``"statistics"`` for batch-norm moving statistics, else ``""``)."""
    found = state.buffers.get(id(opt))
    if found is not None:
        return found
    found = []
    state.buffers[id(opt)] = found
    try:
        import keras
    except ImportError:
        return found
    wanted = {id(v) for v in variables}
    model_type = keras.Model
    models = [m for m in gc.get_objects() if issubclass(type(m), model_type)]
    seen: set[int] = set()
    for model in models:
        with contextlib.suppress(Exception):
            if not any(id(v) in wanted for v in model.trainable_weights):
                continue
            statistics = set()
            for layer in model._flatten_layers(include_self=True, recursive=True):
                if isinstance(layer, keras.layers.BatchNormalization):
                    statistics |= {id(layer.moving_mean), id(layer.moving_variance)}
            for v in model.non_trainable_weights:
                if id(v) not in seen:
                    seen.add(id(v))
                    found.append((name_of(v), v, "statistics" if id(v) in statistics else ""))
    return found


# --------------------------------------------------------------------------------------------
# Tapes and fit


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
        state.fit_depth += 1
        state.fit_wrapped = False
        try:
            result = fit(self, *args, **kwargs)
        finally:
            state.fit_depth -= 1
        with contextlib.suppress(Exception):
            _register(state, self.trainable_weights)
            opt = getattr(self, "optimizer", None)
            if opt is not None and all(o is not opt for o in state.optimizers):
                state.optimizers.append(opt)
        return result

    cls.fit = audited_fit


def patch_epoch_iterator(rec: Any, module: Any) -> None:
    """Hash the samples of the first K batches of ``fit``'s training data."""
    state = _get(rec)
    cls = module.TFEpochIterator
    init = cls.__init__

    @functools.wraps(init)
    def audited_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if state.fit_depth and not state.fit_wrapped:
            state.fit_wrapped = True  # the first iterator of a fit call: its training data
            try:
                self._distributed_dataset = _hashed(state, self._distributed_dataset)
            except Exception as error:
                print(f"sdp audit: cannot fingerprint fit's batches: {error!r}", file=sys.stderr)

    cls.__init__ = audited_init


def _hashed(state: _State, dataset: Any) -> Any:
    """``dataset`` unchanged, but its first K batches' samples hashed as they are made."""
    import tensorflow as tf

    if not isinstance(dataset, tf.data.Dataset) or state.fit_batches >= state.k:
        return dataset  # a tf.distribute strategy's dataset, or hashed enough already

    def tag(index: Any, *element: Any) -> Any:
        batch = element[0] if len(element) == 1 else element
        first = next((t for t in tf.nest.flatten(batch) if isinstance(t, tf.Tensor)), None)
        if first is None:
            return batch
        done = tf.cond(index < state.k,
                       lambda: tf.py_function(functools.partial(_hash_batch, state), [first],
                                              tf.int64),
                       lambda: tf.constant(0, tf.int64))
        with tf.control_dependencies([done]):
            return tf.nest.map_structure(
                lambda t: tf.identity(t) if isinstance(t, tf.Tensor) else t, batch)

    return dataset.enumerate().map(tag)


def _hash_batch(state: _State, batch: Any) -> int:
    if state.fit_batches < state.k:
        try:
            hashes = _fingerprint.sample_rows(batch.numpy())
            state.fit_batches += 1
            if hashes:
                state.rec.emit({"kind": "inputs", "step": state.fit_batches, "samples": hashes})
        except Exception as error:
            print(f"sdp audit: fit batch fingerprint failed: {error!r}", file=sys.stderr)
    return 0


def _end(record: dict[str, Any]) -> None:
    state = _get.current()
    if state is None:
        return
    record["tf_steps"] = {_site_name(s): n for s, n in state.sites.items()}
    iterations = []
    for opt in state.optimizers:
        with contextlib.suppress(Exception):
            iterations.append(int(opt.iterations.numpy()))
    record["keras_iterations"] = iterations
    record["tf_weights"] = _values(list(state.variables.values()))
    buffers = {}
    for found in state.buffers.values():
        for bname, b, why in found:
            with contextlib.suppress(Exception):
                buffers[bname] = _fingerprint.weights(_torch(b)) + [why]
    record["tf_buffers"] = buffers
