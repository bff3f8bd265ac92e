"""Run by sdp-run on 1-2 ranks with a GPU: the NCCL path, eager and in tf.function."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import sdp_runtime.tensorflow as sdp
import tensorflow as tf
import torch
from sdp_runtime import _comm
from sdp_runtime.tensorflow import collectives


def main(out_dir: Path) -> None:
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:  # leave GPU memory to torch/NCCL too
        tf.config.experimental.set_memory_growth(gpu, True)
    sdp.init()
    r, n = sdp.rank(), sdp.size()
    assert torch.cuda.is_available() and _comm.backend() == "nccl", _comm.backend()
    # TF tensors live on this rank's GPU when TF has GPU support, else on the CPU (copied).
    device = f"/GPU:{sdp.local_rank()}" if len(gpus) > sdp.local_rank() else "/CPU:0"
    with tf.device(device):
        x = tf.fill([1000, 3], float(r + 1))
        grads = [x, tf.fill([7], float(2 * (r + 1))), tf.fill([5], r + 1)]
        compiled = tf.function(lambda ts: sdp.grouped_allreduce(ts, op=sdp.Sum))
        total = n * (n + 1) / 2
        collectives.trace = []
        in_function = compiled(grads)
        seen, collectives.trace = collectives.trace, None
        if gpus:  # the py_function got the float tensors on the GPU: no host round trip
            assert all("GPU" in dev for dev, _ in seen[0]) and seen[1][0][1] == "int32", seen
        for out in (sdp.grouped_allreduce(grads, op=sdp.Sum), in_function):
            np.testing.assert_array_equal(out[0].numpy(), np.full([1000, 3], total))
            np.testing.assert_array_equal(out[1].numpy(), np.full([7], 2 * total))
            np.testing.assert_array_equal(out[2].numpy(), np.full([5], total))
        np.testing.assert_array_equal(sdp.broadcast(x, 0).numpy(), np.ones([1000, 3]))
        gathered = sdp.allgather(tf.fill([r + 1], r))
        np.testing.assert_array_equal(gathered.numpy(), [k for k in range(n) for _ in range(k + 1)])
        w = tf.Variable([1.0, 2.0])
        with tf.GradientTape() as tape:
            loss = (r + 1) * tf.reduce_sum(w * w)
        grad = sdp.DistributedGradientTape(tape).gradient(loss, w)
        np.testing.assert_allclose(grad.numpy(), (n + 1) * np.array([1.0, 2.0]))
    result = {"rank": r, "size": n, "device": device, "passed": ["nccl"]}
    (out_dir / f"rank{r}.json").write_text(json.dumps(result))
    sdp.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
