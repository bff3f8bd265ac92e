"""Keras callbacks: start all ranks from the same state, average epoch logs, warm the lr up and
schedule it (Horovod's callbacks, for Keras 3)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import torch

from sdp_runtime import _comm
from sdp_runtime._compat import not_provided
from sdp_runtime.tensorflow.collectives import broadcast_variables
from sdp_runtime.tensorflow.keras.xla import prepare_train_function


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Copy ``root_rank``'s model and optimizer variables to every rank when training starts.

    At train begin, if the model is built (an ``Input`` layer, a functional model, or one already
    called), the optimizer is built if it is not yet (``optimizer.build(
    model.trainable_variables)``), so its slot variables exist and are broadcast too. If the
    model is not built yet (a ``Sequential`` without ``Input``, a subclassed model: Keras builds
    them in the first training step), the broadcast happens after the first batch instead, as
    in Horovod, once the trainable variables and the optimizer's exist. A model with variables
    but unbuilt layers (``Dropout``, ``GaussianNoise``, ``RandomFlip`` own a seed variable from
    construction) counts as unbuilt: building the optimizer then would fix it to an incomplete
    variable list and the first step would fail. Like the other callbacks
    here, it also moves the gradient allreduce out of XLA if the model is compiled with XLA
    (:func:`~sdp_runtime.tensorflow.keras.xla.prepare_train_function`).

    Arguments:
        root_rank: the rank whose variables every rank starts from.
        device: accepted for Horovod compatibility, unused.
        local_variables: variables (or one variable) each rank keeps as its own: not broadcast.

    Example:
        >>> model.fit(x, y, callbacks=[sdp.callbacks.BroadcastGlobalVariablesCallback(0)])
    """

    def __init__(self, root_rank: int = 0, device: str = "", local_variables: Any = None) -> None:
        super().__init__()
        self.root_rank = root_rank
        self.broadcast_done = False
        if local_variables is not None and not isinstance(local_variables, (list, tuple, set)):
            local_variables = [local_variables]
        self.local_variables = list(local_variables or [])

    def _broadcast(self) -> None:
        model = self.model
        optimizer = getattr(model, "optimizer", None)
        if optimizer is not None and not optimizer.built:
            optimizer.build(model.trainable_variables)
        variables = list(model.variables)
        if optimizer is not None:
            variables += list(optimizer.variables)
        local = {id(_inner(v)) for v in self.local_variables}
        variables = [v for v in variables if id(_inner(v)) not in local]
        broadcast_variables(variables, root_rank=self.root_rank)
        self.broadcast_done = True

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        prepare_train_function(self.model)
        if not self.broadcast_done and _fully_built(self.model):
            self._broadcast()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if not self.broadcast_done:
            self._broadcast()


def _inner(variable: Any) -> Any:
    """The tf.Variable of a Keras 3 variable (which is unhashable), or the variable itself."""
    return getattr(variable, "value", variable) if not hasattr(variable, "ref") else variable


def _fully_built(model: keras.Model) -> bool:
    """The model and every layer in it are built: their variables all exist."""
    if not model.built:
        return False
    layers = getattr(model, "_flatten_layers", None)
    return all(layer.built for layer in layers()) if layers is not None else True


class MetricAverageCallback(keras.callbacks.Callback):
    """Replace each numeric value in the epoch logs by its average over all ranks.

    Put it before callbacks that read the logs (ModelCheckpoint, ReduceLROnPlateau, CSVLogger)
    so that they see the averaged metrics. All ranks must log the same keys.

    Arguments:
        device: accepted for Horovod compatibility, unused.

    Example:
        >>> callbacks = [sdp.callbacks.MetricAverageCallback(), keras.callbacks.CSVLogger("x")]
    """

    def __init__(self, device: str = "") -> None:
        super().__init__()

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        prepare_train_function(self.model)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is None or _comm.size() == 1:
            return
        keys = sorted(k for k, v in logs.items() if _is_number(v))
        if not keys:
            return
        values = torch.tensor([float(logs[k]) for k in keys], dtype=torch.float64)
        _comm.allreduce_([values], op=_comm.ReduceOp.AVERAGE)
        for key, value in zip(keys, values.tolist(), strict=True):
            logs[key] = value


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return not isinstance(value, (str, bytes))


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Set the learning rate to ``initial_lr * multiplier(epoch)`` between two epochs (Horovod's).

    Several of them with consecutive ``[start_epoch, end_epoch)`` ranges make a step schedule, as
    in Horovod's ImageNet examples. With ``staircase`` the rate changes at the first batch of each
    epoch (``epoch`` an integer); without, at every batch (``epoch`` fractional, which needs
    ``steps_per_epoch``, taken from ``fit`` by default).

    Both of Horovod's call styles work. Horovod 0.21 and later: ``(initial_lr, multiplier,
    start_epoch=0, ...)``; a number as ``multiplier`` is an exponential decay from
    ``start_epoch`` on (the rate is ``initial_lr * multiplier ** (epoch - start_epoch)``, as in
    Horovod 0.23 and later; 0.21 and 0.22 kept it constant). Horovod 0.20 and earlier:
    ``(multiplier, start_epoch=0, ...)`` without ``initial_lr``, recognised by ``initial_lr``
    missing (0.21 made it required): ``initial_lr`` is then the optimizer's rate when training
    starts, and a number as ``multiplier`` a constant factor (the rate is
    ``initial_lr * multiplier`` over the range, as in those versions).

    Arguments:
        initial_lr: the rate the multiplier applies to, usually ``base_lr * size()``; None: the
            optimizer's learning rate when training starts.
        multiplier: a number (see above) or a function of the epoch returning the factor.
        start_epoch: first epoch of the range (inclusive).
        end_epoch: last epoch of the range (exclusive); None: to the end of training.
        staircase: change once per epoch (True) or at every batch (False).
        momentum_correction: accepted for Horovod compatibility; a Keras 3 optimizer's momentum
            is fixed when its training step is traced, so it is not corrected.
        steps_per_epoch: batches per epoch; by default taken from ``model.fit``.

    Example:
        >>> lr = 0.01 * sdp.size()
        >>> callbacks = [
        ...     sdp.callbacks.LearningRateWarmupCallback(initial_lr=lr, warmup_epochs=5),
        ...     sdp.callbacks.LearningRateScheduleCallback(lr, 1.0, start_epoch=5, end_epoch=30),
        ...     sdp.callbacks.LearningRateScheduleCallback(lr, 1e-1, start_epoch=30, end_epoch=60),
        ... ]
    """

    def __init__(
        self,
        initial_lr: float | Callable[[float], float] | None = None,
        multiplier: float | Callable[[float], float] | None = None,
        start_epoch: int = 0,
        end_epoch: int | None = None,
        staircase: bool = True,
        momentum_correction: bool = True,
        steps_per_epoch: int | None = None,
    ) -> None:
        super().__init__()
        if multiplier is None:  # Horovod <= 0.20: (multiplier, start_epoch, ...), initial_lr=kw
            if initial_lr is None:
                raise TypeError("LearningRateScheduleCallback needs a multiplier, e.g. "
                                "LearningRateScheduleCallback(initial_lr, multiplier=0.1)")
            multiplier, initial_lr = initial_lr, None
        # Horovod 0.21 made initial_lr required: without it, this is the older call style.
        older = initial_lr is None
        if callable(initial_lr):
            raise TypeError("LearningRateScheduleCallback: initial_lr must be a number; the "
                            "function goes in multiplier=")
        self.initial_lr = None if initial_lr is None else float(initial_lr)
        if callable(multiplier):
            self.multiplier: Callable[[float], float] = multiplier
        elif older:
            self.multiplier = lambda epoch, m=float(multiplier): m
        else:
            self.multiplier = lambda epoch, m=float(multiplier): m ** (epoch - start_epoch)
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = 0

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        prepare_train_function(self.model)
        if self.initial_lr is None:
            self.initial_lr = float(self.model.optimizer.learning_rate)
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = (self.params or {}).get("steps")
            if not self.steps_per_epoch:
                raise ValueError(f"{type(self).__name__} needs steps_per_epoch")

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.current_epoch = epoch

    def _adjust(self, epoch: float) -> None:
        assert self.initial_lr is not None
        self.model.optimizer.learning_rate = self.initial_lr * self.multiplier(epoch)

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.current_epoch < self.start_epoch or (
            self.end_epoch is not None and self.current_epoch >= self.end_epoch
        ):
            return
        if self.staircase:
            if batch == 0:
                self._adjust(self.current_epoch)
        else:
            assert self.steps_per_epoch
            self._adjust(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is not None:
            logs["learning_rate"] = float(self.model.optimizer.learning_rate)


class LearningRateWarmupCallback(keras.callbacks.Callback):
    """Ramp the learning rate from ``initial_lr / size()`` to ``initial_lr`` over the first epochs.

    Large scaled learning rates (``lr * size()``) can diverge in the first steps; this starts at
    the single-process rate and reaches ``initial_lr`` after ``warmup_epochs``, batch by batch
    (Goyal et al., "Accurate, Large Minibatch SGD", as in Horovod).

    Both of Horovod's call styles work: ``(initial_lr, warmup_epochs=5, ...)`` (Horovod 0.21 and
    later) and ``(warmup_epochs=5, ..., initial_lr=None)`` with keywords (Horovod 0.20 and
    earlier), where a missing ``initial_lr`` is the optimizer's learning rate when training starts.

    Arguments:
        initial_lr: the learning rate to reach, usually ``base_lr * size()``; None: the
            optimizer's learning rate when training starts.
        warmup_epochs: number of epochs the ramp lasts.
        momentum_correction: accepted for Horovod compatibility; a Keras 3 optimizer's momentum
            is fixed when its training step is traced, so it is not corrected.
        steps_per_epoch: batches per epoch; by default taken from ``model.fit``.
        verbose: 1 prints a line on rank 0 when the warmup ends.

    Example:
        >>> lr = 0.01 * sdp.size()
        >>> cb = sdp.callbacks.LearningRateWarmupCallback(initial_lr=lr, warmup_epochs=3)
    """

    def __init__(
        self,
        initial_lr: float | None = None,
        warmup_epochs: float = 5,
        momentum_correction: bool = True,
        steps_per_epoch: int | None = None,
        verbose: int = 0,
    ) -> None:
        super().__init__()
        self.initial_lr = None if initial_lr is None else float(initial_lr)
        self.warmup_epochs = warmup_epochs
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self.current_epoch = 0

    def multiplier(self, epoch: float) -> float:
        """Return the fraction of ``initial_lr`` to use at (fractional) ``epoch``."""
        n = _comm.size()
        return 1.0 / n * (epoch * (n - 1) / self.warmup_epochs + 1)

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        prepare_train_function(self.model)
        if self.initial_lr is None:
            self.initial_lr = float(self.model.optimizer.learning_rate)
        if self.steps_per_epoch is None:
            self.steps_per_epoch = (self.params or {}).get("steps")
        if not self.steps_per_epoch:
            raise ValueError("LearningRateWarmupCallback needs steps_per_epoch")

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.current_epoch >= self.warmup_epochs:
            return
        # +1 batch so that the end of each epoch lands on a round value.
        epoch = self.current_epoch + float(batch + 1) / self.steps_per_epoch
        epoch = min(epoch, float(self.warmup_epochs))
        assert self.initial_lr is not None
        self.model.optimizer.learning_rate = self.initial_lr * self.multiplier(epoch)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is not None:
            logs["learning_rate"] = float(self.model.optimizer.learning_rate)
        if self.verbose and _comm.rank() == 0 and epoch + 1 == self.warmup_epochs:
            print(
                f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                f"{self.initial_lr:g}."
            )


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """``keras.callbacks.ModelCheckpoint`` that keeps only the best model (Horovod's).

    As in Horovod, it writes on every rank it is given to: add it on rank 0 only.

    Arguments:
        filepath: where to save (``.keras``, or ``.weights.h5`` with ``save_weights_only``).
        monitor, verbose, save_weights_only, mode, save_freq: as for ``ModelCheckpoint``.

    Example:
        >>> if sdp.rank() == 0:
        ...     callbacks.append(sdp.callbacks.BestModelCheckpoint("best.keras"))
    """

    def __init__(self, filepath: str, monitor: str = "val_loss", verbose: int = 0,
                 save_weights_only: bool = False, mode: str = "auto",
                 save_freq: str | int = "epoch") -> None:
        super().__init__(filepath=filepath, monitor=monitor, verbose=verbose, save_best_only=True,
                         save_weights_only=save_weights_only, mode=mode, save_freq=save_freq)


# Horovod names this module does not provide raise NotProvidedError, saying what to do instead.
__getattr__ = not_provided(__name__, "horovod.tensorflow.keras.callbacks")
