"""A custom TF loop under a DistributedGradientTape whose tf.data input is not sharded
(--right: sharded; --unwrapped: sharded, but the tape is never wrapped)."""
import sys

import keras
import numpy as np
import sdp_runtime.tensorflow as sdp
import tensorflow as tf

sdp.init()
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 8)).astype("float32")
y = rng.normal(size=(64, 1)).astype("float32")
dataset = tf.data.Dataset.from_tensor_slices((x, y))
if "--right" in sys.argv or "--unwrapped" in sys.argv:
    dataset = dataset.shard(sdp.size(), sdp.rank())
dataset = dataset.batch(8)
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="relu"),
                          keras.layers.Dense(1)])
opt = keras.optimizers.SGD(0.05)
sdp.broadcast_variables(model.variables, root_rank=0)


@tf.function
def train_step(xb, yb):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(xb, training=True) - yb))
    if "--unwrapped" not in sys.argv:
        tape = sdp.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    return loss


for xb, yb in dataset:
    train_step(xb, yb)
