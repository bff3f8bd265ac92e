"""Keras fit with a tf.data input that is not sharded: each rank shuffles all 64 samples its own
way (--right: sharded before the shuffle; --unwrapped: sharded, the optimizer never wrapped;
--late-load: sharded, the frozen layer's weights loaded on rank 0 only, after the broadcast;
both: both defects)."""
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
if "--right" in sys.argv or "--unwrapped" in sys.argv or "--late-load" in sys.argv:
    dataset = dataset.shard(sdp.size(), sdp.rank())
dataset = dataset.shuffle(64, seed=sdp.rank()).batch(8)
keras.utils.set_random_seed(sdp.rank())  # each rank starts from its own weights
frozen = keras.layers.Dense(8, trainable=False, name="frozen")
model = keras.Sequential([keras.Input((8,)), frozen, keras.layers.BatchNormalization(),
                          keras.layers.Dense(1, name="head")])
pretrained = [np.full((8, 8), 0.1, "float32"), np.zeros(8, "float32")]
if "--late-load" not in sys.argv:
    frozen.set_weights(pretrained)
sdp.broadcast_variables(model.variables, root_rank=0)
if "--late-load" in sys.argv and sdp.rank() == 0:
    frozen.set_weights(pretrained)
opt = keras.optimizers.SGD(0.05)
if "--unwrapped" not in sys.argv:
    opt = sdp.keras.DistributedOptimizer(opt)
model.compile(optimizer=opt, loss="mse")
model.fit(dataset, epochs=1, verbose=0)
