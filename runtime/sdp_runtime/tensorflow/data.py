"""``shard``: this rank's part of the training data, the same number of steps on every rank.

``dataset.shard(size, rank)`` alone gives the first ``n % size`` ranks one element more than the
others; after ``batch`` that can be one batch more, and a rank with a batch more waits in the
gradient allreduce for peers that have already left the epoch (Horovod and SMDDP users meet this
as a hang at the end of the first epoch). torch's ``DistributedSampler`` avoids it by padding.
``shard`` does the same for TensorFlow input:

- **Arrays** (numpy, tf tensors, pandas, lists; tuples/lists/dicts of them): rank ``r`` gets rows
  ``r, r + size, r + 2 * size, ...`` of the data padded to a multiple of ``size`` with its first
  rows, exactly like ``DistributedSampler(shuffle=False)``: every rank gets ``ceil(n / size)`` rows.
- **A ``tf.data.Dataset`` of known length** (``from_tensor_slices``, ``range``, ``zip`` of those,
  ``tfds`` with known sizes): the same padding, then ``shard``. No communication.
- **A dataset of unknown length** (``from_generator``, ``TFRecordDataset``, ``filter``): the ranks
  agree every ``sync_every`` elements (default 32) whether any of them still has data, through the
  job's rendezvous store (not the collectives, so it never mixes with the gradients). A rank that
  runs out first repeats its own elements until none has data left at an agreement point, so every
  rank yields the same number of elements (at most ``sync_every - 1`` repeated past the longest
  shard). The cost is one store round trip per rank every ``sync_every`` elements.
- **An infinite dataset** (``repeat()`` without count): ``shard`` alone; the loop's step count
  decides.
- **A ``keras.utils.PyDataset`` / ``Sequence``** (an object of batches by index): rank ``r`` gets
  batches ``r, r + size, ...``, padded with the first batches to ``ceil(len / size)`` on every
  rank; ``on_epoch_begin``/``on_epoch_end`` are passed on, with numpy's and ``random``'s global
  generators seeded alike on every rank for the call (from a seed rank 0 draws when ``shard`` is
  called, plus the epoch) and given back their own state after it, so a Sequence that reshuffles
  its indices there with ``np.random`` or ``random`` (Keras's ``ImageDataGenerator`` iterators
  do) gets the same order on every rank. Its first order must be the same on every rank too (a
  shuffle of its indices seeded alike, e.g. ``flow_from_directory(..., seed=sdp.shared_seed())``),
  or the ranks' batches overlap.

Equal element counts at the shard give equal batch counts as long as what follows does not drop
elements differently on each rank (a ``filter`` after the shard, or sharding a list of files whose
files hold different numbers of records). Then shard after that point, or give the loop a fixed
number of steps; if the ranks still run different numbers of steps, the job stops with a message
saying so rather than waiting (``sdp_runtime._exit``).

With one process ``shard`` returns its argument unchanged.
"""

from __future__ import annotations

import itertools
import random
import sys
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from sdp_runtime import _comm, _exit
from sdp_runtime._types import CommunicationError

__all__ = ["shard", "shared_seed"]

DEFAULT_SYNC_EVERY = 32
_calls = itertools.count(1)  # one agreement namespace per shard() call, the same on every rank


def shard(data: Any, *, sync_every: int = DEFAULT_SYNC_EVERY) -> Any:
    """Return this rank's part of ``data``, the same amount on every rank.

    Arguments:
        data: a ``tf.data.Dataset``, arrays (numpy, tf tensors, pandas, lists, or a
            tuple/list/dict of those with the same length), or a ``keras.utils.PyDataset``
            (``Sequence``).
        sync_every: for datasets of unknown length, how many elements each rank yields between
            two agreements on whether any rank still has data.

    Returns:
        The same kind of object: a dataset, or arrays with ``ceil(n / size)`` rows. Without
        ``init()`` (a module the converter sharded, imported by a one-process program such as an
        evaluation script), ``data`` itself: one process reads all of it.

    Example:
        >>> ds = tf.data.Dataset.from_tensor_slices((x, y)).apply(sdp.shard).shuffle(1000)
        >>> model.fit(sdp.shard(x_train), sdp.shard(y_train), batch_size=32)
    """
    if not _comm.is_initialized():
        return data
    n, r = _comm.size(), _comm.rank()
    if n == 1:
        return data
    if isinstance(data, tf.data.Dataset):
        return _shard_dataset(data, n, r, int(sync_every))
    if _is_keras_sequence(data):
        return _shard_sequence(data, n, r)
    rows = _rows_of(data, n, r)
    return _take_rows(data, rows)


def shared_seed() -> int:
    """A seed drawn on rank 0 and sent to every rank: the same on every rank, new each run.

    Call it on every rank at the same point (it is a broadcast). Without ``init()``, or with
    one process, a seed drawn here.

    Example:
        >>> train = gen.flow_from_directory("train/", seed=sdp.shared_seed())  # one order
        >>> model.fit(sdp.shard(train), epochs=5)
    """
    seed = random.SystemRandom().randrange(2**31)
    if not _comm.is_initialized() or _comm.size() == 1:
        return seed
    return int(_comm.broadcast_object(seed, 0))


# --------------------------------------------------------------------------------------------
# Arrays


def _rows_of(data: Any, n: int, r: int) -> np.ndarray:
    length = _length(data)
    if length == 0:
        return np.zeros(0, dtype=np.int64)
    per_rank = -(-length // n)
    return np.arange(r, per_rank * n, n, dtype=np.int64) % length


def _length(data: Any) -> int:
    if isinstance(data, Mapping):
        lengths = {_length(v) for v in data.values()}
    elif isinstance(data, (tuple, list)) and data and all(_is_array(v) for v in data):
        lengths = {_length(v) for v in data}
    else:
        return int(data.shape[0]) if hasattr(data, "shape") else len(data)
    if len(lengths) != 1:
        raise ValueError(f"sdp.shard: the arrays have different lengths {sorted(lengths)}")
    return lengths.pop()


def _is_array(value: Any) -> bool:
    return isinstance(value, (np.ndarray, tf.Tensor)) or hasattr(value, "iloc")


def _take_rows(data: Any, rows: np.ndarray) -> Any:
    if isinstance(data, Mapping):
        return type(data)({k: _take_rows(v, rows) for k, v in data.items()})  # type: ignore[call-arg]
    if isinstance(data, (tuple, list)) and data and all(_is_array(v) for v in data):
        return type(data)(_take_rows(v, rows) for v in data)
    if isinstance(data, np.ndarray):
        return data[rows]
    if isinstance(data, tf.Tensor):
        return tf.gather(data, rows)
    if hasattr(data, "iloc"):  # pandas
        return data.iloc[rows]
    return [data[int(i)] for i in rows]


# --------------------------------------------------------------------------------------------
# Keras PyDataset / Sequence


def _is_keras_sequence(data: Any) -> bool:
    # Only modules imported already: an object of a class of theirs exists only then.
    bases = []
    for module in ("keras", "tf_keras"):
        utils = getattr(sys.modules.get(module), "utils", None)
        bases += [b for b in (getattr(utils, "PyDataset", None), getattr(utils, "Sequence", None))
                  if isinstance(b, type)]
    return bool(bases) and isinstance(data, tuple(bases))


def _shard_sequence(data: Any, n: int, r: int) -> Any:
    base = next(c for c in type(data).__mro__ if c.__name__ in ("PyDataset", "Sequence"))

    seed = shared_seed()

    class ShardedSequence(base):  # type: ignore[misc, valid-type]
        """Batches ``r, r + n, ...`` of ``data`` (padded to the same count on every rank)."""

        epochs = 0

        def __init__(self) -> None:
            options = {
                k: getattr(data, k)
                for k in ("workers", "use_multiprocessing", "max_queue_size")
                if hasattr(data, k)
            }
            try:
                super().__init__(**options)
            except TypeError:  # tf_keras' Sequence takes no arguments
                super().__init__()
            self.data = data

        def __len__(self) -> int:
            return -(-len(data) // n)

        def __getitem__(self, index: int) -> Any:
            if index >= len(self):
                raise IndexError(index)
            return data[(index * n + r) % len(data)]

        def on_epoch_begin(self) -> None:
            if hasattr(data, "on_epoch_begin"):
                _seeded_alike(data.on_epoch_begin, seed, 2 * self.epochs)

        def on_epoch_end(self) -> None:
            if hasattr(data, "on_epoch_end"):
                _seeded_alike(data.on_epoch_end, seed, 2 * self.epochs + 1)
            self.epochs += 1

    return ShardedSequence()


def _seeded_alike(hook: Any, seed: int, call: int) -> None:
    """``hook()`` with numpy's and ``random``'s global generators seeded the same on every rank
    (``seed`` is rank 0's), then given back the state each had: what the Sequence draws elsewhere
    (augmentations) stays this rank's own."""
    numpy_state, python_state = np.random.get_state(), random.getstate()
    np.random.seed((seed + call) % 2**32)
    random.seed(seed + call)
    try:
        hook()
    finally:
        np.random.set_state(numpy_state)
        random.setstate(python_state)


# --------------------------------------------------------------------------------------------
# Datasets


def _shard_dataset(ds: tf.data.Dataset, n: int, r: int, sync_every: int) -> tf.data.Dataset:
    length = int(ds.cardinality())
    if length == tf.data.INFINITE_CARDINALITY:
        return ds.shard(n, r)
    if length >= 0:
        padded = -(-length // n) * n
        if padded != length:
            ds = ds.repeat().take(padded)  # the first elements again, as DistributedSampler does
        return ds.shard(n, r)
    if sync_every < 1:
        raise ValueError(f"sdp.shard: sync_every must be at least 1, not {sync_every}")
    return _agreed(ds, ds.shard(n, r), sync_every)


def _agreed(source: tf.data.Dataset, mine: tf.data.Dataset, every: int) -> tf.data.Dataset:
    """``mine``, then its own elements again, until no rank has data at an agreement point."""
    agreement = _Agreement(next(_calls), every)
    # A rank whose shard is empty repeats the source's first element instead.
    filler = mine.repeat().concatenate(source.take(1).repeat())
    flagged = tf.data.Dataset.zip((mine, tf.data.Dataset.from_tensors(True).repeat())).concatenate(
        tf.data.Dataset.zip((filler, tf.data.Dataset.from_tensors(False).repeat()))
    )

    def check(index: tf.Tensor, pair: Any) -> Any:
        element, has = pair
        keep = tf.cond(
            index % every == 0,
            lambda: tf.numpy_function(agreement, [index, has], tf.bool, stateful=True),
            lambda: tf.constant(True),
        )
        keep = tf.ensure_shape(keep, [])
        return keep, element

    return (
        flagged.enumerate()
        .map(check)
        .take_while(lambda keep, element: keep)
        .map(lambda keep, element: element)
    )


class _Agreement:
    """At element ``index`` (a multiple of ``every``): does any rank still have data?

    Runs in the tf.data thread, through the store: keys are tagged with this rank's pass over the
    dataset and the agreement point, so a pipeline one rank abandoned early (a ``break``) never
    answers for the next pass. Starting pass ``k + 1`` closes pass ``k`` for everyone.
    """

    def __init__(self, call: int, every: int) -> None:
        self.prefix = f"sdp_runtime/shard{call}"
        self.every = every
        self.passes = 0

    def __call__(self, index: np.ndarray, has: np.ndarray) -> np.ndarray:
        store = _comm._default_store()
        point = int(index) // self.every
        if point == 0:
            if self.passes:
                store.add(f"{self.prefix}/{self.passes}/closed", 1)
            self.passes += 1
        key = f"{self.prefix}/{self.passes}/{point}"
        store.add(f"{key}/has", int(bool(has)))
        store.add(f"{key}/arrived", 1)
        self._wait(store, key)
        if point >= 2 and _comm.rank() == 0:  # everyone is past point - 1: nobody reads these
            for name in ("has", "arrived"):
                store.delete_key(f"{self.prefix}/{self.passes}/{point - 2}/{name}")
        return np.bool_(store.add(f"{key}/has", 0) > 0)

    def _wait(self, store: Any, key: str) -> None:
        size = _comm.size()
        deadline = time.monotonic() + _comm._require("sdp.shard").timeout_s
        polls = 0
        while store.add(f"{key}/arrived", 0) < size:
            polls += 1
            if polls % 200 == 0:
                if store.add(f"{self.prefix}/{self.passes}/closed", 0) > 0:
                    return  # a peer has moved on to the next pass: this one was abandoned
                reason = _exit.explain("sdp.shard")
                if reason or time.monotonic() > deadline:
                    raise CommunicationError(
                        f"sdp.shard: rank {_comm.rank()} waited at element {key.rsplit('/', 1)[-1]}"
                        f" x {self.every} of its input for the other ranks: "
                        f"{reason or 'they did not arrive within SDP_TIMEOUT'}"
                    )
            time.sleep(0.0002 if polls < 50 else 0.002)
