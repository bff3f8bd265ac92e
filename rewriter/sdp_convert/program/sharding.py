"""Whether the data feeding training is split between the ranks: the one answer the learning-rate
transforms need.

Scaling the learning rate by N is right only when each of the N ranks trains on its own part of
the data: N identical batches averaged give one batch's gradient, and a rate N times larger then
steps N times too far. So the rate is scaled only where this module says the training data is
(or, by the sharding transforms of this run, will be) sharded:

* PyTorch: every ``DataLoader`` that feeds a training loop has a ``DistributedSampler`` already,
  or ``shard_dataloader`` can give it one (``loader_problem`` is None), and there is at least one;
* TensorFlow: every dataset a training loop or ``fit`` reads, and every ``fit`` on arrays, is
  sharded already or will be: ``program.tfshards`` plans that (``shard_tf_dataset`` and
  ``wrap_keras_fit`` write the plan), and this module asks it.

Otherwise ``training_data`` says what was found instead (``DataSharding.kind``): ``"environment"``
(reinforcement learning: the data comes from a gym environment), ``"input"`` (the optimizer trains
a tensor, not a model: style transfer optimises an image), ``"full batch"`` (loops over
``range`` that read the same tensors every step; ``"full batch drawn"`` when each rank draws
them without a seed), ``"not found"`` (batches come from somewhere
the converter does not follow) or ``"not sharded"`` (a loader or dataset it cannot split).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from .builders import runs_right_before
from .example_lists import split_example_loops
from .flow import Site, counted_pass, epoch_loop, holds_only, loader_sites
from .index import Binding, file_index, reaching_values
from .keras import fit_arg, generator_flow, keras_fit_calls
from .loaders import LOADERS, is_distributed_sampler, is_iterable_dataset, kwargs_literal
from .models import (
    DATA_PARALLEL,
    PARAMETER_METHODS,
    models_from_backward,
    stepped_models,
    stepped_optimizers,
    trained_models,
)
from .optimizers import optimizer_class, params_argument
from .project import imported_data, repairs_of
from .rank_splits import made_for_rank, split_by_rank
from .scopes import callee, callers, referents, runs_whenever, training_loops, uses
from .steps import stepping_loops
from .stream_splits import stream_splits
from .syntax import arg_named, code, findall, is_none, is_simple_reference
from .tfshards import split_already, tf_training_data

if TYPE_CHECKING:
    from .model import FileModel

# DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, ...): positional indices.
_POSITIONS = {"dataset": 0, "shuffle": 2, "sampler": 3, "batch_sampler": 4}

#: Libraries whose environments produce the data of reinforcement learning.
ENVIRONMENTS = ("gym", "gymnasium", "pettingzoo", "dm_control", "procgen", "ale_py")



@dataclass(frozen=True)
class DataSharding:
    """What feeds training in one file, and whether each rank gets its own part of it."""

    sharded: bool
    #: "sharded", "not sharded", "partly sharded" (on some of the paths that bind it),
    #: "environment", "input", "full batch", "not found" or
    #: "unaveraged" (an optimizer whose model is not wrapped: ``unaveraged_optimizers``).
    kind: str
    #: Where it was seen (an environment call, a training loop), for a report line.
    node: cst.CSTNode | None = None


# -- PyTorch loaders -------------------------------------------------------------------------------


def loader_args(call: cst.Call) -> dict:
    """Indices of DataLoader's arguments by parameter name, plus ``positional``."""
    found: dict = {}
    positional = [i for i, a in enumerate(call.args) if a.keyword is None and not a.star]
    found["positional"] = positional
    for name, position in _POSITIONS.items():
        if position < len(positional):
            found[name] = positional[position]
    for i, arg in enumerate(call.args):
        if arg.keyword is not None and arg.keyword.value in _POSITIONS:
            found[arg.keyword.value] = i
    return found


def loader_arg(call: cst.Call, args: dict, name: str) -> cst.Arg | None:
    index = args.get(name)
    return call.args[index] if index is not None else None


def has_distributed_sampler(fm: FileModel, call: cst.Call) -> bool:
    sampler = loader_arg(call, loader_args(call), "sampler")
    return sampler is not None and is_distributed_sampler(fm, sampler.value)


def resampling_sampler(fm: FileModel, loader: cst.Call) -> tuple[cst.Call, bool] | None:
    """The ``sampler=RandomSampler(ds, replacement=True, ...)`` written in the call of
    ``loader``, and whether it already draws from a stream of its own rank (a ``generator=``
    that mentions the rank: ``torch.Generator().manual_seed(torch.initial_seed() +
    sdp.rank())``). Sampling with replacement splits between the ranks by giving each its own
    random stream: N ranks drawing independently are N times the draws of one (the samples of
    one batch of N times the size, each drawn uniformly, with replacement, as before), where a
    DistributedSampler would draw without replacement, one pass over a part. None for any other
    sampler, or one with a generator of its own."""
    sampler = loader_arg(loader, loader_args(loader), "sampler")
    value = sampler.value if sampler is not None else None
    if not (isinstance(value, cst.Call) and fm.refers_to(
            value.func, *(q for q, shuffle in PLAIN_SAMPLERS.items() if shuffle == "True"))):
        return None
    if any(a.star for a in value.args):
        return None  # ``**kwargs`` may hold a generator
    replacement = arg_named(value, "replacement", 1)
    if replacement is None or not (isinstance(replacement.value, cst.Name)
                                   and replacement.value.value == "True"):
        return None
    generator = arg_named(value, "generator", 3)
    if generator is None:
        return value, False
    mentions = any(
        isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute)
        and n.func.attr.value == "rank" for n in findall(generator.value, m.Call()))
    return (value, True) if mentions else None


#: Samplers that only order the whole dataset: -> the ``shuffle=`` of the DistributedSampler
#: that does the same on each rank's part.
PLAIN_SAMPLERS = {
    "torch.utils.data.RandomSampler": "True",
    "torch.utils.data.sampler.RandomSampler": "True",
    "torch.utils.data.SequentialSampler": "False",
    "torch.utils.data.sampler.SequentialSampler": "False",
}


def plain_sampler(fm: FileModel, loader: cst.Call) -> str | None:
    """The ``shuffle=`` code of a DistributedSampler replacing the ``sampler=`` of ``loader``,
    when that is a plain ``RandomSampler(ds)`` / ``SequentialSampler(ds)`` (no
    ``replacement=``, ``num_samples=`` or generator), or a name bound to one once and read
    only there; None otherwise."""
    sampler = loader_arg(loader, loader_args(loader), "sampler")
    value = sampler.value if sampler is not None else None
    if isinstance(value, cst.Name):  # ``sampler = RandomSampler(ds)`` read here alone
        bindings = referents(fm, value)
        if len(bindings) != 1 or bindings[0].kind != "assign" or bindings[0].unpacked or [
            id(u) for u in uses(fm, bindings[0])
        ] != [id(value)]:
            return None
        value = bindings[0].value
    if not isinstance(value, cst.Call) or len(value.args) != 1:
        return None
    keyword = value.args[0].keyword
    if keyword is not None and keyword.value != "data_source":
        return None
    for name, shuffle in PLAIN_SAMPLERS.items():
        if fm.refers_to(value.func, name):
            return shuffle
    return None


def unfollowed_loaders(fm: FileModel, loaders: list[cst.Call]) -> str:
    """The note for a training loop no DataLoader of the file was followed to: it names the
    loaders the file does build (not "none was found" when one is 50 lines above)."""
    part = (
        f"give each rank its own part of the training data (a DistributedSampler, or "
        f"indices[{fm.sdp}.rank()::{fm.sdp}.size()])"
    )
    if not loaders:
        return f"no DataLoader feeding this training loop was found: {part}"
    names = []
    for call in loaders:
        parent = fm.parent(call)
        target = (parent.targets[0].target if isinstance(parent, cst.Assign)
                  and len(parent.targets) == 1 else None)
        name = code(target) if target is not None else code(call.func) + "(...)"
        if name not in names:
            names.append(name)
    return (
        f"this training loop's data was not followed back to a DataLoader of this file "
        f"({', '.join(names)} {'is' if len(names) == 1 else 'are'} built here, but the converter "
        f"cannot tell which, if any, feeds it): {part}"
    )


def loader_problem(fm: FileModel, call: cst.Call) -> str | None:
    """Why a DistributedSampler cannot be added to this loader (None: it can, or it has one)."""
    resampling = resampling_sampler(fm, call)
    if has_distributed_sampler(fm, call) or (resampling is not None and resampling[1]):
        return None
    unaveraged = unaveraged_loops(fm)
    loops = [s.loop for s in loader_sites(fm, call)[0] if s.loop in training_loops(fm)]
    if unaveraged and loops and all(id(loop) in unaveraged for loop in loops):
        return (
            "the optimizer its training loop steps trains a model the converter could not tell "
            "(see the note at that optimizer), so no DistributedDataParallel averages its "
            "gradients and each rank would train its own copy on its part of the data; give it "
            f"a DistributedSampler once that model is wrapped in {fm.sdp}.DistributedDataParallel"
        )
    if resampling is not None and enabled(fm, "seed_samplers_by_rank"):
        return None  # with replacement: seed_samplers_by_rank gives each rank its own stream
    args = loader_args(call)
    sdp = fm.sdp
    if any(a.star == "*" for a in call.args) or len(args.get("positional", ())) > 3:
        return "pass its arguments by keyword, then add a DistributedSampler"
    sampler = loader_arg(call, args, "sampler")
    if sampler is not None and not is_none(sampler.value) and plain_sampler(fm, call) is None:
        return (
            "it has its own sampler; make it yield only this rank's indices "
            f"(e.g. indices[{sdp}.rank()::{sdp}.size()])"
        )
    if args.get("batch_sampler") is not None:
        return (
            "it has a batch_sampler; make it yield only this rank's batches "
            f"(e.g. batches[{sdp}.rank()::{sdp}.size()])"
        )
    dataset = loader_arg(call, args, "dataset")
    if dataset is None:
        return "its dataset is not passed as an argument we can see"
    if is_iterable_dataset(fm, dataset.value):
        return (
            "its dataset is an IterableDataset (a stream), which a sampler cannot split; "
            f"skip the items whose index % {sdp}.size() != {sdp}.rank() in its __iter__"
        )
    stmt = fm.enclosing_statement(call)
    if stmt is None or not runs_right_before(fm, call, stmt):
        return "put the DataLoader(...) call on a line of its own"
    shared = shared_factory(fm, call)
    if shared is not None and factory_split(fm, call) is None:
        return shared_factory_note(fm, shared)
    if args.get("shuffle") is None:
        splats = [a for a in call.args if a.star == "**"]
        if len(splats) > 1 or (
            splats
            and kwargs_literal(fm, splats[0].value) is None
            and not is_simple_reference(splats[0].value)
        ):
            return (
                "its keyword arguments come from a ** expression that is not a name; pass "
                "shuffle explicitly"
            )
    return None


@dataclass(frozen=True)
class SharedFactory:
    """A function of this file that builds a loader for several callers: some train on what it
    returns (``train``), the others do not (``other``, by name: they evaluate it, or read it
    where the flow is not followed, ``unseen``)."""

    function: cst.FunctionDef
    train: tuple[cst.Call, ...]
    train_names: tuple[str, ...]
    other_names: tuple[str, ...]
    unseen: bool = False

    @property
    def others(self) -> str:
        """``evaluation (valid_loader)``: what the other calls' loaders are for."""
        uses = "evaluation or other uses" if self.unseen else "evaluation"
        return f"{uses} ({', '.join(self.other_names)})"


def shared_factory(fm: FileModel, call: cst.Call) -> SharedFactory | None:
    """A loader a function of this file builds for several callers, some training on it, others
    not: evaluating it, or reading it where the flow is not followed
    (``get_data_loader(train_data, ..., shuffle=True)`` and ``get_data_loader(valid_data,
    ...)``): a DistributedSampler added to every call would split the evaluation data too, each
    rank scoring its own part. None when every caller trains on it (or none does)."""
    function = fm.enclosing_function(call)
    if function is None:
        return None
    calls = callers(fm, function)
    if len(calls) < 2:
        return None
    loops = training_loops(fm)
    train: list[cst.Call] = []
    train_names: list[str] = []
    other: list[str] = []
    unseen = False
    for caller in calls:
        sites, _ = loader_sites(fm, caller)
        parent = fm.parent(caller)
        name = (code(parent.targets[0].target) if isinstance(parent, cst.Assign)
                and len(parent.targets) == 1 else f"{code(caller.func)}(...)")
        if any(site.loop in loops for site in sites):
            train.append(caller)
            train_names.append(name)
        else:  # evaluated, or read where the flow does not follow (a comprehension)
            other.append(name)
            unseen = unseen or not sites
    if not train or not other:
        return None
    return SharedFactory(function, tuple(train), tuple(train_names), tuple(other), unseen)


def shared_factory_note(fm: FileModel, shared: SharedFactory) -> str:
    """Why the loader of a shared factory is left whole, and the edit that splits it."""
    helper = shared.function.name.value
    return (
        f"{helper}() builds the loaders for training ({', '.join(shared.train_names)}) and for "
        f"{shared.others}: a DistributedSampler added here would split that data too; give "
        f"{helper}() a flag that only the training call sets, adding "
        f"`sampler=DistributedSampler(dataset, num_replicas={fm.sdp}.size(), "
        f"rank={fm.sdp}.rank(), shuffle=shuffle)` (and shuffle=False on the DataLoader) when it "
        "is set, and call the sampler's set_epoch(epoch) at the start of each epoch"
    )


@dataclass(frozen=True)
class FactorySplit:
    """How ``shard_shared_loader`` splits the training data of a shared factory's loader: a flag
    parameter (default off) that only the training calls set, choosing a DistributedSampler
    (``shuffle``: its ``shuffle=`` code) over the loader's own sampler (``fallback``: ``None``,
    or the code of the plain ``RandomSampler`` it had); ``shuffle_arg`` / ``sampler_arg``: the
    indices of the loader's arguments that change (``shuffle`` becomes False under the flag)."""

    shared: SharedFactory
    dataset: str
    shuffle: str
    fallback: str
    shuffle_arg: int | None
    sampler_arg: int | None


def factory_split(fm: FileModel, call: cst.Call) -> FactorySplit | None:
    """The flag edit for a loader of a shared factory (``shared_factory``), when it can be made
    (``shard_shared_loader`` on; the loader's arguments by keyword or its first three positions,
    no ``*``/``**``; its dataset a name; no sampler, or a plain one); None otherwise."""
    shared = shared_factory(fm, call)
    if shared is None or not enabled(fm, "shard_shared_loader"):
        return None
    args = loader_args(call)
    dataset = loader_arg(call, args, "dataset")
    if (any(a.star for a in call.args) or len(args.get("positional", ())) > 3
            or args.get("batch_sampler") is not None or dataset is None
            or not isinstance(dataset.value, cst.Name)):
        return None
    sampler = loader_arg(call, args, "sampler")
    shuffle_arg = args.get("shuffle")
    if sampler is not None and not is_none(sampler.value):
        shuffle = plain_sampler(fm, call)
        if shuffle is None:
            return None
        fallback = code(sampler.value)
    else:
        shuffle = code(call.args[shuffle_arg].value) if shuffle_arg is not None else "False"
        fallback = "None"
    return FactorySplit(shared, dataset.value.value, shuffle, fallback, shuffle_arg,
                        args.get("sampler"))


def only_sharded_loaders(fm: FileModel, use: cst.CSTNode) -> bool:
    """Whether every value the read ``use`` (a loader's name where a loop iterates it) may hold
    is a DataLoader made in this file that has a DistributedSampler, or gets one in this
    conversion: then ``<use>.sampler.set_epoch(epoch)`` is right whichever of them it holds
    (a loader chosen in ``if``/``elif`` branches, each with its own sampler)."""
    if not isinstance(use, cst.Name):
        return False
    bindings = referents(fm, use)
    if not bindings:
        return False
    will = enabled(fm, "shard_dataloader")
    for binding in bindings:
        value = binding.value
        if binding.unpacked or not (isinstance(value, cst.Call) and fm.refers_to(
            value.func, *LOADERS
        )):
            return False
        if not has_distributed_sampler(fm, value) and (
            not will or loader_problem(fm, value) is not None
        ):
            return False
    return True


def training_loaders(fm: FileModel) -> list[cst.Call]:
    """The DataLoader calls whose loaders a training loop iterates."""
    loaders = fm.calls_to(*LOADERS)
    if not loaders:
        return []
    return loaders_iterated_in(fm, training_loops(fm))


def loaders_iterated_in(fm: FileModel, loops: Iterable[cst.CSTNode]) -> list[cst.Call]:
    """The DataLoader calls whose loaders one of ``loops`` iterates (``loader_sites``), in
    file order. Each loader of the file is followed once, not once per question."""
    by_loop = fm.facts.loader_loops
    if by_loop is None:
        by_loop = fm.facts.loader_loops = {}
        for call in fm.calls_to(*LOADERS):
            for site in loader_sites(fm, call)[0]:
                by_loop.setdefault(id(site.loop), []).append(call)
    found = {id(c): c for loop in loops for c in by_loop.get(id(loop), ())}
    return sorted(found.values(), key=fm.order)


# -- TensorFlow datasets and fit arrays -----------------------------------------------------------


#: ``ImageDataGenerator.flow(x, y, batch_size, shuffle, sample_weight, ...)``.
_FLOW_POSITIONS = {"x": 0, "y": 1, "sample_weight": 4}


def flow_arg(call: cst.Call, name: str) -> cst.Arg | None:
    return arg_named(call, name, _FLOW_POSITIONS.get(name))


def fit_arrays(fm: FileModel, fit: cst.Call, flow: bool = False) -> tuple[str, cst.Arg | None]:
    """``fit(x, y)`` on arrays (or ``ImageDataGenerator.flow(x, y)`` with ``flow``):
    ``("none", None)`` (no y: a dataset), ``("sharded", None)`` (strided or ``sdp.shard``
    already), ``("plain", None)`` (arrays ``wrap_keras_fit`` / ``port_fit_generator`` stride),
    or ``("container", arg)`` (a list, tuple or dict of arrays they cannot)."""
    get = flow_arg if flow else fit_arg
    x, y = get(fit, "x"), get(fit, "y")
    if x is None or y is None:
        return "none", None
    index = file_index(fm)
    keywords = ["x", "y"]
    if get(fit, "sample_weight") is not None:
        keywords.append("sample_weight")
    for keyword in keywords:
        arg = get(fit, keyword)
        assert arg is not None
        if split_already(fm, arg):
            return "sharded", None
        for value in reaching_values(index, arg.value, fit):
            if isinstance(value, (cst.List, cst.Tuple, cst.Dict)):
                return "container", arg
    return "plain", None


# -- the answer --------------------------------------------------------------------------------


def enabled(fm: FileModel, name: str) -> bool:
    """Whether the user left the transform ``name`` on: ``--skip`` turns it off. (``--only`` a
    learning-rate transform asks for that step alone, over data the full run would shard.)"""
    return name not in fm.skip


def environment_call(fm: FileModel) -> cst.Call | None:
    """The first call into a reinforcement-learning environment library (``gym.make``)."""
    found = [
        call
        for qname, calls in fm.info.calls.items()
        if qname.split(".", 1)[0] in ENVIRONMENTS
        for call in calls
    ]
    return min(found, key=fm.order) if found else None


def training_data(fm: FileModel) -> DataSharding:
    """Whether this file's training data is (or will be, in this run) split between the ranks."""
    facts = fm.facts
    if facts.data_sharding is None:
        facts.data_sharding = (
            _torch(fm) if fm.info.framework == "torch" else _tensorflow(fm)
        )
    return facts.data_sharding


def optimizer_data(fm: FileModel, call: cst.Call) -> DataSharding:
    """Whether the data of the loops that step the torch optimizer ``call`` makes is split:
    the loaders feeding those loops (``program.steps.stepping_loops``), or, when no loader feeds
    them, what they read instead (full batch, batches made by hand). The file's answer
    (``training_data``) where those loops are not known, and for environments and optimised
    inputs, which concern every optimizer of the file."""
    whole = training_data(fm)
    if whole.kind in ("environment", "input"):
        return whole
    if id(call) in unaveraged_optimizers(fm):
        return DataSharding(False, "unaveraged", call)
    loops = stepping_loops(fm, call)
    # Batches the training loop draws from loaders a class of another module builds and splits
    # there (``known_data`` at ``train_dataset.get_batch()``: the whole-program contract
    # followed it): no loader of this file is missing, the data is split.
    drawn = [node for _, node in repairs_of(fm, "known_data")]
    if loops is None:
        return DataSharding(True, "sharded") if drawn and whole.kind == "not found" else whole
    if any(loop in fm.ancestors(node) for node in drawn for loop in loops):
        return DataSharding(True, "sharded")
    loaders = loaders_iterated_in(fm, loops)
    # Loaders another module of the project builds for these loops (sharded there, or not).
    imported = imported_data(fm, set(loops))
    if isinstance(imported, cst.Call):
        return DataSharding(False, "not sharded", imported)
    if not loaders and not imported:
        if reads_split_data(fm, loops):
            return DataSharding(True, "sharded")
        return _without_source(fm, [lp for lp in loops if isinstance(lp, (cst.For, cst.While))])
    will = enabled(fm, "shard_dataloader")
    for loader in loaders:
        if not has_distributed_sampler(fm, loader) and (
            not will or loader_problem(fm, loader) is not None
        ):
            return DataSharding(False, "not sharded", loader)
    return DataSharding(True, "sharded")


def unaveraged_optimizers(fm: FileModel) -> dict[int, cst.Call]:
    """The torch optimizers (by id) whose model cannot be told from their parameters
    (``models.trained_models`` follows them to no ``X.parameters()``) where ``wrap_model_ddp``
    wraps no model in their stead (it wraps the module that feeds ``backward()`` only when no
    optimizer of the file names its model). Nothing averages their gradients, so neither their
    learning rate is scaled nor the data of their loops split: each rank would otherwise train
    its own copy on its part of the data at N times the rate."""
    if fm.facts.unaveraged is None:
        fm.facts.unaveraged = _unaveraged(fm)
    return fm.facts.unaveraged


def _unaveraged(fm: FileModel) -> dict[int, cst.Call]:
    if not enabled(fm, "wrap_model_ddp") or not fm.method_calls("backward") or fm.calls_to(
        "sdp_runtime.torch.DistributedOptimizer"
    ):
        return {}  # (without a backward here, the whole-program contract decides)
    known = {id(node) for _, node in repairs_of(fm, "known_model")}  # wrapped in another module
    told, untold = False, {}
    for call in fm.calls_to("torch.optim", prefix=True):
        if optimizer_class(fm, call) is None or id(call) in known:
            continue
        params = params_argument(call)
        if params is not None and next(trained_models(fm, params.value, 0), None) is not None:
            told = True
        else:
            untold[id(call)] = call
    for call in stepped_optimizers(fm) if untold and not told else ():
        told = told or bool(stepped_models(fm, call))
    if untold and not told and (
        fm.calls_to(*DATA_PARALLEL) or next(models_from_backward(fm), None) is not None
    ):
        return {}  # the module that feeds backward() is wrapped instead
    return untold


def unaveraged_loops(fm: FileModel) -> set[int]:
    """The loops (by id) that step only optimizers of ``unaveraged_optimizers``."""
    untold = unaveraged_optimizers(fm)
    if not untold:
        return set()
    steps: dict[bool, set[int]] = {True: set(), False: set()}
    for call in fm.calls_to("torch.optim", prefix=True):
        if optimizer_class(fm, call) is not None:
            loops = stepping_loops(fm, call)
            found = loops if loops is not None else training_loops(fm)
            steps[id(call) in untold].update(id(loop) for loop in found)
    return steps[True] - steps[False]


def optimised_input(fm: FileModel) -> cst.CSTNode | None:
    """The tensor an optimizer trains when no optimizer trains a model's parameters
    (``Adam([input_img])``: neural style transfer optimises an image)."""
    found: cst.CSTNode | None = None
    for call in fm.calls_to("torch.optim", prefix=True):
        if optimizer_class(fm, call) is None:
            continue
        params = params_argument(call)
        if params is None:
            return None
        if findall(params.value, m.Call(func=m.Attribute(attr=PARAMETER_METHODS))):
            return None
        values = list(reaching_values(file_index(fm), params.value))
        literal = next((v for v in values if isinstance(v, (cst.List, cst.Tuple))), None)
        if literal is None or not literal.elements or any(
            not isinstance(e.value, cst.Name) for e in literal.elements
        ):
            return None
        found = found or literal.elements[0].value
    return found


def input_optimisation(fm: FileModel) -> cst.CSTNode | None:
    """The tensor the optimizers train (``optimised_input``) when nothing else feeds training: no
    DataLoader, and loops that read the same tensors every step (neural style transfer). Weights
    kept as plain tensors and trained on batches are not this."""
    tensor = optimised_input(fm)
    if tensor is None or training_loaders(fm):
        return None
    loops = [loop for loop in training_loops(fm) if isinstance(loop, (cst.For, cst.While))]
    return tensor if loops and _without_source(fm, loops).kind.startswith("full batch") else None


def _torch(fm: FileModel) -> DataSharding:
    env = environment_call(fm)
    if env is not None:
        return DataSharding(False, "environment", env)
    tensor = optimised_input(fm)
    if tensor is not None:
        return DataSharding(False, "input", tensor)
    loaders = training_loaders(fm)
    # Loaders another module of the project builds (and shards there, in this run).
    imported = imported_data(fm)
    if isinstance(imported, cst.Call):
        return DataSharding(False, "not sharded", imported)
    if loaders or imported:
        will = enabled(fm, "shard_dataloader")
        for call in loaders:
            if has_distributed_sampler(fm, call) or split_by_rank(fm, call):
                continue
            if not will or loader_problem(fm, call) is not None:
                return DataSharding(False, "not sharded", call)
        return DataSharding(True, "sharded")
    loops = [loop for loop in training_loops(fm) if isinstance(loop, (cst.For, cst.While))]
    if loops and all(isinstance(loop, cst.For) and made_for_rank(fm, loop.iter)
                     for loop in loops):
        return DataSharding(True, "sharded")  # a loader factory given the rank
    if reads_split_data(fm, loops):
        return DataSharding(True, "sharded")
    return _without_source(fm, loops)


def reads_split_data(fm: FileModel, loops: Iterable[cst.CSTNode] | None = None) -> bool:
    """Whether the training loops read a legacy torchtext iterator over this rank's examples
    (``program.example_lists``: split already, or by ``shard_torchtext_iterator``) or this rank's
    columns of a tensor of token ids (``program.stream_splits``, ``shard_token_stream``), and
    the others only count (``for epoch in range(...)`` around them, fetching no batch of its
    own)."""
    fed = split_example_loops(fm, enabled(fm, "shard_torchtext_iterator"))
    will = enabled(fm, "shard_token_stream")
    fed |= {id(loop) for split in stream_splits(fm) if split.done or will for loop in split.loops}
    loops = list(training_loops(fm) if loops is None else loops)
    return bool(fed) and any(id(loop) in fed for loop in loops) and all(
        id(loop) in fed or (
            isinstance(loop, cst.For) and _counts(fm, loop)
            and not findall(loop.body, m.Call(func=m.Name("next")))
            and not _fetches_batches(fm, loop))
        for loop in loops)


def _tensorflow(fm: FileModel) -> DataSharding:
    """TensorFlow: ``program.tfshards`` plans where each training loop's and ``fit``'s data is
    split (by this conversion or already by the script); ``fit_generator(datagen.flow(x, y))`` is
    ``port_fit_generator``'s."""
    env = environment_call(fm)
    if env is not None:
        return DataSharding(False, "environment", env)
    found = False
    empty: list[cst.CSTNode] = []
    fits = {id(f) for f in keras_fit_calls(fm)}
    for use in tf_training_data(fm):
        is_fit = id(use.where) in fits
        if use.partly:
            return DataSharding(False, "partly sharded", use.where)
        if use.sharded_by is None:
            if use.trace is None and not use.candidates and not is_fit:
                empty.append(use.where)  # a loop no dataset of the file feeds
                continue
            return DataSharding(False, "not sharded", use.where)
        if use.sharded_by == "converter" and not enabled(
            fm, "wrap_keras_fit" if is_fit else "shard_tf_dataset"
        ):
            return DataSharding(False, "not sharded", use.where)
        found = True
    for fit in keras_fit_calls(fm):
        flow = generator_flow(fm, fit)
        if flow is None:
            continue
        status, arg = fit_arrays(fm, flow, flow=True)
        if status in ("none", "container") or (
            status == "plain" and not enabled(fm, "port_fit_generator")
        ):  # flow(x) without labels, or of a container: not followed
            return DataSharding(False, "not sharded", arg.value if arg is not None else fit)
        found = True
    if empty:
        loops = [w for w in empty if isinstance(w, (cst.For, cst.While))]
        if found:
            return DataSharding(False, "not found", empty[0])
        return _without_source(fm, loops) if loops else DataSharding(False, "not found", empty[0])
    return DataSharding(True, "sharded") if found else DataSharding(False, "not found")


def _without_source(fm: FileModel, loops: list[cst.For | cst.While]) -> DataSharding:
    """No loader or dataset feeds training: the same tensors every step (full batch), or batches
    made in a way the converter does not follow."""
    if not loops:
        return DataSharding(False, "not found")
    for loop in loops:
        if isinstance(loop, cst.For) and not _counts(fm, loop):
            return DataSharding(False, "not found", loop)
        if findall(loop.body, m.Call(func=m.Name("next"))) or _fetches_batches(fm, loop):
            return DataSharding(False, "not found", loop)
        if _draws(fm, loop.body, 0):  # synthetic data or random batches, drawn every step
            return DataSharding(False, "not found", loop)
        target = loop.target if isinstance(loop, cst.For) else None
        names = {n.value for n in findall(target, m.Name())} if target is not None else set()
        for sub in findall(loop.body, m.Subscript()):
            assert isinstance(sub, cst.Subscript)
            read = {n.value for s in sub.slice for n in findall(s, m.Name())}
            if read & names:
                return DataSharding(False, "not found", loop)  # batches sliced by hand
    drawn = _drawn_per_rank(fm, loops[0])
    if drawn is not None:
        return DataSharding(False, "full batch drawn", drawn)
    return DataSharding(False, "full batch", loops[0])


#: Calls whose name says they hand out a new batch each time (``train_dataset.get_batch()``,
#: ``loader.next_batch()``, ``buffer.sample(64)``): not the same tensors every step.
_BATCH_CALL = re.compile(r"batch|^(get_)?next|^sample|^fetch")


def _fetches_batches(fm: FileModel, loop: cst.For | cst.While) -> bool:
    """Whether the loop's body gets its data from a call that hands out batches (an object of
    another module keeping its own loaders' iterators), which the converter does not follow."""
    for call in findall(loop.body, m.Call()):
        assert isinstance(call, cst.Call)
        func = call.func
        name = func.attr.value if isinstance(func, cst.Attribute) else (
            func.value if isinstance(func, cst.Name) else "")
        if _BATCH_CALL.search(name) and not any(
            q.startswith(("torch.", "numpy.", "tensorflow.", "builtins."))
            for q in fm.qualified_names(func)
        ):
            return True
    return False


def full_batch_note(fm: FileModel, data: DataSharding) -> str:
    """The manual note for full-batch training (``DataSharding.kind`` ``"full batch"`` or
    ``"full batch drawn"``): every rank computes the same gradient only where every rank has
    the same tensors; tensors each rank draws without a seed differ from rank to rank."""
    split = (f"split the data (e.g. indices[{fm.sdp}.rank()::{fm.sdp}.size()]) and scale the "
             "learning rate yourself, or run it on one process")
    if data.kind == "full batch drawn":
        return ("full-batch training (the same tensors every step) on tensors each rank draws "
                f"for itself ({code(data.node).strip()}, no seed): data parallelism does not "
                "speed this up as written, and the ranks train on different data than one "
                f"process would. Seed the draw (the same seed on every rank), then {split}")
    return ("full-batch training (the same tensors every step): data parallelism does not "
            f"speed this up as written; every rank computes the same gradient. "
            f"{split[0].upper()}{split[1:]}")


def _draws(fm: FileModel, node: cst.CSTNode, depth: int) -> bool:
    """Whether running ``node`` draws random numbers (``torch.randint``, ``np.random.choice``,
    ``random.sample``, ...), there or in the functions of this file it calls (3 deep): batches
    drawn anew every step, different on each rank unless seeded alike."""
    for call in findall(node, m.Call()):
        assert isinstance(call, cst.Call)
        if _makes_random(fm, call):
            return True
        function = callee(fm, call) if depth < 3 else None
        if function is not None and _draws(fm, function.body, depth + 1):
            return True
    return False


def _drawn_per_rank(fm: FileModel, loop: cst.For | cst.While) -> cst.Call | None:
    """The unseeded random draw (``torch.randn(64, 4)``) that made a tensor the loop reads, when
    nothing in the file seeds the generators: each rank draws different tensors."""
    if any(fm.calls_to(*_SEEDS)):
        return None
    for name in findall(loop.body, m.Name()):
        assert isinstance(name, cst.Name)
        for value in assigned_or_unpacked(fm, name):
            for call in findall(value, m.Call()):
                assert isinstance(call, cst.Call)
                if _makes_random(fm, call):
                    return call
    return None


def assigned_or_unpacked(fm: FileModel, name: cst.Name) -> list[cst.BaseExpression]:
    """The values a read may hold: ``x = value``, or the element of ``x, y = (a, b)``."""
    found = []
    for binding in referents(fm, name):
        value = binding.value
        if binding.kind != "assign" or value is None:
            continue
        if not binding.unpacked:
            found.append(value)
        elif isinstance(value, cst.Tuple):
            found += [e.value for e in value.elements]
    return found


def _makes_random(fm: FileModel, call: cst.CSTNode) -> bool:
    """``torch.randn(...)``, ``np.random.rand(...)``, ``tf.random.normal(...)``,
    ``torch.randperm(...)``, ``random.sample(...)``: new random numbers."""
    assert isinstance(call, cst.Call)
    return any(
        ".random." in q or q.startswith("random.") or q.split(".")[-1] in _RANDOM
        for q in fm.qualified_names(call.func)
    )


_RANDOM = frozenset({"rand", "randn", "randint", "rand_like", "randn_like", "normal", "uniform",
                     "randperm", "multinomial", "bernoulli"})
#: Calls that seed the random generators (the same draw on every rank when seeded alike).
_SEEDS = ("torch.manual_seed", "torch.random.manual_seed", "numpy.random.seed", "random.seed",
          "tensorflow.random.set_seed", "keras.utils.set_random_seed",
          "tensorflow.keras.utils.set_random_seed", "numpy.random.default_rng",
          "numpy.random.RandomState", "torch.Generator")


def _counts(fm: FileModel, loop: cst.For) -> bool:
    """``for i in range(...)`` / ``trange`` (possibly in ``enumerate``/``tqdm``): a counter."""
    it = loop.iter
    if (
        isinstance(it, cst.Call)
        and it.args
        and isinstance(it.args[0].value, cst.Call)
        and any(q.split(".")[-1] in ("enumerate", "tqdm") for q in fm.qualified_names(it.func))
    ):
        it = it.args[0].value
    return isinstance(it, cst.Call) and (
        fm.refers_to(it.func, "builtins.range")
        or any(q.endswith(".trange") for q in fm.qualified_names(it.func))
    )


@dataclass(frozen=True)
class EpochSite:
    """Where ``<receiver>.set_epoch(<counter>)`` goes: before ``before``, a statement of
    ``loop`` (the first of a ``for epoch in range(...)``, the pass over the loader in a loop that
    counts its epochs itself: ``flow.counted_pass``), or right after the sampler where the
    loader is made inside ``loop`` (``inside``). ``before`` None: nowhere (a one-line body)."""

    loop: cst.For | cst.While
    receiver: str
    inside: bool
    counter: str
    before: cst.BaseStatement | None


def set_epoch_site(
    fm: FileModel, site: Site, own: Binding | None, sampler: str, stmt: cst.CSTNode,
    flow: set[int],
) -> EpochSite | None:
    """Where ``<loader>.sampler.set_epoch(epoch)`` goes for a loader built at ``stmt`` (bound to
    ``own``, its new sampler named ``sampler``) and iterated at ``site``; None where it cannot
    be said (a parameter other callers fill with other loaders, a loader picked out of something
    else, no epoch loop and no counted pass)."""
    where = epoch_loop(fm, site)
    if where is not None:
        loop, holder = where
        assert isinstance(loop.target, cst.Name)
        counter = loop.target.value
        body = loop.body.body if isinstance(loop.body, cst.IndentedBlock) else ()
        before: cst.BaseStatement | None = body[0] if body else None
    elif (counted := counted_pass(fm, site)) is not None:
        loop, holder, counter, before = (counted.loop, counted.holder, counted.counter,
                                         counted.before)
    else:
        return None

    def at(receiver: str, inside: bool = False) -> EpochSite:
        return EpochSite(loop, receiver, inside, counter, before)

    if any(a is loop for a in fm.ancestors(stmt)):
        return at(sampler, True)  # the loader is made anew each epoch, right here
    if holder is None or (own is not None and holder.same_as(own)):
        if runs_whenever(fm, stmt, loop):
            return at(sampler)
        # Made in one branch only: the sampler of the loader the loop reads.
        if holder is None or not only_sharded_loaders(fm, site.use):
            return None
        return at(f"{holder.code}.sampler")
    if not holder.unpacked and isinstance(holder.value, (cst.Dict, cst.List, cst.Tuple)):
        # Picked out of a literal: ``loaders["train"].sampler``.
        picked = [use for _, use, b in (*site.trail, (None, site.use, site.binding))
                  if b is holder and isinstance(use, cst.Subscript)]
        return at(f"{fm.code(picked[0]).strip()}.sampler") if picked else None
    if holds_only(fm, holder, flow):
        return at(f"{holder.code}.sampler")
    return None  # a parameter other callers fill with other loaders


def no_loader_note(fm: FileModel, backward: cst.CSTNode, loaders: list[cst.Call]
                   ) -> tuple[cst.CSTNode, str]:
    """Where and what to say of a file that trains (``backward`` is its first backward pass)
    and shards no DataLoader: reinforcement learning, an optimised input, full-batch
    training, or loaders the flow could not follow (``unfollowed_loaders``)."""
    data = training_data(fm)
    node = data.node or backward
    sdp = fm.sdp
    if data.kind == "environment":
        return node, (
            "reinforcement learning (data from an environment): data parallelism does not speed "
            "this up as written, every rank collects the same episodes; seed each rank's "
            f"environment differently (env.reset(seed=seed + {sdp}.rank())) so that they "
            "collect different ones, and scale the learning rate yourself if you average them")
    if data.kind == "input":
        return node, (
            f"the optimizer trains {fm.code(data.node).strip()}, an input, not a model's "  # type: ignore[arg-type]
            "parameters (as style transfer does): not data-parallel as written, every rank "
            "would compute the same thing; run it on one process")
    if data.kind.startswith("full batch"):
        return node, full_batch_note(fm, data)
    return backward, unfollowed_loaders(fm, loaders)
