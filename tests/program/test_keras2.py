"""program.keras2: Keras 2 calls found in the original tree."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m
from sdp_convert.program.keras2 import (
    directory_saves,
    is_keras3_optimizer,
    metric_reset_states_calls,
    optimizer_variables_calls,
)

from .helpers import code, probe

HEAD = "import tensorflow as tf\nimport keras\n"


def test_optimizers_made_here_plain_or_wrapped():
    t = probe(HEAD + "a = tf.optimizers.Adam()\nb = keras.optimizers.SGD(0.1)\n"
              "c = tf.keras.optimizers.legacy.Adam()\nd = make()\na.variables(); b.variables()\n"
              "c.variables(); d.variables(); a.variables(1)\n")
    assert [code(t, c) for c in optimizer_variables_calls(t)] == ["a.variables()", "b.variables()"]
    names = {n.value: n for n in m.findall(t.module, m.Name()) if isinstance(n, cst.Name)}
    assert not is_keras3_optimizer(t, names["d"])


def test_metrics_and_directory_saves():
    t = probe(HEAD + "acc = tf.keras.metrics.Accuracy()\nacc.reset_states()\n"
              "lstm.reset_states()\nmodel.compile(loss='mse')\nmodel.save('dir')\n"
              "model.save('m.keras')\nckpt.save('dir')\n")
    assert [code(t, c) for c in metric_reset_states_calls(t)] == ["acc.reset_states()"]
    assert [code(t, c) for c in directory_saves(t)] == ["model.save('dir')"]
