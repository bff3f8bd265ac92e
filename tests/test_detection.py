"""Detection: test modules and library modules train, but are not training scripts to convert."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sdp_convert.engine import convert

SDP_CONVERT = str(Path(sys.executable).with_name("sdp-convert"))

TORCH_LOOP = """\
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""

# ---------------------------------------------------------------------------------------------
# Left alone, byte for byte.

PYTEST_FIT = """\
import numpy as np
import pytest
from tensorflow import keras


@pytest.mark.parametrize("epochs", [1, 2])
def test_fit_reduces_loss(epochs):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    history = model.fit(np.ones((8, 4)), np.ones((8, 1)), epochs=epochs)
    assert history.history["loss"][-1] >= 0
"""

UNITTEST_TORCH = (
    """\
import unittest

import torch


class TrainingTest(unittest.TestCase):
    def test_loss_decreases(self):
"""
    + TORCH_LOOP.replace("    ", "        ")
    + """\
        self.assertTrue(torch.isfinite(loss))


if __name__ == "__main__":
    unittest.main()
"""
)

KERAS_TESTING_MODULE = """\
import numpy as np
from keras.src import layers, models, testing


class CallbackTest(testing.TestCase):
    def test_fit(self):
        model = models.Sequential([layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        model.fit(np.ones((8, 4)), np.ones((8, 1)))
"""

TF_TEST_CASE = """\
import tensorflow as tf


class TapeTest(tf.test.TestCase):
    def test_apply(self):
        var = tf.Variable(1.0)
        opt = tf.keras.optimizers.SGD(0.1)
        with tf.GradientTape() as tape:
            loss = var * var
        opt.apply_gradients([(tape.gradient(loss, var), var)])


if __name__ == "__main__":
    tf.test.main()
"""

LIBRARY_OPTIMIZER = """\
\"\"\"An optimizer base class, as a library ships it.\"\"\"
import logging

import tensorflow as tf

logger = logging.getLogger(__name__)
_DEFAULTS = frozenset(["float32"])


class Optimizer(tf.Module):
    def minimize(self, loss, var_list, tape=None):
        tape = tape if tape is not None else tf.GradientTape()
        with tape:
            value = loss()
        grads = tape.gradient(value, var_list)
        return self.apply_gradients(zip(grads, var_list))

    def apply_gradients(self, grads_and_vars):
        for grad, var in grads_and_vars:
            var.assign_sub(0.01 * grad)


def register(registry):
    registry.add(Optimizer)
"""

LIBRARY_TORCH_HELPER = (
    """\
import torch

from .. import config


def sanity_check(model):
    \"\"\"Train the model for a few steps (a module of the user's own package).\"\"\"
"""
    + TORCH_LOOP
)


TORCH_OPTIMIZER = """\
import torch


class Lookahead(torch.optim.Optimizer):
    def __init__(self, base, alpha=0.5):
        self.base, self.alpha = base, alpha
        super().__init__(base.param_groups, base.defaults)

    def step(self, closure=None):
        def backward_closure():
            loss = closure()
            loss.backward()
            return loss

        loss = self.base.step(backward_closure if closure is not None else None)
        for group in self.param_groups:
            for p in group["params"]:
                p.data.mul_(self.alpha)
        return loss
"""

# A framework's own trainer: a Model subclass's train_step and fit, in a package's module.
TF_INTERNAL_TRAINER = """\
import tensorflow as tf
from tensorflow.python.eager import backprop


class Trainer(tf.Module):
    def train_step(self, data):
        x, y = data
        with backprop.GradientTape() as tape:
            loss = self.compute_loss(x, y)
        self.optimizer.apply_gradients(zip(tape.gradient(loss, self.variables), self.variables))

    def fit(self, dataset):
        for data in dataset:
            self.train_step(data)
"""


@pytest.mark.parametrize(
    ("source", "excluded", "why"),
    [
        (PYTEST_FIT, "test module", "uses pytest and defines test function test_fit_reduces_loss"),
        (UNITTEST_TORCH, "test module", "uses unittest and defines test class TrainingTest"),
        (KERAS_TESTING_MODULE, "test module", "uses keras.src.testing"),
        (TF_TEST_CASE, "test module", "uses tensorflow.test and defines test class TapeTest"),
        (LIBRARY_OPTIMIZER, "library module", "an optimizer implementation"),
        (TORCH_OPTIMIZER, "library module", "an optimizer implementation"),
        (TF_INTERNAL_TRAINER, "library module", "a module of a framework"),
    ],
    ids=["pytest-fit", "unittest-torch", "keras-testing", "tf-test-case", "optimizer",
         "torch-optimizer", "tf-internal-trainer"],
)
def test_test_and_library_modules_are_left_alone(source, excluded, why):
    result = convert(source)
    assert result.output == result.source  # byte for byte
    assert not result.changes
    assert result.info.excluded == excluded
    assert result.info.label == f"not a training script ({excluded})"
    assert why in result.info.reason
    assert not result.info.convertible


# ---------------------------------------------------------------------------------------------
# Real scripts: still converted.

MODULE_LOOP = "import torch\n\n" + TORCH_LOOP.replace("    ", "", 1).replace("\n    ", "\n")

ARGPARSE_MAIN = (
    """\
import argparse

import torch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()
"""
    + TORCH_LOOP
    + """

if __name__ == "__main__":
    main()
"""
)

MAIN_WITHOUT_GUARD = "import torch\n\n\ndef train():\n" + TORCH_LOOP + "\n\ntrain()\n"

ABSL_APP_RUN = (
    "import torch\nfrom absl import app\n\n\ndef main(argv):\n" + TORCH_LOOP + "\n\napp.run(main)\n"
)

KERAS_TRAIN_STEP = """\
import numpy as np
import tensorflow as tf
from tensorflow import keras


class MyModel(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1)

    def call(self, x):
        return self.dense(x)

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(y=y, y_pred=self(x, training=True))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": loss}

    def test_step(self, data):
        x, y = data
        return {"loss": self.compute_loss(y=y, y_pred=self(x))}


model = MyModel()
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
model.fit(np.ones((8, 4)), np.ones((8, 1)), epochs=1)
"""

# Looks like a test by its names (an evaluation function test_accuracy, a class ModelTest), but
# imports no test framework: a script.
TEST_LOOKING_SCRIPT = (
    """\
import torch


class ModelTest:
    def test_accuracy(self, model):
        return model(torch.ones(1, 4)).item()


def test_loss(model):
    return model(torch.ones(1, 4)).pow(2).mean().item()


"""
    + TORCH_LOOP.replace("    ", "", 1).replace("\n    ", "\n")
    + "print(test_loss(model), ModelTest().test_accuracy(model))\n"
)


# A user's file of definitions only (imported by their own script): still converted.
USER_TRAINER_CLASS = """\
import torch


class Trainer:
    def __init__(self, model):
        self.model = model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def train_epoch(self, loader):
        for x in loader:
            self.model(x).sum().backward()
            self.optimizer.step()
"""


@pytest.mark.parametrize(
    "source",
    [MODULE_LOOP, ARGPARSE_MAIN, MAIN_WITHOUT_GUARD, ABSL_APP_RUN, KERAS_TRAIN_STEP,
     TEST_LOOKING_SCRIPT, USER_TRAINER_CLASS, LIBRARY_TORCH_HELPER],
    ids=["module-loop", "argparse-main", "main-no-guard", "absl-app-run", "keras-train-step",
         "test-looking-names", "user-trainer-class", "package-module-with-relative-import"],
)
def test_training_scripts_are_still_converted(source):
    result = convert(source)
    assert result.changed or result.manual
    assert result.info.convertible
    assert not result.info.excluded
    assert result.info.label in ("torch", "tensorflow", "keras")


def test_a_module_of_definitions_gets_no_init_at_import():
    # A Trainer class other code imports and calls: sdp.init() at module level would run at
    # import, before (or as a second init after) the importing script's; a person places it.
    result = convert(USER_TRAINER_CLASS)
    assert not result.info.entry_point
    assert "sdp.init()" not in result.output.decode()
    (note,) = [c for c in result.changes if c.transform == "add_runtime_init"]
    assert note.manual and "no sdp.init() added" in note.message
    # The same class with a script part gets its init.
    script = USER_TRAINER_CLASS + "\nTrainer(model).train_epoch(loader)\n"
    assert "\nsdp.init()\n" in convert(script).output.decode()


def test_a_script_named_like_a_test_is_converted(tmp_path):
    script = tmp_path / "train_test.py"
    script.write_text(MODULE_LOOP)
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [SDP_CONVERT, "--check", "-q", str(script), "--report", str(report),
         "--report-format", "json"],
        capture_output=True, timeout=120,
    )
    assert b"Traceback" not in proc.stderr
    (entry,) = json.loads(report.read_text())["files"]
    assert entry["status"] == "converted", entry
    assert entry["kind"] == "torch"


def test_a_test_module_is_reported_unchanged_with_its_reason(tmp_path):
    module = tmp_path / "test_training.py"
    module.write_bytes(UNITTEST_TORCH.encode())
    report = tmp_path / "report.json"
    subprocess.run(
        [SDP_CONVERT, "-q", str(module), "--report", str(report), "--report-format", "json"],
        capture_output=True, timeout=120,
    )
    (entry,) = json.loads(report.read_text())["files"]
    assert entry["status"] == "unchanged", entry
    assert entry["kind"] == "not a training script (test module)"
    assert entry["reason"].startswith("test module: uses unittest")
    assert module.read_bytes() == UNITTEST_TORCH.encode()
