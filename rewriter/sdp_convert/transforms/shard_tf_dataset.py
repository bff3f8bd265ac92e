"""Give each worker its own shard of the training ``tf.data`` dataset.

Before::

    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(1000).batch(32)
    for step, (xb, yb) in enumerate(ds.take(500)):
        train_step(xb, yb)

After::

    ds = (tf.data.Dataset.from_tensor_slices((x, y)).apply(sdp.shard)
          .shuffle(1000).batch(32))
    for step, (xb, yb) in enumerate(ds.take(500 // sdp.size())):
        train_step(xb, yb)

Why: data parallelism only pays when workers read different samples. ``sdp.shard`` (the
runtime's ``dataset.shard(size, rank)`` that also gives every worker the same number of elements,
so that no worker waits for the others at the end of an epoch) right
after the source (``from_tensor_slices``, ``from_tensors``, ``range``, ``list_files``,
``TFRecordDataset``, ``tfds.load``, ...) and before ``shuffle``/``batch``/``repeat`` splits the
*samples* into disjoint parts whatever the shuffle seed, and batch B per worker makes a global batch
of N*B. A ``take``/``skip`` that selects samples before any shuffle or batch stays in front of the
shard (the selection is the same set of samples); a ``take(n)`` after it counts steps (or samples)
per worker, so it becomes ``n // sdp.size()``: all workers together do the original amount of work.
``from_tensors`` makes one element (the whole tensors), which a shard would give to one worker only:
its shard goes after the first ``unbatch``/``repeat``/``flat_map``/``interleave``, and without one
the dataset is reported instead.

A loop that counts its own steps and pulls the batches with ``next(it)`` (``for step in
range(STEPS)``, ``while step < STEPS`` with ``step += 1``) gets its count divided the same way
(``range(STEPS // sdp.size())``) unless the dataset repeats forever (``.repeat()`` with no ``take``
after it): each worker's shard holds 1/N of the batches, and the loop would stop with
StopIteration. A count the converter cannot divide safely (``range(start, stop)``, a call of the
script's own, ``while True``, a generator that may not end) is reported; a count taken from the
sharded dataset itself (``len(ds)``, ``ds.cardinality()``), a new iterator on every step and a
``try`` that handles StopIteration need nothing.

Only the *training* dataset is sharded: the one iterated by the loop that applies the gradients
(followed through ``enumerate``, ``iter``/``next``, variables, step-by-step reassignment, helper
functions and parameters) and the one given to Keras ``fit``. Validation data is left alone so that
every worker evaluates the same data. Sources that shuffle by themselves without a seed
(``image_dataset_from_directory``, ``make_csv_dataset``, ``list_files`` without ``shuffle=False``,
``tfds.load(shuffle_files=True)``) are reported: their order differs between workers, so their
shards would overlap; Keras utilities that batch in a fixed order are sharded by whole batches.
A batch iterator class of the script that shuffles an index array in its ``__iter__``
(``program.batch_iterators``) gets that array split: ``order = sdp.shard(np.arange(n))``.
Where the plan goes (after a ``take``/``skip`` split or an ``adapt``, each input of a ``zip``, the
arrays handed to a helper, unseeded draws made rank 0's) is ``program.tfshards``'s decision; this
transform writes it and divides the step counts.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from ..base import Transform
from ..program.datasets import (
    DatasetTrace,
    dataset_length,
)
from ..program.index import file_index
from ..program.project import repairs_of
from ..program.syntax import (
    _EQUAL,
    code,
    counts_up,
    divided_by_size,
    findall,
    mentions_size,
    names_read,
    replace_arg,
)
from ..program.tfshards import plan_tf_shards

#: What a counting loop's ``range(...)`` may be wrapped in.
_RANGE_WRAPPERS = ("builtins.enumerate", "tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm")
_RANGES = ("builtins.range", "tqdm.trange", "tqdm.auto.trange", "tqdm.notebook.trange")
#: Calls a step count may be computed with and still be divided as it is.
_PLAIN_CALLS = (
    "builtins.int", "builtins.len", "builtins.min", "builtins.max", "builtins.round",
    "builtins.abs", "math.ceil", "math.floor",
)
_CATCHES_STOP = ("builtins.StopIteration", "builtins.Exception", "builtins.BaseException")


def _per_worker_names(trace: DatasetTrace, anchors: dict[cst.CSTNode, str]) -> set[str]:
    """The variables that hold the dataset once it is sharded."""
    chain = trace.chain
    position = max((i for i, s in enumerate(chain) if s in anchors), default=-1)
    return {s.value for s in chain[position + 1 :] if isinstance(s, cst.Name)}


class ShardTfDataset(Transform):
    DESCRIPTION = "Shard the training tf.data dataset by worker, right after its source."
    FRAMEWORKS = frozenset({"tensorflow"})
    #: Project mode: a module that builds another module's training data (``data``), whose
    #: ``tf.data`` source the whole-program contract found unsplit (``repair:shard_dataset``), or
    #: that calls another module's builder of the training and the evaluation data for training
    #: (``repair:shard_arguments``: its arrays are split at that call).
    PROJECT_ROLES = frozenset({"data", "repair:shard_dataset", "repair:shard_arguments",
                               "repair:sort_listing"})

    def prepare(self, module: cst.Module) -> None:
        #: step counts of loops that pull batches with next(): range call or comparison -> the
        #: expression to divide, and the iterator's code (for the report)
        self.bounds: dict[cst.CSTNode, tuple[cst.BaseExpression, str]] = {}
        self.index = file_index(self.fm)
        self.plan = plan = plan_tf_shards(self.fm)
        self.anchors, self.takes = plan.anchors, plan.takes
        # Data another module builds and shards (the whole-program model followed it there:
        # ``known_dataset``): nothing to say about it here.
        known = {id(node) for _, node in repairs_of(self.fm, "known_dataset")}
        for node, message, manual in plan.reports:
            if id(node) in known:
                continue
            self.record(node, message, manual=manual)
        if plan.anchors or plan.arrays or plan.permutations or plan.iterator_indices:
            self.add_runtime_import()
        for use in plan.uses:
            if use.sharded_by != "converter" or use.trace is None:
                continue
            for c, t in use.candidates:
                if t.source is use.trace.source and c.loop is not None and c.next_call is not None:
                    self._plan_steps(t, c.loop, c.next_call)

    # -- loops that count their own steps over next(it) ------------------------------------------

    def _plan_steps(self, trace: DatasetTrace, loop: cst.For | cst.While, call: cst.Call) -> None:
        """``for step in range(STEPS): next(it)`` over sharded data: each worker's shard has 1/N of
        the batches, so unless the data repeats forever the loop would run out (StopIteration)."""
        if len(call.args) != 1 or self._catches_stop(call, loop):
            return  # next() with a default, or StopIteration handled
        if self._fresh_iterator(call, loop):
            return  # a new iterator on every step
        length = dataset_length(trace)
        if length == "infinite":
            return
        iterator = code(call.args[0].value)
        holder, bound = self._step_bound(loop)
        datasets = _per_worker_names(trace, self.anchors)
        if bound is not None and (
            mentions_size(self.fm, bound) or self._per_worker(bound, datasets)
        ):
            return  # counted per worker already (len(ds) of the sharded dataset, ...)
        if length == "finite" and holder is not None and bound is not None and self._is_plain(
            bound
        ):
            self.bounds[holder] = (bound, iterator)
            return
        if isinstance(loop, cst.For):
            header = f"for {code(loop.target)} in {code(loop.iter)}"
        else:
            header = f"while {code(loop.test)}"
        steps = f" ({code(divided_by_size(bound, self.sdp))})" if bound is not None else ""
        maybe = ""
        if length == "unknown":
            ends = "generator" if "generator" in trace.source_name else "data"
            maybe = f"if the {ends} ends, "
        self.record(
            loop,
            f"`{header}` counts its own steps over next({iterator}), and each worker's shard of "
            f"the training data holds 1/{self.sdp}.size() of the batches: {maybe}run "
            f"1/{self.sdp}.size() of the steps{steps} or .repeat() the dataset, or it stops with "
            f"StopIteration",
            manual=True,
        )

    def _catches_stop(self, call: cst.Call, loop: cst.CSTNode) -> bool:
        """Whether ``call`` runs in a ``try`` (inside ``loop``) that handles StopIteration."""
        child: cst.CSTNode = call
        for parent in self.ancestors(call):
            if parent is loop:
                return False
            if isinstance(parent, cst.Try) and child is parent.body:
                for handler in parent.handlers:
                    if handler.type is None:
                        return True
                    types = (
                        [e.value for e in handler.type.elements]
                        if isinstance(handler.type, cst.Tuple)
                        else [handler.type]
                    )
                    if any(self.refers_to(t, *_CATCHES_STOP) for t in types):
                        return True
            child = parent
        return False

    def _fresh_iterator(self, call: cst.Call, loop: cst.CSTNode) -> bool:
        """Whether the iterator of ``next(...)`` is made anew inside ``loop``."""
        value = call.args[0].value
        if isinstance(value, cst.Call):
            return True  # next(iter(ds)): the first batch every time
        if isinstance(value, cst.Name):
            binding = self.index.reaching(value.value, call)
            bindings = [binding] if binding is not None else []
        elif isinstance(value, cst.Attribute):
            bindings = self.index.attribute_bindings.get(code(value), [])
        else:
            return False
        return any(loop in self.ancestors(b.stmt) for b in bindings)

    def _step_bound(
        self, loop: cst.For | cst.While
    ) -> tuple[cst.CSTNode | None, cst.BaseExpression | None]:
        """(node to rewrite, the step count in it): ``range(STEPS)`` and ``STEPS``, or
        ``step < STEPS`` and ``STEPS`` for a while loop that counts with ``step += 1``."""
        if isinstance(loop, cst.For):
            iterable = loop.iter
            while (
                isinstance(iterable, cst.Call)
                and iterable.args
                and self.refers_to(iterable.func, *_RANGE_WRAPPERS)
            ):
                iterable = iterable.args[0].value
            if not (isinstance(iterable, cst.Call) and self.refers_to(iterable.func, *_RANGES)):
                return None, None
            args = iterable.args
            if any(a.keyword is not None or a.star for a in args):
                return None, None
            if len(args) == 1:
                return iterable, args[0].value
            start = args[0].value if len(args) == 2 else None
            if isinstance(start, cst.Integer) and start.value == "0":  # range(0, STEPS)
                return iterable, args[1].value
            return None, args[-1].value if len(args) == 2 else None
        test = loop.test
        if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1):
            return None, None
        operator = test.comparisons[0].operator
        comparator = test.comparisons[0].comparator
        if isinstance(operator, (cst.LessThan, cst.LessThanEqual)):
            counter, bound = test.left, comparator
        elif isinstance(operator, (cst.GreaterThan, cst.GreaterThanEqual)):
            counter, bound = comparator, test.left
        else:
            return None, None
        if not (isinstance(counter, cst.Name) and counts_up(loop.body, counter.value)):
            return None, None
        return test, bound

    def _is_plain(self, expr: cst.BaseExpression) -> bool:
        """A step count that can be divided as it is: names, numbers, arithmetic, int()/len()."""
        if isinstance(expr, (cst.Integer, cst.Name)):
            return True
        if isinstance(expr, cst.Attribute):
            return self._is_plain(expr.value)
        if isinstance(expr, cst.Subscript):
            return self._is_plain(expr.value) and all(
                isinstance(e.slice, cst.Index)
                and isinstance(e.slice.value, (cst.Integer, cst.SimpleString))
                for e in expr.slice
            )
        if isinstance(expr, cst.BinaryOperation):
            return self._is_plain(expr.left) and self._is_plain(expr.right)
        if isinstance(expr, cst.UnaryOperation):
            return self._is_plain(expr.expression)
        if isinstance(expr, cst.Call):
            return self.refers_to(expr.func, *_PLAIN_CALLS) and all(
                a.keyword is None and not a.star and self._is_plain(a.value) for a in expr.args
            )
        return False

    def _per_worker(self, expr: cst.CSTNode, datasets: set[str], depth: int = 0) -> bool:
        """Whether ``expr`` counts the sharded data itself (``len(ds)``, ``ds.cardinality()``),
        directly or through the variables it reads."""
        if findall(expr, m.Call(func=m.Attribute(attr=m.Name("cardinality")))):
            return True
        for name in names_read(expr):
            if name.value in datasets:
                return True
            binding = self.index.reaching(name.value, name)
            if (
                depth < 3
                and binding is not None
                and binding.kind == "assign"
                and binding.value is not None
                and not binding.unpacked
                and self._per_worker(binding.value, datasets, depth + 1)
            ):
                return True
        return False

    def leave_Comparison(
        self, original_node: cst.Comparison, updated_node: cst.Comparison
    ) -> cst.BaseExpression:
        planned = self.bounds.get(original_node)
        if planned is None:
            return updated_node
        bound, iterator = planned
        if bound is original_node.left:
            new = updated_node.with_changes(left=divided_by_size(updated_node.left, self.sdp))
        else:
            target = updated_node.comparisons[0]
            new = updated_node.with_changes(
                comparisons=[
                    target.with_changes(comparator=divided_by_size(target.comparator, self.sdp))
                ]
            )
        self.record(
            original_node,
            f"{code(original_node)} -> {code(new)}: each worker does its part of the steps "
            f"(next({iterator}) would run out of its shard)",
        )
        return new

    def _shard(self, original: cst.CSTNode, updated: cst.BaseExpression) -> cst.BaseExpression:
        where = "before shuffle/batch"
        if original in self.plan.batched:
            where = "by whole batches (it batches by itself, in the same order on every worker)"
        elif original in self.plan.after_helper:
            helper, mapped = self.plan.after_helper[original]
            mapping = "; its map still runs on all the elements on every worker" if mapped else ""
            where = (f"after {helper}() returns it (it builds the evaluation data too{mapping}), "
                     "before shuffle/batch")
        elif original in self.plan.after_split:
            where = "after the split of the training data, before shuffle/batch"
        self.record(
            original,
            f"training data from {self.anchors[original]}: .apply({self.sdp}.shard) {where}, "
            f"each worker reads its own part (the same number of elements on every worker, "
            f"padded like DistributedSampler)",
        )
        return cst.Call(
            func=cst.Attribute(value=updated, attr=cst.Name("apply")),
            args=[cst.Arg(cst.parse_expression(f"{self.sdp}.shard"))],
        )

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        split_at = self.plan.listings.get(original_node)
        if split_at is not None:  # the file paths split at ``split_at`` come from this listing
            self.record(original_node, (
                f"{code(original_node)} -> sorted(...): the file paths split between the workers "
                f"at {split_at} are listed here in the file system's order, which may differ "
                f"between workers; sorted, every worker splits the same list"))
            return cst.Call(func=cst.Name("sorted"), args=[cst.Arg(updated_node)])
        planned = self.bounds.get(original_node)
        if planned is not None:
            bound, iterator = planned
            position = next(i for i, a in enumerate(original_node.args) if a.value is bound)
            count = updated_node.args[position]
            updated_node = replace_arg(updated_node, count, divided_by_size(count.value, self.sdp))
            self.record(
                original_node,
                f"{code(original_node)} -> {code(updated_node)}: each worker does its part of the "
                f"steps (next({iterator}) would run out of its shard)",
            )
        if original_node in self.takes:
            count = updated_node.args[0]
            self.record(
                original_node,
                f"take({code(count.value)}) -> take({code(count.value)} // {self.sdp}.size()): "
                f"each worker does its part of the steps",
            )
            updated_node = replace_arg(updated_node, count, divided_by_size(count.value, self.sdp))
        if original_node in self.plan.permutations:
            self.record(
                original_node,
                f"{code(original_node)} -> {self.sdp}.broadcast_object(..., root_rank=0): the data "
                f"split between workers comes from this random draw, which must be the same on "
                f"every worker (rank 0's) for their parts not to overlap",
            )
            updated_node = cst.Call(  # type: ignore[assignment]
                func=cst.parse_expression(f"{self.sdp}.broadcast_object"),
                args=[
                    cst.Arg(updated_node),
                    cst.Arg(cst.Integer("0"), keyword=cst.Name("root_rank"), equal=_EQUAL),
                ],
            )
        if original_node in self.plan.iterator_indices:
            cls = self.plan.iterator_indices[original_node]
            self.record(
                original_node,
                f"{code(original_node)} -> {self.sdp}.shard({code(original_node)}): {cls} shuffles "
                f"this index array and yields its batches, so each worker takes its own part of "
                f"the indices (the same number on every worker) before shuffling it",
            )
            return cst.Call(func=cst.parse_expression(f"{self.sdp}.shard"),
                            args=[cst.Arg(updated_node)])
        if original_node in self.anchors:
            return self._shard(original_node, updated_node)
        return updated_node

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        if original_node in self.anchors:
            return self._shard(original_node, updated_node)
        return updated_node

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        """An array handed to a helper that builds the training and the test datasets."""
        helper, others = self.plan.arrays.get(original_node.value, (None, ""))
        if helper is None:
            return updated_node
        array = code(original_node.value)
        self.record(
            original_node.value,
            f"{array} -> {self.sdp}.shard({array}): {helper}() builds the training data from "
            f"it{others}, so each worker gets every {self.sdp}.size()-th sample of it",
        )
        split = cst.Call(
            func=cst.parse_expression(f"{self.sdp}.shard"), args=[cst.Arg(updated_node.value)]
        )
        return updated_node.with_changes(value=split)
