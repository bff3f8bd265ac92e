"""Run by sdp-run on 2 ranks for tests/runtime/test_smddp_api.py: every name of SMDDP's
TensorFlow API reference, through the module a migrated script imports, called with the documented
signature; the two TF1 graph-mode names must be refused with advice. Writes each name's outcome
("ok" or the traceback) to ``OUT_DIR/rank<r>.json``."""

from __future__ import annotations

import importlib
import json
import sys
import traceback
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf
from sdp_convert.transforms.migrate_smddp import SMDDP_MODULES

smddp = importlib.import_module(SMDDP_MODULES["smdistributed.dataparallel.tensorflow"].module)
outcome: dict[str, str] = {}


def check(fn):
    try:
        fn()
        outcome[fn.__name__] = "ok"
    except Exception:  # noqa: BLE001 (reported per name)
        outcome[fn.__name__] = traceback.format_exc()
    return fn


def main(out_dir: Path) -> None:
    check(init)
    n, r = smddp.size(), smddp.rank()
    for fn in (size, local_size, rank, local_rank, allreduce, broadcast_variables, oob_allreduce,
               overlap, broadcast, DistributedOptimizer, DistributedGradientTape, Compression,
               ReduceOp, broadcast_global_variables, BroadcastGlobalVariablesHook):
        check(fn)
    check(shutdown)
    (out_dir / f"rank{r}.json").write_text(json.dumps({"rank": r, "size": n, "names": outcome}))


def init():
    smddp.init()


def size():
    assert smddp.size() == 2


def local_size():
    assert smddp.local_size() == 2


def rank():
    assert smddp.rank() in (0, 1)


def local_rank():
    assert smddp.local_rank() == smddp.rank()


def allreduce():
    r = smddp.rank()
    grads = [tf.constant([1.0 * (r + 1)]), tf.constant([[2.0 * (r + 1)]])]
    out = [smddp.allreduce(g, i, len(grads), smddp.Compression.none, smddp.ReduceOp.AVERAGE)
           for i, g in enumerate(grads)]
    assert out[0].numpy().tolist() == [1.5] and out[1].numpy().tolist() == [[3.0]]
    total = smddp.allreduce(tf.constant(1.0), 0, 1, op=smddp.ReduceOp.SUM)
    assert total.numpy() == 2.0
    half = smddp.allreduce(tf.constant([1.0, 3.0]), 0, 1, compression=smddp.Compression.fp16)
    assert half.dtype == tf.float32 and half.numpy().tolist() == [1.0, 3.0]


def broadcast_variables():
    v = tf.Variable([float(smddp.rank())])
    assert smddp.broadcast_variables([v], root_rank=1) is None
    assert v.numpy().tolist() == [1.0]


def oob_allreduce():
    loss = tf.constant(float(smddp.rank()))
    assert smddp.oob_allreduce(loss).numpy() == 0.5
    assert smddp.oob_allreduce(loss, smddp.Compression.none, smddp.ReduceOp.MAX).numpy() == 1.0


def overlap():
    x = tf.constant([1.0, 2.0])
    assert smddp.overlap(x) is x


def broadcast():
    out = smddp.broadcast(tf.constant([smddp.rank()]), root_rank=0)
    assert out.numpy().tolist() == [0]


def DistributedOptimizer():  # noqa: N802 (the documented name)
    v = tf.Variable([0.0])
    opt = smddp.DistributedOptimizer(
        keras.optimizers.SGD(1.0), name=None, use_locking=False,
        compression=smddp.Compression.none, sparse_as_dense=False, op=smddp.ReduceOp.AVERAGE,
        bucket_cap_mb=25,
    )
    opt.apply_gradients([(tf.constant([2.0 * (smddp.rank() + 1)]), v)])
    assert v.numpy().tolist() == [-3.0]  # the average gradient, 3, times lr 1


def DistributedGradientTape():  # noqa: N802 (the documented name)
    w = tf.Variable([1.0, 2.0])
    with tf.GradientTape() as tape:
        loss = (smddp.rank() + 1) * tf.reduce_sum(w * w)
    tape = smddp.DistributedGradientTape(tape, compression=smddp.Compression.none,
                                         sparse_as_dense=False, op=smddp.ReduceOp.AVERAGE)
    grads = tape.gradient(loss, [w])
    assert np.allclose(grads[0].numpy(), [3.0, 6.0])  # 2 w, averaged over factors 1 and 2


def Compression():  # noqa: N802 (the documented name)
    assert smddp.Compression.none is not smddp.Compression.fp16


def ReduceOp():  # noqa: N802 (the documented name)
    assert len({smddp.ReduceOp.AVERAGE, smddp.ReduceOp.SUM, smddp.ReduceOp.MIN,
                smddp.ReduceOp.MAX}) == 4


def _refused(name: str) -> None:
    try:
        getattr(smddp, name)
    except NotImplementedError as error:
        assert "is not provided" in str(error) and "broadcast_variables(" in str(error), error
        return
    raise AssertionError(f"{name} was not refused")


def broadcast_global_variables():
    _refused("broadcast_global_variables")


def BroadcastGlobalVariablesHook():  # noqa: N802 (the documented name)
    _refused("BroadcastGlobalVariablesHook")


def shutdown():
    smddp.shutdown()
    assert not smddp.is_initialized()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
