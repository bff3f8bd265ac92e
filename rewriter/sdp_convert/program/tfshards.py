"""Where the training ``tf.data`` pipelines (and Keras ``fit`` arrays) get split between workers,
and whether the data reaching each training loop or ``fit`` is split at all.

``plan_tf_shards`` decides, once per file, for every place training data is consumed (a loop
around ``apply_gradients``, Keras ``fit``): the node after which ``.apply(sdp.shard)`` goes, or the
arguments of a helper's call that ``sdp.shard`` splits, or why nothing is split (a manual note).
``shard_tf_dataset`` writes the plan; ``tf_training_data`` tells any transform whether the data of
a loop or ``fit`` is sharded (by the converter, or already by the script), so that a learning rate
is scaled only where it is.

The rules (docs/tf-sharding.md, "What is sharded where"):

* One shard per source, before any shuffle, batch or repeat: right after the source, or after a
  ``take``/``skip`` that selects samples before any reordering (the same samples on every worker).
* Not at a point the evaluation data also comes from: a value that is split (``ds.take(n)`` for
  training, ``ds.skip(n)`` for testing) or read by a preprocessing layer's ``adapt`` (which must
  see the same data on every worker) is sharded only on the training side, after the split.
  If only an unseeded shuffle comes before that point, the workers' orders differ and the shards
  would overlap: a note instead.
* ``Dataset.zip((a, b))``: each input sharded at its own source, once; an input the script shards
  already is left as it is, and the zip itself is never sharded.
* Keras utilities that batch by themselves (``image_dataset_from_directory``,
  ``timeseries_dataset_from_array``, ...) are sharded by whole batches, when their order is the
  same on every worker (``shuffle=False``, or a ``seed``); unseeded shuffling gets a note.
* A helper that builds the training and the test datasets from its arguments
  (``make_dataset(x_train, y_train)``, ``make_dataset(x_test, y_test)``): the training call's
  arrays are split (``make_dataset(sdp.shard(x_train), sdp.shard(y_train))``); one that makes
  its data itself (a folder it lists): what it returns for training, right after the call, when
  nothing up to there reorders or batches it (``_after_helper``).
* A pipeline the whole-program contract finds unsplit here, trained on in another module
  (``repair:shard_dataset``): by the same rules (``_Planner.repair``; the contract asks
  ``shards_at`` first), never after a shuffle or batch; the arrays a call of this module passes
  to another module's builder of the training and other data (``repair:shard_arguments``).
* ``fit`` given arrays (``fit(x, y)``, or ``fit(x)`` alone, or tuples/dicts of arrays) or a
  ``keras.utils.Sequence``/``PyDataset`` of the script's (every ``size()``-th batch): split by
  ``wrap_keras_fit`` with ``sdp.shard``.
* Arrays split between workers must be in the same order on every worker first: an unseeded
  ``np.random.permutation`` behind them becomes rank 0's (``sdp.broadcast_object``); in-place
  shuffles and ``train_test_split`` without ``random_state`` get a note.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from .batch_iterators import drawn_batches, is_preview, iterator_shard, shard_advice
from .datasets import (
    Candidate,
    DatasetTrace,
    _method,
    _short,
    holds_arrays,
    keras_sequence,
    trace_dataset,
    training_dataset_uses,
)
from .index import FileIndex, file_index, reaching_values
from .keras import (
    _SCHEDULE_RATES,
    fit_arg,
    image_iterator,
    iterator_seeded,
    keras_fit_calls,
    schedule_class,
)
from .permutations import unseeded_orders
from .project import fed_returns, imported_sites, repairs_of
from .scopes import method_of, param_for_arg
from .syntax import arg_named, code, findall, mentions_size

if TYPE_CHECKING:
    from .model import FileModel

#: Operations after which a ``take``/``skip`` no longer selects the same samples on every worker.
ORDERING = frozenset(
    {"shuffle", "batch", "padded_batch", "ragged_batch", "repeat", "unbatch", "rebatch",
     "bucket_by_sequence_length", "window", "interleave", "flat_map", "prefetch", "cache"}
)
#: ``from_tensors`` makes ONE element (the whole tensors): sharded as it is, worker 0 would get it
#: and the others nothing. These make several elements of it; the shard goes after the first one.
_SPREADING = frozenset({"unbatch", "repeat", "flat_map", "interleave"})
_SINGLE_ELEMENT = "tensorflow.data.Dataset.from_tensors"
_ZIP = "tensorflow.data.Dataset.zip"
#: Calls on a value that split it into a training and an evaluation part.
_SPLITS = frozenset({"take", "skip", "shard"})


@dataclass
class TrainingData:
    """One place training data is consumed, and whether it reaches there split by worker."""

    where: cst.CSTNode  # the outermost training loop, or the fit call
    #: "converter" (this conversion splits it), "script" (it is split already), or None.
    sharded_by: str | None
    #: The dataset's trace (None for arrays given to fit, or data the converter cannot follow).
    trace: DatasetTrace | None = None
    #: The expressions found there that hold a dataset, with their traces.
    candidates: list[tuple[Candidate, DatasetTrace]] = field(default_factory=list)
    #: Split on some of the paths that bind it only: which (``partly split: split on ...``).
    partly: str = ""

    @property
    def sharded(self) -> bool:
        return self.sharded_by is not None


@dataclass
class TfShardPlan:
    """What ``shard_tf_dataset`` writes (original nodes), and what it must report."""

    #: node to append ``.apply(sdp.shard)`` to -> the source it shards (for the report)
    anchors: dict[cst.CSTNode, str] = field(default_factory=dict)
    #: anchors of sources that batch by themselves (sharded by whole batches)
    batched: set[cst.CSTNode] = field(default_factory=set)
    #: anchors moved past the point the evaluation data branches off
    after_split: set[cst.CSTNode] = field(default_factory=set)
    #: anchors on what a helper that builds the evaluation data too returns for training ->
    #: the helper's name, and whether it maps every element before that point
    after_helper: dict[cst.CSTNode, tuple[str, bool]] = field(default_factory=dict)
    #: ``take(n)`` calls after a shard: ``n`` counts per worker now
    takes: set[cst.CSTNode] = field(default_factory=set)
    #: helper-call arguments to wrap in ``sdp.shard(...)`` -> the helper's name, and what its
    #: other calls do, for the report (" (and the evaluation data from other arrays)", or "")
    arrays: dict[cst.CSTNode, tuple[str, str]] = field(default_factory=dict)
    #: listing calls whose file paths are split (``sort_listing``) -> where they are split;
    #: wrapped in ``sorted(...)``, the same order on every worker
    listings: dict[cst.CSTNode, str] = field(default_factory=dict)
    #: (node, message, manual)
    reports: list[tuple[cst.CSTNode, str, bool]] = field(default_factory=list)
    uses: list[TrainingData] = field(default_factory=list)
    #: unseeded permutations behind split arrays: rank 0's is used on every worker
    permutations: dict[cst.Call, str] = field(default_factory=dict)
    #: index arrays of batch iterator classes to wrap in ``sdp.shard(...)`` -> the class's name
    iterator_indices: dict[cst.BaseExpression, str] = field(default_factory=dict)
    #: id(source) -> how it is sharded ("converter", "script" or None)
    sources: dict[int, str | None] = field(default_factory=dict)


def tf_training_data(fm: FileModel) -> list[TrainingData]:
    """Every place of the file where TensorFlow training data is consumed (training loops and
    Keras ``fit``), and whether the data reaching it is split between workers: by this conversion
    (``shard_tf_dataset``, ``wrap_keras_fit``) or by the script itself. A learning rate should be
    scaled only for those that are."""
    return plan_tf_shards(fm).uses


def data_sharded_for(fm: FileModel, node: cst.CSTNode) -> bool | None:
    """Whether the training data consumed at ``node`` (a training loop around it, or a ``fit``
    call at or around it) is split between workers; None when no training use is there."""
    found = None
    for use in tf_training_data(fm):
        if use.where is node or use.where in fm.ancestors(node) or (
            node in fm.ancestors(use.where)
        ):
            if not use.sharded:
                return False
            found = True
    return found


def plan_tf_shards(fm: FileModel) -> TfShardPlan:
    """The file's plan, computed once."""
    facts = fm.facts
    if isinstance(facts.tf_shards, TfShardPlan):
        return facts.tf_shards
    planner = _Planner(fm)
    plan = planner.plan
    fed = {id(ret): (value, feed) for ret, value, feed in fed_returns(fm)}
    imported = imported_sites(fm)
    # Loops whose data another module of the run builds and splits (the whole-program
    # contract followed it there: ``known_dataset``).
    split_elsewhere = [node for _, node in repairs_of(fm, "known_dataset")]
    argument_repairs = repairs_of(fm, "shard_arguments")
    # Data bound on several paths, split on some of them only (``partly_split``: the contract
    # followed each): what it says of each path.
    partly = repairs_of(fm, "partly_split")
    for where, candidates in training_dataset_uses(fm):
        if any(node is where or where in fm.ancestors(node) for node in split_elsewhere):
            plan.uses.append(TrainingData(where, "converter"))
            continue
        paths = next((r.detail for r, node in partly
                      if node is where or where in fm.ancestors(node)), None)
        if paths is not None:
            planner.note(where, f"training data {paths}: give each worker its own part on the "
                         "other paths too (the rate is scaled only when it is split on all)")
            plan.uses.append(TrainingData(where, None, partly=paths))
            continue
        traces = [(c, trace_dataset(fm, planner.index, c.expr)) for c in candidates]
        usable = [(c, t) for c, t in traces if t.source is not None]
        source = next((s for site, s in imported if site.loop is where
                       or where in fm.ancestors(site.loop)), None)
        if not usable and source is not None:  # built in another module, sharded there
            plan.uses.append(TrainingData(where, "converter" if source.sharded else None))
            if not source.sharded:
                planner.note(where, f"training data from {source.callee}(), built in "
                             f"{source.at}: it is sharded only if that module is converted in "
                             "the same run: convert both together (or the directory)")
            continue
        if not usable and any(_handed_split(planner.index, c.expr, argument_repairs)
                              for c in candidates):
            # Made by a builder call whose arrays are split (``shard_arguments``, below).
            plan.uses.append(TrainingData(where, "converter"))
            continue
        if not usable:
            shard = next((s for c in candidates
                          if (s := iterator_shard(fm, planner.index, c.expr))), None)
            if shard is not None:  # a batch iterator class of the script: split its indices
                if shard.sharded_by == "converter":
                    plan.iterator_indices[shard.indices] = shard.cls.name.value
                plan.uses.append(TrainingData(where, shard.sharded_by))
                continue
            why = "; ".join(t.problem for _, t in traces if t.problem) or "no dataset found"
            advice, known = shard_advice(fm, planner.index,
                                         candidates[0].expr if candidates else None, planner.sdp)
            drawn = None if candidates else drawn_batches(fm, where, planner.sdp)
            if drawn is not None:
                advice, known = drawn, True
            branches = max((_values_here(planner.index, c.expr) for c in candidates), default=0)
            if branches and not known:
                # ``if a: ds = f() elif b: ds = g()``: the trace above follows the last one.
                why += (f", one of the {branches} values it may have here (the whole-program "
                        "check follows each)")
            planner.note(where, f"training data not sharded{'' if known else f' ({why})'}: "
                         f"{advice}")
            plan.uses.append(TrainingData(where, None, traces[0][1] if traces else None))
            continue
        trace = usable[0][1]
        before = set(plan.anchors)
        plan.uses.append(TrainingData(where, planner.source(trace), trace, usable))
        if id(where) in fed:  # a dataset returned for another module's training loop
            _, feed = fed[id(where)]
            for anchor in set(plan.anchors) - before:
                plan.anchors[anchor] += f" (used by {feed.used_by})"
            if plan.uses[-1].sharded and trace.source is not None:
                fm.facts.exports.append((
                    trace.source, feed.function, feed.index, False,
                    plan.uses[-1].sharded_by == "script",
                ))
    # Data another module trains on, found unsplit here by the whole-program contract
    # (``repair:shard_dataset``): sharded there by the same rules, or a note says why not.
    for repair, node in repairs_of(fm, "shard_dataset"):
        planner.repair(node, repair.detail)
    # The call of another module's builder of the training and the evaluation data that makes
    # the training data (``shard_arguments``: ``builder:0,1``): its arrays split here.
    # (``builder:0:once``: a builder called only here, which shuffles or batches inside.)
    for repair, node in argument_repairs:
        helper, _, rest = repair.detail.partition(":")
        positions, _, once = rest.partition(":")
        args = node.args if isinstance(node, cst.Call) else ()
        for position in (int(p) for p in positions.split(",") if p.isdigit()):
            if position < len(args) and not split_already(fm, args[position]):
                plan.arrays[args[position].value] = (
                    helper, "" if once == "once" else " (its other calls keep their data whole)")
    for repair, node in repairs_of(fm, "sort_listing"):
        parent = fm.parent(fm.parent(node))
        if not (isinstance(parent, cst.Call) and isinstance(parent.func, cst.Name)
                and parent.func.value == "sorted"):  # (sorted already)
            plan.listings[node] = repair.detail
    split: list[cst.BaseExpression] = list(plan.arrays)  # type: ignore[arg-type]
    for fit in keras_fit_calls(fm):
        x, y = fit_arg(fit, "x"), fit_arg(fit, "y")
        inputs = fit_inputs_to_split(fm, fit)
        if x is None or (inputs is None and not split_already(fm, x)):
            continue
        # Split by wrap_keras_fit's sdp.shard, or by the script already.
        plan.uses.append(TrainingData(fit, "converter" if inputs else "script"))
        sequence = keras_sequence(fm, x.value, fit) if y is None else None
        if sequence is not None:
            planner.sequence_order(sequence)
        elif inputs is not None:
            split += [a.value for k in inputs[0] if (a := fit_arg(fit, k))]
    orders = unseeded_orders(fm, split)
    broadcast = f"{fm.runtime_module}.broadcast_object"
    plan.permutations = {
        call: what
        for call, what in orders.permutations.items()
        if not (  # rank 0's already
            isinstance(arg := fm.parent(call), cst.Arg)
            and isinstance(outer := fm.parent(arg), cst.Call)
            and fm.refers_to(outer.func, broadcast)
        )
    }
    for node, what in orders.notes:
        planner.note(
            node,
            f"{what}: their parts overlap; seed it (the same seed on every worker), or split the "
            f"data before shuffling it",
        )
    facts.tf_shards = plan
    return plan


def _values_here(index: FileIndex, expr: cst.BaseExpression) -> int:
    """How many assignments the name ``expr`` (or the first argument of a wrapper call around
    it, ``tqdm(ds)``) may have at its read, where there are several (``if a: ds = f() else:
    ds = g()``); 0 otherwise."""
    while isinstance(expr, cst.Call) and expr.args:
        expr = expr.args[0].value
    seen = index.referents(expr) if isinstance(expr, cst.Name) else []
    return len(seen) if len(seen) > 1 and all(b.kind == "assign" for b in seen) else 0


def _handed_split(index: FileIndex, expr: cst.BaseExpression, repairs: list) -> bool:
    """``expr`` (or the value of the name ``expr``) is a builder call whose arrays the
    whole-program contract has split (``shard_arguments``), or a chain of methods on one
    (``build(x).map(f)``)."""
    binding = index.reaching(expr.value, expr) if isinstance(expr, cst.Name) else None
    value = binding.value if binding is not None else expr
    while value is not None:
        if any(value is node for _, node in repairs):
            return True
        value = value.func.value if isinstance(value, cst.Call) and isinstance(
            value.func, cst.Attribute) else None
    return False


def shards_at(fm: FileModel, node: cst.CSTNode) -> bool:
    """Whether the training data another module trains on, built here and found unsplit at
    ``node`` (by the whole-program contract), can be sharded there by the rules of this module
    (``plan_tf_shards`` does it; the contract asks before it counts the data as split)."""
    planner = _Planner(fm)
    return planner.repair(node, "")


def fit_inputs_to_split(fm: FileModel, fit: cst.Call) -> tuple[list[str], bool] | None:
    """What ``wrap_keras_fit`` splits with ``sdp.shard`` in this ``fit`` call: the keywords of the
    arguments (``x``, ``y``, ``sample_weight``), and whether ``x`` is a Keras ``Sequence`` of the
    script's. None when ``fit`` gets a dataset, a generator, what the converter cannot follow, or
    arrays the script splits already."""
    x, y = fit_arg(fit, "x"), fit_arg(fit, "y")
    if x is None:
        return None
    iterator = image_iterator(fm, fit)
    if iterator is not None and iterator_seeded(iterator) is None:
        return None  # its order may differ on each worker (port_fit_generator seeds the others)
    if y is None and (keras_sequence(fm, x.value, fit) is not None or iterator is not None):
        return None if split_already(fm, x) else (["x"], True)
    if y is None and not holds_arrays(fm, x.value, fit):
        return None
    keywords = ["x"] if y is None else ["x", "y"]
    if fit_arg(fit, "sample_weight") is not None:
        keywords.append("sample_weight")
    for keyword in keywords:
        arg = fit_arg(fit, keyword)
        if arg is None or split_already(fm, arg):
            return None
    return keywords, False


def split_already(fm: FileModel, arg: cst.Arg) -> bool:
    """``x[sdp.rank()::sdp.size()]`` or ``sdp.shard(x)``."""
    if isinstance(arg.value, cst.Subscript) and mentions_size(fm, arg.value):
        return True
    return isinstance(arg.value, cst.Call) and fm.refers_to(
        arg.value.func, f"{fm.runtime_module}.shard"
    )


class _Planner:
    def __init__(self, fm: FileModel) -> None:
        self.fm = fm
        self.sdp = fm.sdp
        self.index: FileIndex = file_index(fm)
        self.plan = TfShardPlan()

    def note(self, node: cst.CSTNode, message: str) -> None:
        """A manual note, once: the same data (``load_data()`` read by two loops) is noted where
        it is first trained on, not again at each loop."""
        if not any(manual and said == message for _, said, manual in self.plan.reports):
            self.plan.reports.append((node, message, True))

    def source(self, trace: DatasetTrace) -> str | None:
        """How the source of ``trace`` is sharded, planning its shard the first time."""
        assert trace.source is not None
        key = id(trace.source)
        if key not in self.plan.sources:
            self.plan.sources[key] = None  # a zip of itself, say: planned once
            self.plan.sources[key] = self._plan(trace)
        return self.plan.sources[key]

    # -- one pipeline ------------------------------------------------------------------------

    def repair(self, node: cst.CSTNode, used_by: str) -> bool:
        """The pipeline another module trains on (``used_by``), to be sharded at ``node`` (its
        source, or the last step of its own chain before it is shuffled or batched): there if
        nothing before it orders the data differently on each worker or batches it, by each
        input of a ``Dataset.zip``; else a note. Whether it is sharded (by this or already)."""
        if node in self.plan.anchors or self._sharded_after(node):
            return True
        if not isinstance(node, cst.BaseExpression):
            return False
        trace = trace_dataset(self.fm, self.index, node)
        where = f" (trained on in {used_by})" if used_by else ""
        tail = f", trained on in {used_by}" if used_by else ""
        if trace.source is None:
            self.note(node, f"training data{where} not sharded ({trace.problem}): "
                            f".apply({self.sdp}.shard) it right after its source, before any "
                            "shuffle or batch")
            return False
        if trace.source_name == _ZIP:
            before = set(self.plan.anchors)
            sharded = self.source(trace)
            for anchor in set(self.plan.anchors) - before:
                self.plan.anchors[anchor] += tail
            return sharded is not None
        if any(self._evened(s) or _method(s) == "shard" for s in trace.chain):
            return True
        source = _short(trace.source_name)
        ordered = next((s for s in trace.chain if _method(s) in ORDERING), None)
        if ordered is not None:
            self.note(ordered, f"training data from {source}{where} not sharded: its "
                               f"{_method(ordered)}() comes before the point where it would be "
                               "split, so each worker's part would overlap the others' (or be "
                               f"whole batches): .apply({self.sdp}.shard) it before this "
                               f"{_method(ordered)}()")
            return False
        if trace.source_name == _SINGLE_ELEMENT or self._note_order(
            trace.source, trace.source_name
        ):
            if trace.source_name == _SINGLE_ELEMENT:
                self.note(trace.source, f"training data from {source} not sharded: it is one "
                                        "element (the whole tensors), which only one worker's "
                                        f"shard would hold; use from_tensor_slices (or "
                                        f".unbatch()) and .apply({self.sdp}.shard)")
            return False
        if trace.problem is not None and not self._batched_in_order(trace):
            self.note(trace.source, f"training data from {source} not sharded: {trace.problem}; "
                                    "build it so that every worker sees the same order, then "
                                    f".apply({self.sdp}.shard)")
            return False
        self.plan.anchors[node] = f"{_short(code(node).split('(')[0])}(...){tail}"
        if trace.problem is not None:
            self.plan.batched.add(node)
        return True

    def _plan(self, trace: DatasetTrace) -> str | None:
        assert trace.source is not None
        source = _short(trace.source_name)
        chain = trace.chain
        if any(self._evened(s) for s in chain):
            return "script"  # .apply(sdp.shard) already
        existing = [s for s in chain if _method(s) == "shard"]
        if existing:
            if not any(mentions_size(self.fm, s) for s in existing):
                self.note(
                    existing[0],
                    f"the training data is sharded already: make it .apply({self.sdp}.shard)",
                )
            return "script"
        if trace.source_name == _ZIP:
            shared_helper = self._shared_helper(trace, trace.source)
            if shared_helper is not None:  # its inputs are the evaluation data's too
                return self._after_helper(trace, shared_helper)
            return self._zip(trace)
        if trace.problem is not None and not self._batched_in_order(trace):
            self.note(
                trace.source,
                f"training data from {source} not sharded: {trace.problem}; build it so that "
                f"every worker sees the same order, then .apply({self.sdp}.shard)",
            )
            return None
        anchor: cst.CSTNode = trace.source
        position = -1
        if trace.unpacked:
            names = [i for i, s in enumerate(chain) if isinstance(s, cst.Name)]
            position = names[0]
            anchor = chain[position]
        single = trace.source_name == _SINGLE_ELEMENT
        moved = False
        # The evaluation data (a split, adapt's data) comes from the value held there: the shard
        # goes after it, on the training side.
        shared = self._shared_until(chain)
        if shared > position:
            unseeded = [s for s in chain[position + 1 : shared] if self._reorders(s)]
            if unseeded:
                self.note(
                    unseeded[0],
                    f"training data from {source} not sharded: the training and the evaluation "
                    f"data are split after this {_method(unseeded[0])}, which orders the data "
                    f"differently on each worker; give it a seed (the same on every worker), then "
                    f".apply({self.sdp}.shard) on the training side of the split",
                )
                return None
            anchor, position = chain[shared], shared
            moved = True
            single = single and not any(_method(s) in _SPREADING for s in chain[: shared + 1])
        for i, step in enumerate(chain):
            method = _method(step)
            if i <= position or method is None:
                continue
            if single and method in _SPREADING:
                anchor, position, single = step, i, False
                break
            if method in ORDERING:
                break
            if method in ("take", "skip") and not single:  # the same samples on every worker
                anchor, position = step, i
        if single:
            self.note(
                trace.source,
                f"training data from {source} not sharded: it is one element (the whole "
                f"tensors), which only one worker's shard would hold; use from_tensor_slices (or "
                f".unbatch()) and .apply({self.sdp}.shard) before shuffle/batch",
            )
            return None
        if self._note_order(trace.source, trace.source_name):
            return None  # the workers' orders differ: their shards would overlap
        shared_helper = self._shared_helper(trace, anchor)
        if shared_helper is not None:
            return self._helper_arguments(trace, shared_helper, chain, position)
        self.plan.anchors[anchor] = source
        if moved:
            self.plan.after_split.add(anchor)
        if trace.problem is not None:  # a batching utility, in the same order everywhere
            self.plan.batched.add(anchor)
        for step in chain[position + 1 :]:
            if _method(step) == "take" and isinstance(step, cst.Call) and step.args and not (
                mentions_size(self.fm, step)
            ):
                self.plan.takes.add(step)
        return "converter"

    def _zip(self, trace: DatasetTrace) -> str | None:
        """``Dataset.zip((a, b))``: each input sharded at its own source, once."""
        assert trace.source is not None
        parts = _zip_parts(trace.source)
        if not parts:
            self.note(trace.source, f"training data from Dataset.zip not sharded: shard each of "
                                    f"its inputs (.apply({self.sdp}.shard) after its source)")
            return None
        found: list[str | None] = []
        unfollowed: list[tuple[cst.BaseExpression, str | None]] = []
        for part in parts:
            inner = trace_dataset(self.fm, self.index, part, trace.source)
            if inner.source is None and _handed_split(
                self.index, part, repairs_of(self.fm, "shard_arguments")
            ):  # made by a builder call whose arrays are split (in the module that calls it)
                found.append("converter")
                continue
            if inner.source is None:
                unfollowed.append((part, inner.problem))
                found.append(None)
                continue
            found.append(self.source(inner))
        for part, problem in unfollowed:
            if any(found):
                advice = "shard it after its source, like the other inputs"
            else:  # nothing is sharded: not the zip either (its inputs may come shuffled)
                advice = (f"the zip is not sharded either (its inputs may come shuffled or "
                          f"batched already, differently on each worker): .apply({self.sdp}"
                          f".shard) each input right after its source, before its shuffle/batch")
            self.note(part, f"input {code(part)} of Dataset.zip not sharded ({problem}): "
                            f"{advice}")
        if all(f == "script" for f in found):
            return "script"
        if all(f is not None for f in found):
            return "converter"
        return None

    # -- where the evaluation data branches off ------------------------------------------------

    def _shared_until(self, chain: list[cst.CSTNode]) -> int:
        """The position of the last name in ``chain`` whose value the evaluation data (another
        split of it, ``adapt``) also comes from; -1 when there is none."""
        last = -1
        for i, step in enumerate(chain):
            if isinstance(step, cst.Name) and self._branches(step):
                last = i
        return last

    def _branches(self, name: cst.Name) -> bool:
        binding = self.index.reaching(name.value, name)
        if binding is None:
            return False
        for use in self.index.loads_of(name.value, binding.scope):
            if use is name or self.index.reaching(name.value, use) is not binding:
                continue
            if self._splits_or_adapts(use, 0):
                return True
        return False

    def _splits_or_adapts(self, node: cst.CSTNode, depth: int) -> bool:
        """``node`` (a use of a dataset) is split (``.take``/``.skip``) or reaches ``adapt``."""
        parent = self.fm.parent(node)
        if isinstance(parent, cst.Attribute) and parent.value is node:
            if parent.attr.value in _SPLITS:
                return not is_preview(self.fm, self.fm.parent(parent))
            call = self.fm.parent(parent)
            if isinstance(call, cst.Call) and call.func is parent and depth < 8:
                return self._splits_or_adapts(call, depth + 1)  # ds.map(...).adapt? follow on
            return False
        if isinstance(parent, cst.Arg):
            call = self.fm.parent(parent)
            return (
                isinstance(call, cst.Call)
                and isinstance(call.func, cst.Attribute)
                and call.func.attr.value == "adapt"
            )
        if isinstance(parent, cst.Assign) and depth < 8:  # text = ds.map(...); layer.adapt(text)
            targets = [t.target for t in parent.targets]
            if len(targets) == 1 and isinstance(targets[0], cst.Name):
                name = targets[0].value
                for use in self.index.loads_of(name, self.index.scope(parent)):
                    binding = self.index.reaching(name, use)
                    if binding is not None and binding.stmt is parent and self._adapted(use):
                        return True
        return False

    def _adapted(self, use: cst.CSTNode) -> bool:
        parent = self.fm.parent(use)
        call = self.fm.parent(parent) if isinstance(parent, cst.Arg) else None
        return (
            isinstance(call, cst.Call)
            and isinstance(call.func, cst.Attribute)
            and call.func.attr.value == "adapt"
        )

    def _reorders(self, step: cst.CSTNode) -> bool:
        """A step whose order differs between workers: ``shuffle`` without a seed."""
        if _method(step) != "shuffle" or not isinstance(step, cst.Call):
            return False
        return arg_named(step, "seed", 1) is None

    # -- Keras utilities that batch by themselves -------------------------------------------

    def _batched_in_order(self, trace: DatasetTrace) -> bool:
        """A batching utility whose batches come in the same order on every worker:
        ``shuffle=False``, a ``seed``, or ``timeseries_dataset_from_array`` (unshuffled unless
        asked)."""
        source = trace.source
        assert source is not None
        if not trace.problem or not trace.problem.endswith("shuffles and batches by itself"):
            return False
        if "make_csv_dataset" in trace.source_name:
            return False
        shuffle = arg_named(source, "shuffle")
        seed = arg_named(source, "seed")
        default_off = trace.source_name.endswith("timeseries_dataset_from_array")
        if seed is not None and code(seed.value) != "None":
            return True
        if shuffle is None:
            return default_off
        return code(shuffle.value) == "False"

    # -- helpers that build the training and the test data -------------------------------------

    def _shared_helper(
        self, trace: DatasetTrace, anchor: cst.CSTNode
    ) -> tuple[cst.FunctionDef, cst.Call] | None:
        """The function called several times that the shard would land in."""
        ancestors = self.fm.ancestors(anchor)
        for function, call, count in trace.functions:
            if count > 1 and function in ancestors:
                return function, call
        return None

    def _helper_arguments(
        self,
        trace: DatasetTrace,
        helper: tuple[cst.FunctionDef, cst.Call],
        chain: list[cst.CSTNode],
        position: int,
    ) -> str | None:
        """``def make(x, y): return from_tensor_slices((x, y))...`` called for the training and
        the test data: the training call's arrays are split instead (``make(sdp.shard(x), ...)``),
        which is the same as a shard right after the source."""
        function, call = helper
        assert trace.source is not None
        name = function.name.value
        arrays = self._source_arguments(trace.source, function, call)
        takes = [s for s in chain if _method(s) in ("take", "skip")]
        if trace.source_name != "tensorflow.data.Dataset.from_tensor_slices" or position >= 0 or (
            arrays is None or takes
        ):
            return self._after_helper(trace, helper)
        assert arrays is not None
        if all(split_already(self.fm, cst.Arg(a)) for a in arrays):
            return "script"  # make(sdp.shard(x), sdp.shard(y)) already
        for arg in arrays:
            if not split_already(self.fm, cst.Arg(arg)):
                self.plan.arrays[arg] = (name, " (and the evaluation data from other arrays)")
        return "converter"

    def _after_helper(
        self, trace: DatasetTrace, helper: tuple[cst.FunctionDef, cst.Call]
    ) -> str | None:
        """A helper called for the training and the evaluation data whose training call's
        arguments cannot be split (a folder it lists, a zip it makes): the shard goes on what it
        returns for training, right after the call, when nothing up to there reorders or batches
        the data (the same elements in the same order on every worker); else a note."""
        function, call = helper
        name = function.name.value
        chain = trace.chain
        outside = next((i for i, s in enumerate(chain) if function not in self.fm.ancestors(s)
                        and s is not call), None)
        if outside is not None and self._in_order(trace, chain[:outside]):
            step = chain[outside]
            anchor: cst.CSTNode = step if isinstance(step, cst.Name) else call
            self.plan.anchors[anchor] = _short(trace.source_name)
            inner = chain[:outside]
            if trace.source_name == _ZIP:
                inner += [s for p in _zip_parts(trace.source)  # type: ignore[arg-type]
                          for s in trace_dataset(self.fm, self.index, p, trace.source).chain]
            self.plan.after_helper[anchor] = (name, any(_method(s) == "map" for s in inner))
            for later in chain[outside + 1 :]:
                if _method(later) == "take" and isinstance(later, cst.Call) and later.args and (
                    not mentions_size(self.fm, later)
                ):
                    self.plan.takes.add(later)
            return "converter"
        self.note(
            call,
            f"training data not sharded: {name}() builds the training and the evaluation "
            f"data; shard the training dataset it returns before its shuffle/batch (e.g. pass "
            f"{self.sdp}.shard(x) for its arrays)",
        )
        return None

    def _in_order(self, trace: DatasetTrace, steps: list[cst.CSTNode], depth: int = 0) -> bool:
        """Whether the data up to ``steps`` is made of single samples in the same order on every
        worker: no shuffle, batch or repeat, a source that reads in a fixed order (every input
        of a zip too)."""
        source = trace.source
        if source is None or trace.problem is not None or depth > 3 or any(
            _method(s) in ORDERING or _method(s) == "shard" or self._evened(s) for s in steps
        ):
            return False
        if trace.source_name == _SINGLE_ELEMENT:
            return False
        if trace.source_name == _ZIP:
            parts = _zip_parts(source)
            return bool(parts) and all(
                self._in_order(inner, inner.chain, depth + 1)
                for inner in (trace_dataset(self.fm, self.index, p, source) for p in parts)
            )
        name = trace.source_name
        if name.endswith("list_files"):
            shuffle = arg_named(source, "shuffle", 1)
            return arg_named(source, "seed", 2) is not None or (
                shuffle is not None and code(shuffle.value) == "False")
        if name == "tensorflow_datasets.load":
            shuffle = arg_named(source, "shuffle_files")
            return shuffle is None or code(shuffle.value) == "False" or self._seeded(source)
        return True

    def _source_arguments(
        self, source: cst.Call, function: cst.FunctionDef, call: cst.Call
    ) -> list[cst.BaseExpression] | None:
        """The arguments of ``call`` that ``source``'s data comes from, when its data is made of
        the function's parameters only and they are arrays at ``call``."""
        if not source.args:
            return None
        value = source.args[0].value
        names: list[cst.Name] = []
        parts = [e.value for e in value.elements] if isinstance(
            value, (cst.Tuple, cst.List)
        ) else [value]
        for part in parts:
            if not isinstance(part, cst.Name):
                return None
            binding = self.index.reaching(part.value, part)
            if binding is None or binding.kind != "param" or binding.stmt is not function:
                return None
            names.append(part)
        found: list[cst.BaseExpression] = []
        for part in names:
            arg = next(
                (a for a in call.args
                 if (p := param_for_arg(function, call, a)) is not None
                 and p.name.value == part.value),
                None,
            )
            if arg is None or not (
                holds_arrays(self.fm, arg.value, call) or split_already(self.fm, arg)
            ):
                return None
            found.append(arg.value)
        return found

    def sequence_order(self, cls: cst.ClassDef) -> None:
        """A Sequence that shuffles its indices without a seed: the workers' batches overlap.

        Not a shuffle in its ``on_epoch_end``/``on_epoch_begin`` that nothing else of the class
        calls: ``sdp.shard`` calls those with the global generators seeded alike."""
        hooks = ("on_epoch_end", "on_epoch_begin")
        called = {
            c.func.attr.value for c in findall(cls, m.Call(func=m.Attribute(attr=m.Name())))
            if isinstance(c, cst.Call) and isinstance(c.func, cst.Attribute)
        }
        for call in findall(cls, m.Call()):
            assert isinstance(call, cst.Call)
            if self.fm.refers_to(call.func, "numpy.random.shuffle", "numpy.random.permutation",
                                "random.shuffle"):
                function = self.fm.enclosing_function(call)
                if (
                    function is not None
                    and function.name.value in hooks
                    and function.name.value not in called
                    and method_of(cls, function.name.value) is function
                ):
                    continue  # seeded alike by sdp.shard
                self.note(
                    call,
                    f"{cls.name.value} reorders its batches without a seed, differently on each "
                    f"worker, so the workers' batches overlap: seed it the same on every worker "
                    f"(e.g. np.random.default_rng(seed + epoch))",
                )
                return

    # -- reports -------------------------------------------------------------------------------

    def _note_order(self, source: cst.Call, name: str) -> bool:
        """Sources that shuffle differently on each worker: their shards would overlap, so they
        are not sharded (nor the learning rate scaled); True after the note."""
        if name.endswith("list_files"):
            shuffle = arg_named(source, "shuffle", 1)
            seed = arg_named(source, "seed", 2)
            if seed is None and not (shuffle is not None and code(shuffle.value) == "False"):
                self.note(
                    source,
                    "training data not sharded: list_files shuffles the file names differently "
                    "on each worker, so the shards would overlap: pass shuffle=False (or the same "
                    f"seed on every worker), then .apply({self.sdp}.shard)",
                )
                return True
        elif name == "tensorflow_datasets.load":
            shuffle = arg_named(source, "shuffle_files")
            if shuffle is not None and code(shuffle.value) != "False" and not self._seeded(source):
                self.note(
                    source,
                    "training data not sharded: tfds.load(shuffle_files=True) reads the files in "
                    "a different order on each worker, so the shards would overlap: pass "
                    "shuffle_files=False or read_config=tfds.ReadConfig(shuffle_seed=<the same "
                    f"on every worker>), then .apply({self.sdp}.shard)",
                )
                return True
        return False

    def _seeded(self, source: cst.Call) -> bool:
        """``read_config=tfds.ReadConfig(shuffle_seed=...)``: the same file order everywhere."""
        config = arg_named(source, "read_config")
        return (
            config is not None
            and isinstance(config.value, cst.Call)
            and self.fm.refers_to(config.value.func, "tensorflow_datasets.ReadConfig")
            and (seed := arg_named(config.value, "shuffle_seed")) is not None
            and not (isinstance(seed.value, cst.Name) and seed.value.value == "None")
        )

    def _sharded_after(self, node: cst.CSTNode) -> bool:
        """``node`` is followed by ``.apply(sdp.shard)`` or ``.shard(...)`` already."""
        attribute = self.fm.parent(node)
        call = self.fm.parent(attribute) if isinstance(attribute, cst.Attribute) else None
        if not isinstance(call, cst.Call) or not isinstance(attribute, cst.Attribute):
            return False
        return attribute.attr.value == "shard" or self._evened(call)

    def _evened(self, step: cst.CSTNode) -> bool:
        """``.apply(sdp.shard)``: the runtime's shard."""
        return (
            _method(step) == "apply"
            and isinstance(step, cst.Call)
            and len(step.args) == 1
            and self.fm.refers_to(step.args[0].value, f"{self.fm.runtime_module}.shard")
        )


def lengths_of_split_data(fm: FileModel, call: cst.Call) -> list[tuple[str, cst.Call]]:
    """The names in ``call``'s arguments (a learning-rate schedule's step counts,
    ``LinearDecay(lr, epochs * len_dataset, ...)``) that the call making the training data
    returns with it (``A_B_dataset, len_dataset = data.make_zip_dataset(...)``), when that data
    is split between workers: a length of the whole data, while each worker now runs a part of
    it. With the call that made each."""
    # (A builder handed split arrays or paths, ``make_zip_dataset(sdp.shard(a), ...)``,
    # returns the length of what it was given: each worker's.)
    handed = set(plan_tf_shards(fm).arrays)
    return [(name, made) for name, made in _lengths_of(
        fm, call, [u for u in tf_training_data(fm) if u.sharded_by == "converter"]
    ) if not any(a.value in handed for a in made.args)]


def schedule_advice(
    fm: FileModel, rate: cst.BaseExpression, factor: str, sdp: str
) -> str | None:
    """What to do with a learning rate left unscaled (the training data is not split) that is a
    schedule object (``module.LinearDecay(args.lr, args.epochs * len_dataset, ...)``, a Keras
    schedule, a class of the file) once each worker trains on its own part: scale the rate
    given to it, and divide its step counts made from the length of the training data (a
    length of all of it: each worker then runs 1/size of an epoch's steps). None for a rate
    that is no such object."""
    for value in reaching_values(file_index(fm), rate):
        if not isinstance(value, cst.Call):
            continue
        name = code(value.func).rsplit(".", 1)[-1]
        built_in = schedule_class(fm, value)
        if built_in is None and not (name[:1].isupper() and not any(
            q.startswith(("builtins.", "numpy.", "math.", "torch.", "tensorflow.", "keras."))
            for q in fm.qualified_names(value.func)
        )):
            continue
        first = arg_named(value, _SCHEDULE_RATES[built_in][0][0], 0) if built_in else (
            value.args[0] if value.args and value.args[0].keyword is None else None)
        given = code(first.value) if first is not None else ""
        if not built_in and not re.search(r"lr|rate", given, re.IGNORECASE):
            given = ""  # which argument of a class the converter cannot read is the rate: unknown
        names = [n for n, _ in _lengths_of(fm, value, [u for u in tf_training_data(fm)
                                                       if not u.sharded])]
        steps = (f", and divide its step counts made from {', '.join(names)} by {sdp}.size() "
                 f"too if they still count all of the data then (each worker "
                 f"runs 1/{sdp}.size() of an epoch's steps)") if names else ""
        return (f"; once each worker trains on its own part of the data, scale the rate given to "
                f"{code(value.func)}(...){f' ({given})' if given else ''} by {factor}{steps}")
    return None


def _lengths_of(
    fm: FileModel, call: cst.Call, uses: list[TrainingData]
) -> list[tuple[str, cst.Call]]:
    if not uses:
        return []
    index = file_index(fm)
    found: list[tuple[str, cst.Call]] = []
    for arg in call.args:
        for node in _names_under(arg.value):
            binding = index.reaching(node.value, node)
            if binding is None or not binding.unpacked or not isinstance(binding.value, cst.Call):
                continue
            stmt = binding.stmt
            targets = stmt.targets if isinstance(stmt, cst.Assign) else []
            others = [e.value.value for t in targets if isinstance(t.target, (cst.Tuple, cst.List))
                      for e in t.target.elements
                      if isinstance(e.value, cst.Name) and e.value.value != node.value]
            scope = index.scope(node)
            if any(u.where in fm.ancestors(load) for other in others
                   for load in index.loads_of(other, scope) for u in uses) and (
                node.value not in [n for n, _ in found]
            ):
                found.append((node.value, binding.value))
    return found


def _zip_parts(source: cst.Call) -> list[cst.BaseExpression]:
    """The inputs of ``Dataset.zip((a, b))`` (a tuple, a list, a dict, or several arguments)."""
    datasets = arg_named(source, "datasets", 0)
    value = datasets.value if datasets is not None else None
    if isinstance(value, (cst.Tuple, cst.List)):
        return [e.value for e in value.elements]
    if isinstance(value, cst.Dict):
        return [e.value for e in value.elements if isinstance(e, cst.DictElement)]
    return [a.value for a in source.args if a.keyword is None and not a.star]


def _names_under(expr: cst.CSTNode) -> list[cst.Name]:
    found: list[cst.Name] = []
    stack = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.Name):
            found.append(node)
        elif isinstance(node, cst.Attribute):
            stack.append(node.value)
        else:
            stack.extend(node.children)
    return found
