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
every worker evaluates the same data. Sources that batch or shuffle by themselves
(``image_dataset_from_directory``, ``make_csv_dataset``, ``list_files`` without ``shuffle=False``,
``tfds.load(shuffle_files=True)``) are reported: their order differs between workers, so their
shards would overlap.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from ..base import Transform
from ..program.datasets import (
    DatasetTrace,
    _method,
    _short,
    dataset_length,
    trace_dataset,
    training_dataset_uses,
)
from ..program.index import file_index
from ..program.syntax import (
    arg_named,
    code,
    counts_up,
    divided_by_size,
    mentions_size,
    names_read,
    replace_arg,
)

#: Operations after which a ``take``/``skip`` no longer selects the same samples on every worker.
_ORDERING = frozenset(
    {"shuffle", "batch", "padded_batch", "ragged_batch", "repeat", "unbatch", "rebatch",
     "bucket_by_sequence_length", "window", "interleave", "flat_map", "prefetch", "cache"}
)
#: ``from_tensors`` makes ONE element (the whole tensors): sharded as it is, worker 0 would get it
#: and the others nothing. These make several elements of it; the shard goes after the first one.
_SPREADING = frozenset({"unbatch", "repeat", "flat_map", "interleave"})
_SINGLE_ELEMENT = "tensorflow.data.Dataset.from_tensors"
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

    def prepare(self, module: cst.Module) -> None:
        self.anchors: dict[cst.CSTNode, str] = {}  # node to append .shard() to -> its source
        self.takes: set[cst.CSTNode] = set()
        #: step counts of loops that pull batches with next(): range call or comparison -> the
        #: expression to divide, and the iterator's code (for the report)
        self.bounds: dict[cst.CSTNode, tuple[cst.BaseExpression, str]] = {}
        self.index = index = file_index(self)
        done: set[int] = set()
        sharded: set[int] = set()
        for where, candidates in training_dataset_uses(self):
            traces = [(c, trace_dataset(self, index, c.expr)) for c in candidates]
            usable = [(c, t) for c, t in traces if t.source is not None]
            if not usable:
                why = "; ".join(t.problem for _, t in traces if t.problem) or "no dataset found"
                self.record(
                    where,
                    f"training data not sharded ({why}): give each worker its own part, e.g. "
                    f".apply({self.sdp}.shard) right after the source",
                    manual=True,
                )
                continue
            trace = usable[0][1]
            assert trace.source is not None
            if id(trace.source) not in done:
                done.add(id(trace.source))
                if self._plan(trace):
                    sharded.add(id(trace.source))
            if id(trace.source) in sharded:
                for c, t in usable:
                    if t.source is trace.source and c.loop is not None and c.next_call is not None:
                        self._plan_steps(t, c.loop, c.next_call)

    def _plan(self, trace: DatasetTrace) -> bool:
        """Plan the shard of a training dataset; whether it is sharded here."""
        assert trace.source is not None
        source = _short(trace.source_name)
        if trace.problem is not None:
            self.record(
                trace.source,
                f"training data from {source} not sharded: {trace.problem}; build it so that every "
                f"worker sees the same order, then .apply({self.sdp}.shard)",
                manual=True,
            )
            return False
        chain = trace.chain
        if any(self._evened(s) for s in chain):
            return False  # .apply(sdp.shard) already
        existing = [s for s in chain if _method(s) == "shard"]
        if existing:
            if not any(mentions_size(self, s) for s in existing):
                self.record(
                    existing[0],
                    f"the training data is sharded already: make it .apply({self.sdp}.shard)",
                    manual=True,
                )
            return False
        anchor: cst.CSTNode = trace.source
        position = -1
        if trace.unpacked:
            names = [i for i, s in enumerate(chain) if isinstance(s, cst.Name)]
            position = names[0]
            anchor = chain[position]
        single = trace.source_name == _SINGLE_ELEMENT
        for i, step in enumerate(chain):
            method = _method(step)
            if i <= position or method is None:
                continue
            if single and method in _SPREADING:
                anchor, position, single = step, i, False
                break
            if method in _ORDERING:
                break
            if method in ("take", "skip") and not single:  # the same samples on every worker
                anchor, position = step, i
        if single:
            self.record(
                trace.source,
                f"training data from {source} not sharded: it is one element (the whole tensors), "
                f"which only one worker's shard would hold; use from_tensor_slices (or .unbatch()) "
                f"and .apply({self.sdp}.shard) before shuffle/batch",
                manual=True,
            )
            return False
        self.anchors[anchor] = source
        self.add_runtime_import()
        self._note_order(trace.source, trace.source_name)
        for step in chain[position + 1 :]:
            if _method(step) == "take" and isinstance(step, cst.Call) and step.args and not (
                mentions_size(self, step)
            ):
                self.takes.add(step)
        return True

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
        if bound is not None and (mentions_size(self, bound) or self._per_worker(bound, datasets)):
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
        if m.findall(expr, m.Call(func=m.Attribute(attr=m.Name("cardinality")))):
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

    def _note_order(self, source: cst.Call, name: str) -> None:
        """Sources that shuffle differently on each worker make overlapping shards."""
        if name.endswith("list_files"):
            shuffle = arg_named(source, "shuffle", 1)
            seed = arg_named(source, "seed", 2)
            if seed is None and not (shuffle is not None and code(shuffle.value) == "False"):
                self.record(
                    source,
                    "list_files shuffles the file names differently on each worker: pass "
                    "shuffle=False (or the same seed everywhere) so that the shards do not overlap",
                    manual=True,
                )
        elif name == "tensorflow_datasets.load":
            shuffle = arg_named(source, "shuffle_files")
            if shuffle is not None and code(shuffle.value) != "False":
                self.record(
                    source,
                    "tfds.load(shuffle_files=True) reads the files in a different order on each "
                    "worker: pass shuffle_files=False or a read_config with a fixed shuffle_seed "
                    "so that the shards do not overlap",
                    manual=True,
                )

    def _evened(self, step: cst.CSTNode) -> bool:
        """``.apply(sdp.shard)``: this transform's own shard."""
        return (
            _method(step) == "apply"
            and isinstance(step, cst.Call)
            and len(step.args) == 1
            and self.refers_to(step.args[0].value, f"{self.state.runtime_module}.shard")
        )

    def _shard(self, original: cst.CSTNode, updated: cst.BaseExpression) -> cst.BaseExpression:
        self.record(
            original,
            f"training data from {self.anchors[original]}: .apply({self.sdp}.shard) before "
            f"shuffle/batch, each worker reads its own part (the same number of elements on every "
            f"worker, padded like DistributedSampler)",
        )
        return cst.Call(
            func=cst.Attribute(value=updated, attr=cst.Name("apply")),
            args=[cst.Arg(cst.parse_expression(f"{self.sdp}.shard"))],
        )

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
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
        if original_node in self.anchors:
            return self._shard(original_node, updated_node)
        return updated_node

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        if original_node in self.anchors:
            return self._shard(original_node, updated_node)
        return updated_node
