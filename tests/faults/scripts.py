"""The scripts the fault-injection tests launch (written to a temporary folder per test).

Each one writes ``pid<rank>`` when it starts and ``failed_at`` (a time.time()) at the moment it
fails on purpose, so that the tests can check the process table and time the job's end from the
failure, not from the launch.
"""

COMMON = """\
import os, sys, time
def mark(name, text=""):
    with open(name + ".tmp", "w") as f:
        f.write(text or str(time.time()))
    os.replace(name + ".tmp", name)
"""

EXIT_BEFORE_COLLECTIVE = COMMON + """\
import torch
import sdp_runtime.torch as sdp
sdp.init()
mark(f"pid{sdp.rank()}", str(os.getpid()))
if sdp.rank() == 1:
    mark("failed_at")
    sys.exit(3)
sdp.allreduce(torch.ones(4))
print("rank 0 was not stopped")
"""

RAISE_IN_DDP_LOOP = COMMON + """\
import torch
import sdp_runtime.torch as sdp
sdp.init()
mark(f"pid{sdp.rank()}", str(os.getpid()))
torch.manual_seed(0)
model = sdp.DistributedDataParallel(torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(100000):
    if step == 3 and sdp.rank() == 1:
        mark("failed_at")
        raise ValueError("bad batch at step 3")
    loss = model(torch.randn(32, 64)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""

# 8M floats (32 MiB): two buckets of the default 25 MiB, the large-tensor path.
ALLREDUCE_FOREVER = COMMON + """\
import torch
import sdp_runtime.torch as sdp
sdp.init()
mark(f"pid{sdp.rank()}", str(os.getpid()))
x = torch.ones(8 * 1024 * 1024)
for i in range(1000000):
    sdp.allreduce_(x, op=sdp.Sum)
    if i == 2:
        mark(f"looping{sdp.rank()}")
    x.fill_(1.0)
"""

RAISE_ON_NODE = COMMON + """\
import torch
import sdp_runtime.torch as sdp
sdp.init()
mark(f"pid{sdp.rank()}", str(os.getpid()))
for step in range(100000):
    if step == 5 and sdp.rank() == 1:
        mark("failed_at")
        raise RuntimeError("node 1 lost its disk")
    sdp.allreduce(torch.ones(1000))
"""

# A tf.function GradientTape loop and Keras fit over data the ranks hold different amounts of.
TF_COMMON = COMMON + """\
import numpy as np
import tensorflow as tf
import keras
import sdp_runtime.tensorflow as sdp
sdp.init()
mark(f"pid{sdp.rank()}", str(os.getpid()))
B = 8
"""

TF_ONE_STEP_EARLY = TF_COMMON + """\
steps = 6 if sdp.rank() == 0 else 5
w = tf.Variable([[0.0]])
opt = keras.optimizers.SGD(0.01)

@tf.function
def step(x):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((x @ w - 1.0) ** 2)
    tape = sdp.DistributedGradientTape(tape)
    grads = tape.gradient(loss, [w])
    opt.apply_gradients(zip(grads, [w]))

for i in range(steps):
    step(tf.ones([B, 1]))
mark(f"finished{sdp.rank()}")
"""

FIT_ONE_BATCH_MORE = TF_COMMON + """\
n = 2 * B * 4 + B  # rank 0 gets one batch more than rank 1: a plain shard of uneven rows
rows = np.arange(n, dtype="float32").reshape(-1, 1)
mine = rows[: 5 * B] if sdp.rank() == 0 else rows[: 4 * B]
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
model.compile(optimizer=sdp.keras.DistributedOptimizer(keras.optimizers.SGD(0.001)), loss="mse")
model.fit(mine, mine, batch_size=B, epochs=1, verbose=0, shuffle=False,
          callbacks=[sdp.keras.callbacks.BroadcastGlobalVariablesCallback(0)])
mark(f"finished{sdp.rank()}")
"""

# Uneven totals (2*B*k + 1 samples) through sdp.shard, for an eager loop, a tf.function loop and
# Keras fit, over a dataset of known length, a generator (unknown length) and numpy arrays.
TF_UNEVEN_SHARDED = TF_COMMON + """\
import json
N = 2 * B * 7 + 1
ids = np.arange(N, dtype="int64")
report = {}
w = tf.Variable([[0.0]])
opt = keras.optimizers.SGD(1e-4)

def train(x):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((tf.cast(x, tf.float32)[:, None] @ w - 1.0) ** 2)
    tape = sdp.DistributedGradientTape(tape)
    grads = tape.gradient(loss, [w])
    opt.apply_gradients(zip(grads, [w]))
    return tf.shape(x)[0]

compiled = tf.function(train)
sources = {
    "known": lambda: tf.data.Dataset.from_tensor_slices(ids),
    "generator": lambda: tf.data.Dataset.from_generator(
        lambda: iter(ids), output_signature=tf.TensorSpec([], tf.int64)),
}
for source_name, make in sources.items():
    for loop_name, fn in (("eager", train), ("tf.function", compiled)):
        ds = make().apply(sdp.shard).shuffle(64, seed=1).batch(B)
        for epoch in range(2):
            seen = []
            for batch in ds:
                fn(batch)
                seen.append(batch.numpy().tolist())
            report[f"{source_name}/{loop_name}/{epoch}"] = seen

class Count(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.steps = 0
    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1

keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
model.compile(optimizer=sdp.keras.DistributedOptimizer(keras.optimizers.SGD(1e-4)), loss="mse")
x = ids.astype("float32").reshape(-1, 1)
counter = Count()
model.fit(sdp.shard(x), sdp.shard(x), batch_size=B, epochs=2, verbose=0, shuffle=False,
          callbacks=[sdp.keras.callbacks.BroadcastGlobalVariablesCallback(0), counter])
report["fit/arrays"] = [counter.steps, sdp.shard(x)[:, 0].astype("int64").tolist()]
spec = tf.TensorSpec([1], tf.float32)
ds = tf.data.Dataset.from_generator(lambda: iter(x), output_signature=spec)
ds = tf.data.Dataset.zip((ds, ds)).apply(sdp.shard).batch(B)
counter = Count()
model.fit(ds, epochs=2, verbose=0, callbacks=[counter])
report["fit/generator"] = [counter.steps]
mark(f"report{sdp.rank()}", json.dumps(report))
"""

# Every rank raises; rank 0 first, and rank 0 is then slow to exit (an atexit handler of the
# script's own), so torchrun stops it with SIGTERM once rank 1 has exited with status 1.
EVERY_RANK_RAISES = COMMON + """\
import atexit
import torch
import sdp_runtime.torch as sdp
sdp.init()
mark(f"pid{sdp.rank()}", str(os.getpid()))
sdp.allreduce(torch.ones(1))
if sdp.rank() == 0:
    atexit.register(time.sleep, 30)
else:
    time.sleep(1.0)
mark("failed_at")
raise ValueError(f"bad input on rank {sdp.rank()}")
"""

# Each rank starts a child process of its own and then waits: after a SIGKILL of sdp-run, the
# ranks and their children must all be gone.
RANKS_WITH_CHILDREN = COMMON + """\
import subprocess
import torch
import sdp_runtime.torch as sdp
sdp.init()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
mark(f"pid{sdp.rank()}", str(os.getpid()))
mark(f"child{sdp.rank()}", str(child.pid))
sdp.allreduce(torch.ones(1))
mark(f"looping{sdp.rank()}")
time.sleep(600)
"""
