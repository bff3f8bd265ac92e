"""Horovod's TF / Keras API where Horovod's own test suites (benchmarks/horovod_suites.py) found
sdp_runtime lacking, on real processes (sdp-run, Gloo, CPU); and a Horovod Keras script of the
0.2x call styles (LearningRateWarmupCallback without initial_lr, fit_generator) migrated by
sdp-convert and trained on two processes to its end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime_tf.launch import HAS_TF, _communicate, _env, run_ranks

pytestmark = [
    pytest.mark.tensorflow,
    pytest.mark.slow,
    pytest.mark.skipif(not HAS_TF, reason="tensorflow is not installed"),
]

CHECKS = [
    "alltoall_reducescatter_grouped_allgather_eager_and_in_tf_function",
    "integers_scale_in_float64_truncated_as_horovod",
    "tf1_graph_collectives_run_in_the_order_they_were_made_on_every_rank",
    "broadcast_in_place_object_fn_ops_and_build_queries",
    "the_global_process_set_is_accepted_and_others_refused",
    "names_not_provided_say_what_to_do_instead",
    "keras_collectives_take_horovods_keras_argument_order",
    "warmup_without_initial_lr_ramps_to_the_optimizers_rate",
    "schedule_in_both_horovod_call_styles",
    "metric_average_with_device_and_best_model_checkpoint",
]


@pytest.mark.timeout(300)
def test_horovod_tf_and_keras_api_on_two_ranks(tmp_path: Path) -> None:
    for result in run_ranks("horovod_parity_worker.py", 2, tmp_path, timeout=240):
        assert result["passed"] == CHECKS


HOROVOD_KERAS_SCRIPT = """\
import json
import sys

import keras
import numpy as np
import horovod.keras as hvd

hvd.init()
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()))
model.compile(optimizer=opt, loss="mse")


def batches():
    while True:
        for i in range(0, 64, 8):
            yield x[i : i + 8], y[i : i + 8]


callbacks = [
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    hvd.callbacks.MetricAverageCallback(),
    hvd.callbacks.LearningRateWarmupCallback(warmup_epochs=2, verbose=1),
]
history = model.fit_generator(batches(), steps_per_epoch=4, epochs=3, callbacks=callbacks,
                              workers=2, verbose=0)
if hvd.rank() == 0:
    with open(sys.argv[1], "w") as out:
        json.dump({"lr": history.history["learning_rate"], "size": hvd.size()}, out)
"""


@pytest.mark.timeout(300)
def test_a_horovod_keras_script_of_the_older_call_styles_migrates_and_trains(
    tmp_path: Path,
) -> None:
    script = tmp_path / "train.py"
    script.write_text(HOROVOD_KERAS_SCRIPT)
    convert = subprocess.run(
        [sys.executable, "-m", "sdp_convert", str(script)], capture_output=True, text=True,
        timeout=120,
    )
    assert convert.returncode == 0, convert.stderr
    assert "fit_generator(...) -> fit(...)" in convert.stderr
    converted = script.read_text()
    assert "import sdp_runtime.tensorflow.keras as hvd" in converted
    assert "model.fit(batches(), steps_per_epoch=4, epochs=3" in converted
    assert "LearningRateWarmupCallback(warmup_epochs=2, verbose=1)" in converted
    out = tmp_path / "out.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sdp_runtime.launch", "-n", "2", str(script), str(out)],
        env=_env(), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    text = _communicate(proc, "the migrated Horovod script", 240)
    assert proc.returncode == 0, text[-6000:]
    result = json.loads(out.read_text())
    # warmed up from 0.02 / 2 to the optimizer's own rate, 0.02, over two epochs, then kept
    assert result["size"] == 2
    assert [round(v, 6) for v in result["lr"]] == [0.015, 0.02, 0.02]
    assert "finished gradual learning rate warmup to 0.02" in text
