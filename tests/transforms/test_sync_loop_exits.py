from __future__ import annotations

from pathlib import Path

import libcst as cst
from sdp_convert.program.index import nodes_of
from sdp_convert.program.model import FileModel
from sdp_convert.transforms.sync_loop_exits import LoopExits

from .helpers import check_noop, check_transformed, reported, run

ONLY = "sync_loop_exits"

STEP = """\
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(model(x) ** 2)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
"""


def test_a_reward_threshold_becomes_rank_0s_decision_and_a_step_count_stays():
    result = check_transformed(
        "import tensorflow as tf\n\nrunning_reward = 10\n"
        "for episode in range(1000):\n" + STEP + "    reward = float(loss)\n"
        "    running_reward = 0.05 * reward + 0.95 * running_reward\n"
        "    if running_reward > 195:\n        break\n"
        "    if episode >= 500:\n        break\n",
        "import tensorflow as tf\nimport sdp_runtime.tensorflow as sdp\n\nsdp.init()\n\n"
        "running_reward = 10\n"
        "for episode in range(1000):\n" + STEP + "    reward = float(loss)\n"
        "    running_reward = 0.05 * reward + 0.95 * running_reward\n"
        "    if sdp.broadcast_object(bool(running_reward > 195), root_rank=0):\n        break\n"
        "    if episode >= 500:\n        break\n",
        only=ONLY,
    )
    ((line, message),) = reported(result, ONLY, manual=False)
    assert line == 11
    assert message.startswith("`if running_reward > 195` -> rank 0's decision")
    check_noop(result.output.decode(), only=ONLY)


def test_early_stopping_by_hand_follows_the_patience_counter_through_its_branch():
    source = (
        "import tensorflow as tf\n\nbest, patience = float('inf'), 3\n"
        "for epoch in range(100):\n"
        "    with tf.GradientTape() as tape:\n"
        "        loss = tf.reduce_mean(model(x) ** 2)\n"
        "    grads = tape.gradient(loss, model.trainable_variables)\n"
        "    optimizer.apply_gradients(zip(grads, model.trainable_variables))\n"
        "    val_loss = evaluate(model)\n"
        "    if val_loss < best:\n"
        "        best = val_loss\n"
        "        patience = 3\n"
        "    else:\n"
        "        patience -= 1\n"
        "        if patience == 0:\n"
        "            break\n"
    )
    out = run(source, ONLY).output.decode()
    assert "if sdp.broadcast_object(bool(val_loss < best), root_rank=0):" in out
    # patience is the same on every worker only because of the test above; taken from rank 0
    # too (it changes under a condition that differs).
    assert "if sdp.broadcast_object(bool(patience == 0), root_rank=0):" in out


def test_a_while_condition_that_differs_is_reported_and_counters_are_left_alone():
    result = run(
        "import tensorflow as tf\n\nstep = 0\ndone = False\n"
        "while not done:\n" + STEP + "    done = env_step()\n"
        "for i in range(10):\n" + STEP.replace("    ", "    ") + "    step += 1\n"
        "    if step > 5 and i % 2 == 0:\n        break\n",
        ONLY,
    )
    assert b"broadcast_object" not in result.output
    ((line, message),) = reported(result, ONLY, manual=True)
    assert line == 5 and message.startswith("`while not done` may end on one worker")


def test_loops_inside_a_tf_function_are_reported_not_rewritten():
    result = run(
        "import tensorflow as tf\n\n@tf.function\ndef train(ds):\n"
        "    for x in ds:\n"
        "        with tf.GradientTape() as tape:\n"
        "            loss = tf.reduce_mean(model(x) ** 2)\n"
        "        grads = tape.gradient(loss, model.trainable_variables)\n"
        "        optimizer.apply_gradients(zip(grads, model.trainable_variables))\n"
        "        if loss < 0.1:\n            break\n",
        ONLY,
    )
    assert b"broadcast_object" not in result.output
    ((line, message),) = reported(result, ONLY, manual=True)
    assert line == 10 and "inside a tf.function" in message


def _exits_by_walk(loop):
    """The exits of ``loop`` found by walking its body (libcst's ``children``): what
    ``LoopExits`` answers from the file's index."""
    found = []

    def walk(node, nested):
        for child in node.children:
            if isinstance(child, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                continue
            if (isinstance(child, cst.Break) and not nested) or isinstance(child, cst.Return):
                found.append(child)
            walk(child, nested or (isinstance(child, (cst.For, cst.While)) and child is not loop))

    walk(loop.body, False)
    return found


def test_loop_exits_from_the_index_are_those_of_a_walk_of_each_loop_on_every_fixture():
    edges = (
        "def f(xs):\n"
        "    for x in xs:\n"
        "        while x:\n            break\n        else:\n            break\n"
        "        if x:\n            return x\n"
        "        g = lambda: x\n"
        "        def h():\n            return 1\n"
        "        class C:\n            for y in xs:\n                break\n"
        "        for z in xs:\n            return z\n        else:\n            break\n"
        "    else:\n        break\n"
        "    while True: break\n"
    )
    root = Path(__file__).resolve().parents[2]
    sources = [edges] + [p.read_text() for p in sorted((root / "fixtures").rglob("*.py"))]
    loops = exits = 0
    for source in sources:
        fm = FileModel.from_source(source)
        find = LoopExits(fm)
        for loop in [*nodes_of(fm, cst.For), *nodes_of(fm, cst.While)]:
            expected = _exits_by_walk(loop)
            assert [id(n) for n in find(loop)] == [id(n) for n in expected], code_of(fm, loop)
            loops, exits = loops + 1, exits + len(expected)
    assert loops > 600 and exits > 25


def code_of(fm, node):
    return fm.module.code_for_node(node)[:200]
