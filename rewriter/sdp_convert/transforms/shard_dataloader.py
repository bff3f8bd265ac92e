"""Give the training DataLoader a DistributedSampler, so that each rank reads its own shard.

Before::

    train_loader = DataLoader(train_set, batch_size=64, shuffle=True)
    for epoch in range(epochs):
        for x, y in train_loader:
            ...

After::

    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_set, num_replicas=sdp.size(), rank=sdp.rank(), shuffle=True
    )
    train_loader = DataLoader(train_set, batch_size=64, sampler=train_sampler)
    for epoch in range(epochs):
        train_sampler.set_epoch(epoch)
        for x, y in train_loader:
            ...

Why: with N processes each must train on a distinct 1/N of the data, or the N gradients being
averaged are N copies of one gradient. The sampler keeps the loader's own ``shuffle`` setting
(DataLoader refuses ``shuffle=True`` next to a sampler, so the argument moves to the sampler, also
out of a local ``**kwargs`` dict literal), and ``set_epoch`` gives every epoch a new order that all
ranks agree on. With ``shuffle=False`` rank r reads samples r, r+N, ...: step k of N ranks covers
exactly the batch of N*B samples that one process would read.

Only loaders that feed training are changed: a loader iterated by a loop that calls
``.backward()``/``.step()`` (directly or through functions of this file; ``for`` over it, over
``enumerate(loader)``/``tqdm(loader)``, or ``next(it)`` with ``it = iter(loader)``), followed
through variables, ``self.<attr>``, function parameters and return values (``return loader``,
``return train, val``). Evaluation loaders stay whole.

Decisions:

* The sampler is written ``torch.utils.data.distributed.DistributedSampler`` through the name the
  file binds ``torch`` to (``th.utils...`` after ``import torch as th``); a file that binds none
  gets ``import torch.utils.data.distributed``. One spelling, no new ``from`` import to collide.
* It is named after the loader, unique in its scope: ``train_loader`` -> ``train_sampler``,
  ``loader`` -> ``loader_sampler``, ``self.train_loader`` -> ``self.train_sampler``; a loader a
  factory returns is named after the caller's variable. A dataset given as an expression
  (``DataLoader(TensorDataset(x, y))``) is first bound to ``<name>_dataset``, so it is built once.
* ``shuffle``: moved from the call (keyword or third positional) to the sampler; taken out of a
  ``**kwargs`` dict literal bound once in the file (and only ``update``d with dicts without it);
  any other ``**kw`` becomes ``**{**kw, "shuffle": False}`` with ``shuffle=kw.get("shuffle",
  False)`` on the sampler.
* ``set_epoch(epoch)`` goes first in the nearest ``for <name> in range(...)`` around the training
  loop, or around the call that leads to it: ``train_sampler.set_epoch(epoch)`` where the sampler
  is visible, ``loader.sampler.set_epoch(epoch)`` on a parameter every caller fills with this
  loader, or on a loader made in one branch of an ``if``/``elif`` (its sampler is not bound on
  the other paths; every loader the loop may read gets one), right after the sampler when the
  loader is made inside the epoch loop; in a loop that counts its passes itself (``while True:``
  with ``cur_epochs += 1``, once per pass, the same on every rank: ``program.flow.counted_pass``)
  ``sampler.set_epoch(cur_epochs)`` right before the pass. None when the loader never shuffles;
  a manual note when no such loop is found (no counter is made up for a loop that counts none).
* Manual notes: a training loader with its own ``sampler``/``batch_sampler``, over an
  ``IterableDataset`` (streams), with ``*args``, or whose ``shuffle`` cannot be seen; and a
  training script whose loop reads no DataLoader at all (batches sliced by hand).
* Idempotent: a loader whose ``sampler`` is (a name bound to) a DistributedSampler is left alone.

The value-flow questions (bindings, uses, callers, callees, file order, names in a scope) are
the program layer's (``sdp_convert.program.scopes``).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from ..base import Transform
from ..program.builders import fresh_name, statement, torch_spelling
from ..program.datasets import SEEDED_SPLIT, new_unseeded_split, seeded_split
from ..program.flow import Site, loader_sites
from ..program.loaders import LOADERS, kwargs_literal, loader_base_name, sets_epoch
from ..program.project import (
    has_known_loaders,
    imported_loaders,
    known_loaders,
    repairs_of,
    returned_feed,
    single_process_fallback,
)
from ..program.rank_splits import split_by_rank
from ..program.scopes import Binding, assigned_binding, training_loops
from ..program.sharding import (
    EpochSite,
    factory_split,
    has_distributed_sampler,
    loader_args,
    loader_problem,
    no_loader_note,
    plain_sampler,
    reads_split_data,
    resampling_sampler,
    set_epoch_site,
)
from ..program.syntax import append_arg, fix_last_comma, is_simple_reference


@dataclass
class _Plan:
    call: cst.Call
    sampler: str
    dataset_name: str | None = None  # the hoisted dataset's name
    dataset_arg: int | None = None
    shuffle_arg: int | None = None  # replaced by ``sampler=``
    general_kwargs_arg: int | None = None  # ``**kw`` -> ``**{**kw, "shuffle": False}``


class ShardDataLoader(Transform):
    DESCRIPTION = (
        "Give the training DataLoader a DistributedSampler, and call set_epoch each epoch."
    )
    FRAMEWORKS = frozenset({"torch"})
    #: Project mode: a module that builds another module's training loader (``data``), one
    #: whose DataLoader the whole-program contract found unsplit (``repair:shard_loader``), or
    #: one whose loop reads a loader another module splits (``repair:known_loader``).
    PROJECT_ROLES = frozenset({"data", "repair:shard_loader", "repair:known_loader"})
    # (``known_data`` only speaks to a module that trains: no role of its own.)

    def prepare(self, module: cst.Module) -> None:
        self._repairs = {id(node): repair for repair, node in repairs_of(self.fm, "shard_loader")}
        self._plans: dict[cst.Call, _Plan] = {}
        self._dict_drops: dict[cst.Dict, int] = {}  # dict literal -> index of "shuffle" to drop
        self._strip_leading: set[cst.CSTNode] = set()
        self._taken: dict[cst.CSTNode, set[str]] = {}
        self._splits: set[cst.Call] = set()
        self._epochs: set[tuple[int, str]] = set()  # (loop, receiver) of set_epoch calls planned
        loaders = self.calls_to(*LOADERS)
        self._training_loops = training_loops(self.fm) if loaders else set()
        handled = False
        for call in loaders:
            handled = self._handle(call) or handled
        handled = self._imported() or handled
        handled = self._known_loaders() or handled
        # The loop that feeds this file's training is in another module, which reads a loader
        # split there (the whole-program model followed it: ``known_data``).
        handled = bool(repairs_of(self.fm, "known_data")) or handled
        backward = self.method_calls("backward")
        if not handled and backward and not reads_split_data(self.fm):
            self.record(*no_loader_note(self.fm, backward[0], loaders), manual=True)

    def _imported(self) -> bool:
        """Loaders built (and sharded) in another module of the project: ``set_epoch`` in this
        module's epoch loop. Whether any feeds training (then no "no DataLoader" note)."""
        imported = imported_loaders(self.fm)
        for call, source in imported.unsharded:
            self.record(call, f"{source.callee}() returns a loader built in {source.at} that "
                        "feeds training here; it is sharded only if that module is converted in "
                        "the same run: convert both together (or the directory)", manual=True)
        self._epochs_set = {(id(loop), set_epoch.split(".set_epoch", 1)[0])
                            for loop, set_epoch, _ in imported.set_epochs}
        for loop, set_epoch, source in imported.set_epochs:
            self.insert_before(loop.body.body[0], cst.parse_statement(set_epoch + "\n"))
            self.record(loop, f"call {set_epoch} at the start of each epoch (its "
                        f"DistributedSampler is added where the loader is built, {source.at})")
        return imported.feeds

    def _known_loaders(self) -> bool:
        """Loops of this file that read a loader another module builds and splits
        (``program.project.known_loaders``): its sampler's ``set_epoch`` at the start of each
        epoch (when it shuffles), and no "no DataLoader" note."""
        for known in known_loaders(self.fm):
            if known.epochs is None:
                if self.method_calls("set_epoch") or self._epochs_set:
                    continue  # an epoch loop of a caller sets it (this run, or the script)
                self.record(known.loop, f"call {known.receiver}.set_epoch(epoch) at the start "
                            "of every epoch (its DistributedSampler is added where the loader "
                            f"is built, {known.built_at}; found no `for epoch in range(...)` "
                            "loop to put it in), or every epoch sees the same order", manual=True)
                continue
            epochs, receiver = known.epochs, known.receiver
            if sets_epoch(self.fm, epochs, receiver) or (id(epochs), receiver) in self._epochs_set:
                continue
            assert isinstance(epochs.target, cst.Name) and isinstance(
                epochs.body, cst.IndentedBlock)
            set_epoch = f"{receiver}.set_epoch({epochs.target.value})"
            self.insert_before(epochs.body.body[0], cst.parse_statement(set_epoch + "\n"))
            self.record(epochs, f"call {set_epoch} at the start of each epoch (its "
                        f"DistributedSampler is added where the loader is built, "
                        f"{known.built_at})")
        return has_known_loaders(self.fm)

    # -- one loader -----------------------------------------------------------------------------

    def _handle(self, call: cst.Call) -> bool:
        """Plan the change of one DataLoader call; whether it is a training loader (or handled)."""
        args = loader_args(call)
        if split_by_rank(self.fm, call):
            return True  # its dataset is this rank's part already (``.select(rank)``)
        if factory_split(self.fm, call) is not None:  # shared with evaluation:
            return True  # shard_shared_loader's flag splits it
        if resampling_sampler(self.fm, call) and loader_problem(self.fm, call) is None:
            return True  # with replacement: seed_samplers_by_rank gives each rank its stream
        if has_distributed_sampler(self.fm, call):
            feed = returned_feed(self.fm, call)
            if feed is not None:
                self.state.facts.exports.append((call, feed.function, feed.index, True, True))
            return True  # sharded already (by us or by hand)
        own = assigned_binding(self.fm, call)
        all_sites, flow = loader_sites(self.fm, call)
        sites = [s for s in all_sites if s.loop in self._training_loops]
        feed = returned_feed(self.fm, call) if not sites else None
        repair = self._repairs.get(id(call))
        if not sites and feed is None and repair is None:
            return False  # evaluation, or not iterated where we can see it
        used_by = f" (used by {feed.used_by})" if feed is not None else (
            f" (used by {repair.detail})" if repair is not None and not sites else "")
        label = own.code if own else "this DataLoader"
        returned = isinstance(self.parent(call), cst.Return)
        factory = self.enclosing_function(call) if returned else None
        if factory is not None:
            label = f"the DataLoader {factory.name.value}() returns"
        named = own or next((s.binding for s in sites if s.binding and not s.trail), None)

        def manual(reason: str) -> bool:
            self.record(
                call, f"{label} feeds training but is not sharded: {reason}{used_by}", manual=True
            )
            return True

        problem = loader_problem(self.fm, call)
        if problem is not None:
            return manual(problem)
        dataset_index = args.get("dataset")
        dataset = _arg(call, dataset_index)
        stmt = self.enclosing_statement(call)
        assert dataset is not None and stmt is not None

        names = loader_base_name(named)
        local_scope = self.enclosing_function(stmt) or self.module
        if own is not None and own.cls is not None:
            sampler_code = "self." + fresh_name(self.fm, self._taken, names + "_sampler", own.cls)
        else:
            sampler_code = fresh_name(self.fm, self._taken, names + "_sampler", local_scope)
        plan = _Plan(call=call, sampler=sampler_code)

        shuffle = self._shuffle(call, args, plan)
        if shuffle is None:
            return manual(
                "its keyword arguments come from a ** expression that is not a name; pass shuffle "
                "explicitly"
            )

        if (split := new_unseeded_split(self.fm, dataset.value, self._splits)) is not None:
            self.record(split, SEEDED_SPLIT)
        new_statements: list[cst.BaseStatement] = []
        dataset_code = self.module.code_for_node(dataset.value)
        if not is_simple_reference(dataset.value):
            plan.dataset_name = fresh_name(self.fm, self._taken, names + "_dataset", local_scope)
            plan.dataset_arg = dataset_index
            new_statements.append(cst.parse_statement(f"{plan.dataset_name} = {dataset_code}\n"))
            dataset_code = plan.dataset_name
        torch = torch_spelling(self.fm, self.add_import)
        sampler_args = [dataset_code, f"num_replicas={self.sdp}.size()", f"rank={self.sdp}.rank()",
                        f"shuffle={shuffle}"]
        head = f"{sampler_code} = {torch}.utils.data.distributed.DistributedSampler("
        if feed is not None and not self.state.info.training:
            # A module other code imports too: without init() (a single-process importer) the
            # loader keeps the sampler DataLoader itself would have made.
            new_statements.append(single_process_fallback(
                self.fm, sampler_code, head.split(" = ", 1)[1][:-1], sampler_args, shuffle
            ))
        else:
            new_statements.append(statement(self.fm, head, sampler_args, stmt))
        epochs = self._set_epochs(sites, own, plan, stmt, flow) if _may_shuffle(shuffle) else []
        if feed is not None:
            self.state.facts.exports.append((call, feed.function, feed.index,
                                             _may_shuffle(shuffle), False))

        # Apply: everything is decided, now edit and report.
        if isinstance(stmt, cst.SimpleStatementLine) and stmt.leading_lines:
            # The statement's comment and blank lines go above what is inserted before it.
            new_statements[0] = new_statements[0].with_changes(leading_lines=stmt.leading_lines)
            self._strip_leading.add(stmt)
        for where, set_epoch in epochs:
            if where.inside:
                new_statements.append(set_epoch)
        if plan.dataset_name:
            self.hoist(dataset.value, new_statements[0])
        self.insert_before(stmt, *new_statements)
        for where, set_epoch in epochs:
            if not where.inside and where.before is not None:
                self.insert_before(where.before, set_epoch)
        self._plans[call] = plan
        self.add_runtime_import()
        hoisted = f", its dataset built once as {plan.dataset_name}" if plan.dataset_name else ""
        self.record(
            call,
            f"give {label} a DistributedSampler ({sampler_code}, shuffle={shuffle}) so that each "
            f"rank reads its own shard{hoisted}{used_by}",
        )
        for where, set_epoch in epochs:
            target = call if where.inside else where.loop
            self.record(
                target,
                f"call {self.module.code_for_node(set_epoch).strip()} at the start of each epoch",
            )
        if (
            _may_shuffle(shuffle) and not epochs and not self.method_calls("set_epoch")
            and (id(stmt), "") not in self._epochs
            and feed is None  # the importer's epoch loop calls it
            and repair is None  # so does the loop this loader feeds (``known_loader``)
        ):
            holder = named.code if named is not None else "loader"
            receiver = sampler_code if own is not None else f"{holder}.sampler"
            self.record(
                call,
                f"call {receiver}.set_epoch(epoch) at the start of every epoch (found no "
                "`for epoch in range(...)` loop, nor a loop counting its passes over the loader, "
                "to put it in), or every epoch sees the same order",
                manual=True,
            )
        return True

    def _shuffle(self, call: cst.Call, args: dict, plan: _Plan) -> str | None:
        """The sampler's ``shuffle=`` code; plans its removal from the loader. None: unknown."""
        if (plain := plain_sampler(self.fm, call)) is not None:  # sampler=RandomSampler(ds)
            return plain  # replaced by the DistributedSampler
        index = args.get("shuffle")
        if index is not None:
            plan.shuffle_arg = index
            return self.module.code_for_node(call.args[index].value)
        splats = [i for i, a in enumerate(call.args) if a.star == "**"]
        if not splats:
            return "False"  # DataLoader's default (the sampler's default would be True)
        if len(splats) > 1:
            return None
        index = splats[0]
        value = call.args[index].value
        literal = kwargs_literal(self.fm, value)
        if literal is not None:
            dict_node, shuffle_index = literal
            if shuffle_index is None:
                return "False"
            self._dict_drops[dict_node] = shuffle_index
            element = dict_node.elements[shuffle_index]
            return self.module.code_for_node(element.value)
        if not is_simple_reference(value):
            return None
        plan.general_kwargs_arg = index
        return f'{self.module.code_for_node(value)}.get("shuffle", False)'

    # -- set_epoch ------------------------------------------------------------------------------

    def _set_epochs(
        self,
        sites: list[Site],
        own: Binding | None,
        plan: _Plan,
        stmt: cst.CSTNode,
        flow: set[int],
    ) -> list[tuple[EpochSite, cst.BaseStatement]]:
        """``(where, set_epoch statement)`` (``program.sharding.set_epoch_site``)."""
        found: list[tuple[EpochSite, cst.BaseStatement]] = []
        for site in sites:
            where = set_epoch_site(self.fm, site, own, plan.sampler, stmt, flow)
            if where is None:
                continue
            key = (id(where.loop), where.receiver)
            if key in self._epochs:  # planned already, for this loader or another one
                self._epochs.add((id(stmt), ""))
                continue
            if sets_epoch(self.fm, where.loop, where.receiver) or (
                not where.inside and where.before is None
            ):
                continue
            self._epochs.add(key)
            set_epoch = cst.parse_statement(f"{where.receiver}.set_epoch({where.counter})\n")
            found.append((where, set_epoch))
        return found

    # -- the rewrite ----------------------------------------------------------------------------

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if original_node in self._splits:
            return seeded_split(self.fm, updated_node, torch_spelling(self.fm, self.add_import))
        plan = self._plans.get(original_node)
        if plan is None or len(updated_node.args) != len(original_node.args):
            return updated_node
        args = list(updated_node.args)
        if plan.dataset_arg is not None and plan.dataset_name is not None:
            args[plan.dataset_arg] = args[plan.dataset_arg].with_changes(
                value=cst.Name(plan.dataset_name)
            )
        if plan.general_kwargs_arg is not None:
            arg = args[plan.general_kwargs_arg]
            args[plan.general_kwargs_arg] = arg.with_changes(
                value=cst.parse_expression(
                    f'{{**{self.module.code_for_node(arg.value)}, "shuffle": False}}'
                )
            )
        sampler_arg = cst.Arg(
            keyword=cst.Name("sampler"),
            value=cst.parse_expression(plan.sampler),
            equal=cst.AssignEqual(
                whitespace_before=cst.SimpleWhitespace(""),
                whitespace_after=cst.SimpleWhitespace(""),
            ),
        )
        # A sampler=None argument is replaced too.
        for i, arg in enumerate(args):
            if arg.keyword is not None and arg.keyword.value == "sampler":
                args[i] = sampler_arg.with_changes(comma=arg.comma)
                if plan.shuffle_arg is not None:
                    del args[plan.shuffle_arg]
                    fix_last_comma(args, original_node.args)
                break
        else:
            if plan.shuffle_arg is not None:
                args[plan.shuffle_arg] = sampler_arg.with_changes(
                    comma=args[plan.shuffle_arg].comma
                )
            else:
                args = append_arg(args, sampler_arg, updated_node)
        return updated_node.with_changes(args=args)

    def leave_Dict(self, original_node: cst.Dict, updated_node: cst.Dict) -> cst.BaseExpression:
        index = self._dict_drops.get(original_node)
        if index is None:
            return updated_node
        elements = list(updated_node.elements)
        removed = elements.pop(index)
        if index == len(elements) and elements:
            elements[-1] = elements[-1].with_changes(comma=removed.comma)
        self.record(
            original_node,
            "take 'shuffle' out of this dict: it goes to the DistributedSampler "
            "(DataLoader refuses shuffle next to a sampler)",
        )
        return updated_node.with_changes(elements=elements)

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.SimpleStatementLine:
        if original_node in self._strip_leading:
            return updated_node.with_changes(leading_lines=())
        return updated_node


# -- helpers for this transform --------------------------------------------------------------


def _arg(call: cst.Call, index: int | None) -> cst.Arg | None:
    return call.args[index] if index is not None else None


def _may_shuffle(code: str) -> bool:
    return code not in ("False", "None", "0")
