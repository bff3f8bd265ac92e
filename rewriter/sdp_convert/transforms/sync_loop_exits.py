"""Leave a TensorFlow training loop on every worker at the same step: rank 0 decides.

Before::

    for episode in range(1000):
        loss = train_step(...)
        running_reward = 0.05 * episode_reward + 0.95 * running_reward
        if running_reward > 195:
            break

After::

    for episode in range(1000):
        loss = train_step(...)
        running_reward = 0.05 * episode_reward + 0.95 * running_reward
        if sdp.broadcast_object(bool(running_reward > 195), root_rank=0):
            break

Why: a condition computed from what each worker saw (its loss, its validation metric, its
episodes' rewards, an early-stopping patience counter) holds on one worker before the others.
That worker leaves the loop; the others go on to the next step and wait in its gradient allreduce
for a partner that never comes, until the collective times out. Rank 0's decision, broadcast, is
the same on every worker, so they all break (or all go on) together; on one process it is the
condition itself. Conditions that read only loop counters, constants and configuration
(``if step >= max_steps``) are the same everywhere and stay as they are.

A ``while`` loop whose own condition differs between workers (``while not done``) is reported, not
rewritten: forcing rank 0's answer would make the others step an environment that has finished.
Keras ``fit`` needs none of this: ``EarlyStopping`` sees the metrics ``MetricAverageCallback``
averaged (``wrap_keras_fit`` puts it first), so every worker stops at the same epoch.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

import libcst as cst

from ..base import Transform
from ..program.datasets import in_keras_train_step
from ..program.flow import decided_per_rank
from ..program.index import file_index, nodes_of
from ..program.model import FileModel
from ..program.syntax import code
from ..program.training import is_tf_function, training_facts


class SyncLoopExits(Transform):
    DESCRIPTION = "Training-loop exits decided on one worker become rank 0's decision for all."
    FRAMEWORKS = frozenset({"tensorflow"})

    def prepare(self, module: cst.Module) -> None:
        self.tests: set[cst.BaseExpression] = set()
        broadcast = f"{self.state.runtime_module}.broadcast_object"
        done: set[int] = set()
        exits = LoopExits(self.fm)
        for site in training_facts(self.fm).sites:
            for loop in site.loops:
                if id(loop) in done or in_keras_train_step(self.fm, loop):
                    continue
                done.add(id(loop))
                function = self.enclosing_function(loop)
                traced = function is not None and is_tf_function(self.fm, function)
                if isinstance(loop, cst.While) and decided_per_rank(self.fm, loop.test):
                    self.record(
                        loop,
                        f"`while {code(loop.test)}` may end on one worker before the others, "
                        f"which then wait for it in the gradient allreduce: make the condition "
                        f"the same on every worker (e.g. {self.sdp}.broadcast_object("
                        f"bool(...), root_rank=0)) or run a fixed number of steps",
                        manual=True,
                    )
                for exit_stmt in exits(loop):
                    for test in self._tests(exit_stmt, loop):
                        if isinstance(test, cst.Call) and self.refers_to(test.func, broadcast):
                            continue  # rank 0's already
                        if test in self.tests or not decided_per_rank(self.fm, test):
                            continue
                        if traced:
                            self.record(
                                test,
                                f"`if {code(test)}` decides on each worker alone when to leave "
                                f"this loop (inside a tf.function): make it the same on every "
                                f"worker",
                                manual=True,
                            )
                            continue
                        self.tests.add(test)
        if self.tests:
            self.add_runtime_import()

    def _tests(self, node: cst.CSTNode, loop: cst.CSTNode) -> list[cst.BaseExpression]:
        """The ``if`` tests between ``node`` and ``loop`` (innermost first)."""
        tests = []
        for parent in self.ancestors(node):
            if parent is loop:
                break
            if isinstance(parent, cst.If):
                tests.append(parent.test)
        return tests

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        if original_node.test not in self.tests:
            return updated_node
        test = updated_node.test.with_changes(lpar=[], rpar=[])
        decided = cst.Call(func=cst.Name("bool"), args=[cst.Arg(test)])
        wrapped = cst.parse_expression(f"{self.sdp}.broadcast_object(_, root_rank=0)")
        assert isinstance(wrapped, cst.Call)
        wrapped = wrapped.with_changes(
            args=[wrapped.args[0].with_changes(value=decided), *wrapped.args[1:]]
        )
        self.record(
            original_node.test,
            f"`if {code(original_node.test)}` -> rank 0's decision "
            f"({self.sdp}.broadcast_object): it reads values that differ between workers, and a "
            f"worker leaving the training loop alone would leave the others waiting in a "
            f"collective",
        )
        return updated_node.with_changes(test=wrapped)


class LoopExits:
    """``break`` statements that leave a loop, and ``return`` statements inside it: those in its
    body, not inside a function, class or lambda, the ``break`` statements not inside another
    loop either; in file order.

    Found among the file's ``break`` and ``return`` statements (its index, ``nodes_of``) in the
    loop's walk span (``loop_spans``), by their ancestors: not by a walk of the loop with
    libcst's ``children`` (which rebuilds each node it lists). The same statements as that walk
    (``tests/transforms/test_sync_loop_exits.py`` compares them on every loop of the fixtures).
    """

    def __init__(self, fm: FileModel) -> None:
        index = file_index(fm)
        self.fm = fm
        self.order = index.order
        #: Walk position of each loop's start -> of its end.
        self.ends = {first: last for first, last, _ in index.loop_spans}
        #: The file's ``break`` and ``return`` statements, with their walk positions.
        self.exits = [
            (kind, nodes, [index.order[id(n)] for n in nodes])
            for kind in (cst.Break, cst.Return) for nodes in [nodes_of(fm, kind)]
        ]

    def __call__(self, loop: cst.For | cst.While) -> list[cst.CSTNode]:
        start = self.order[id(loop)]
        end = self.ends[start]
        found: list[cst.CSTNode] = []
        for kind, nodes, positions in self.exits:
            for node in nodes[bisect_right(positions, start):bisect_left(positions, end)]:
                nested, parent = False, None
                for parent in self.fm.ancestors(node):
                    if parent is loop.body or parent is loop:
                        break
                    if isinstance(parent, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                        parent = loop
                        break
                    nested = nested or isinstance(parent, (cst.For, cst.While))
                if parent is loop.body and (kind is cst.Return or not nested):
                    found.append(node)
        return sorted(found, key=lambda node: self.order[id(node)])
