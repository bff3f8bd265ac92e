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
  loader, right after the sampler when the loader is made inside the epoch loop. None when the
  loader never shuffles; a manual note when no such loop is found.
* Manual notes: a training loader with its own ``sampler``/``batch_sampler``, over an
  ``IterableDataset`` (streams), with ``*args``, or whose ``shuffle`` cannot be seen; and a
  training script whose loop reads no DataLoader at all (batches sliced by hand).
* Idempotent: a loader whose ``sampler`` is (a name bound to) a DistributedSampler is left alone.

The value-flow questions (bindings, uses, callers, callees, file order, names in a scope) are
the program layer's (``sdp_convert.program.scopes``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m
from libcst.codemod.visitors import AddImportsVisitor
from libcst.metadata.scope_provider import BaseAssignment

from ..base import Transform
from ..program.scopes import (
    Binding,
    _method_class,
    _self_attribute_values,
    assigned_binding,
    assigned_values,
    binding_of,
    callee,
    callers,
    names_in,
    param_for_arg,
    referents,
    training_loops,
    uses,
)

_LOADERS = ("torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader")
_DISTRIBUTED_SAMPLERS = (
    "torch.utils.data.distributed.DistributedSampler",
    "torch.utils.data.DistributedSampler",
)
# Datasets a sampler cannot index: they must shard themselves.
_ITERABLE_DATASETS = (
    "torch.utils.data.IterableDataset",
    "torch.utils.data.dataset.IterableDataset",
    "torch.utils.data.ChainDataset",
    "torch.utils.data.dataset.ChainDataset",
    "datasets.IterableDataset",
)
_ITERABLE_PREFIXES = ("torchdata.", "webdataset.", "torch.utils.data.datapipes.")
# DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, ...): positional indices.
_POSITIONS = {"dataset": 0, "shuffle": 2, "sampler": 3, "batch_sampler": 4}
_MAX_LINE = 99


@dataclass
class _Site:
    """A loop that iterates the loader (``for x in loader``, ``next(it)`` in a loop)."""

    loop: cst.For | cst.While
    use: cst.CSTNode  # the expression holding the loader there
    binding: Binding | None  # the binding ``use`` reads; None for the DataLoader call itself
    # (call, use, binding) through which the loader was passed down to the loop's function.
    trail: tuple[tuple[cst.Call, cst.CSTNode, Binding | None], ...] = ()


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

    def prepare(self, module: cst.Module) -> None:
        self._plans: dict[cst.Call, _Plan] = {}
        self._dict_drops: dict[cst.Dict, int] = {}  # dict literal -> index of "shuffle" to drop
        self._strip_leading: set[cst.CSTNode] = set()
        self._taken: dict[cst.CSTNode, set[str]] = {}
        loaders = self.calls_to(*_LOADERS)
        self._training_loops = training_loops(self) if loaders else set()
        handled = False
        for call in loaders:
            handled = self._handle(call) or handled
        backward = self.method_calls("backward")
        if not handled and backward:
            self.record(
                backward[0],
                "no DataLoader feeding this training loop was found: give each rank its own part "
                f"of the training data (a DistributedSampler, or indices[{self.sdp}.rank()::"
                f"{self.sdp}.size()])",
                manual=True,
            )

    # -- one loader -----------------------------------------------------------------------------

    def _handle(self, call: cst.Call) -> bool:
        """Plan the change of one DataLoader call; whether it is a training loader (or handled)."""
        args = _parse_args(call)
        sampler = _arg(call, args.get("sampler"))
        if sampler is not None and self._is_distributed_sampler(sampler.value):
            return True  # sharded already (by us or by hand)
        own = assigned_binding(self, call)
        all_sites, flow = self._sites(call)
        sites = [s for s in all_sites if s.loop in self._training_loops]
        if not sites:
            return False  # evaluation, or not iterated where we can see it
        label = own.code if own else "this DataLoader"
        returned = isinstance(self.parent(call), cst.Return)
        factory = self.enclosing_function(call) if returned else None
        if factory is not None:
            label = f"the DataLoader {factory.name.value}() returns"
        named = own or next((s.binding for s in sites if s.binding and not s.trail), None)

        def manual(reason: str) -> bool:
            self.record(call, f"{label} feeds training but is not sharded: {reason}", manual=True)
            return True

        if any(a.star == "*" for a in call.args) or len(args.get("positional", ())) > 3:
            return manual("pass its arguments by keyword, then add a DistributedSampler")
        if sampler is not None and not _is_none(sampler.value):
            return manual(
                "it has its own sampler; make it yield only this rank's indices "
                f"(e.g. indices[{self.sdp}.rank()::{self.sdp}.size()])"
            )
        if args.get("batch_sampler") is not None:
            return manual(
                "it has a batch_sampler; make it yield only this rank's batches "
                f"(e.g. batches[{self.sdp}.rank()::{self.sdp}.size()])"
            )
        dataset_index = args.get("dataset")
        dataset = _arg(call, dataset_index)
        if dataset is None:
            return manual("its dataset is not passed as an argument we can see")
        if self._is_iterable_dataset(dataset.value):
            return manual(
                "its dataset is an IterableDataset (a stream), which a sampler cannot split; "
                f"skip the items whose index % {self.sdp}.size() != {self.sdp}.rank() in its "
                "__iter__"
            )
        stmt = self.enclosing_statement(call)
        if stmt is None or not self._statement_is_plain(call, stmt):
            return manual("put the DataLoader(...) call on a line of its own")

        names = _loader_base(named)
        local_scope = self.enclosing_function(stmt) or self.module
        if own is not None and own.cls is not None:
            sampler_code = "self." + self._unique(names + "_sampler", own.cls)
        else:
            sampler_code = self._unique(names + "_sampler", local_scope)
        plan = _Plan(call=call, sampler=sampler_code)

        shuffle = self._shuffle(call, args, plan)
        if shuffle is None:
            return manual(
                "its keyword arguments come from a ** expression that is not a name; pass shuffle "
                "explicitly"
            )

        new_statements: list[cst.BaseStatement] = []
        dataset_code = self.module.code_for_node(dataset.value)
        if not _is_simple_reference(dataset.value):
            plan.dataset_name = self._unique(names + "_dataset", local_scope)
            plan.dataset_arg = dataset_index
            new_statements.append(cst.parse_statement(f"{plan.dataset_name} = {dataset_code}\n"))
            dataset_code = plan.dataset_name
        torch = self._torch_name()
        new_statements.append(
            self._statement(
                f"{sampler_code} = {torch}.utils.data.distributed.DistributedSampler(",
                [
                    dataset_code,
                    f"num_replicas={self.sdp}.size()",
                    f"rank={self.sdp}.rank()",
                    f"shuffle={shuffle}",
                ],
                stmt,
            )
        )
        epochs = self._set_epochs(sites, own, plan, stmt, flow) if _may_shuffle(shuffle) else []

        # Apply: everything is decided, now edit and report.
        if isinstance(stmt, cst.SimpleStatementLine) and stmt.leading_lines:
            # The statement's comment and blank lines go above what is inserted before it.
            new_statements[0] = new_statements[0].with_changes(leading_lines=stmt.leading_lines)
            self._strip_leading.add(stmt)
        for loop, set_epoch in epochs:
            if loop is None:
                new_statements.append(set_epoch)
        self.insert_before(stmt, *new_statements)
        for loop, set_epoch in epochs:
            if loop is not None:
                assert isinstance(loop.body, cst.IndentedBlock)
                self.insert_before(loop.body.body[0], set_epoch)
        self._plans[call] = plan
        self.add_runtime_import()
        hoisted = f", its dataset built once as {plan.dataset_name}" if plan.dataset_name else ""
        self.record(
            call,
            f"give {label} a DistributedSampler ({sampler_code}, shuffle={shuffle}) so that each "
            f"rank reads its own shard{hoisted}",
        )
        for loop, set_epoch in epochs:
            target = loop if loop is not None else call
            self.record(
                target,
                f"call {self.module.code_for_node(set_epoch).strip()} at the start of each epoch",
            )
        if _may_shuffle(shuffle) and not epochs and not self.method_calls("set_epoch"):
            holder = named.code if named is not None else "loader"
            receiver = sampler_code if own is not None else f"{holder}.sampler"
            self.record(
                call,
                f"call {receiver}.set_epoch(epoch) at the start of every epoch (found no "
                "`for epoch in range(...)` loop to put it in), or every epoch sees the same order",
                manual=True,
            )
        return True

    def _shuffle(self, call: cst.Call, args: dict, plan: _Plan) -> str | None:
        """The sampler's ``shuffle=`` code; plans its removal from the loader. None: unknown."""
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
        literal = self._kwargs_literal(value)
        if literal is not None:
            dict_node, shuffle_index = literal
            if shuffle_index is None:
                return "False"
            self._dict_drops[dict_node] = shuffle_index
            element = dict_node.elements[shuffle_index]
            return self.module.code_for_node(element.value)
        if not _is_simple_reference(value):
            return None
        plan.general_kwargs_arg = index
        return f'{self.module.code_for_node(value)}.get("shuffle", False)'

    def _kwargs_literal(self, value: cst.BaseExpression) -> tuple[cst.Dict, int | None] | None:
        """``kw`` bound once to a dict literal that nothing else can add "shuffle" to."""
        if not isinstance(value, cst.Name):
            return None
        refs = referents(self, value)
        if len(refs) != 1:
            return None
        (assignment,) = refs
        dict_node = self._assigned_dict(assignment)
        if dict_node is None:
            return None
        keys = _literal_keys(dict_node)
        if keys is None:
            return None
        for access in assignment.references:
            use = access.node
            if use is value:
                continue
            parent = self.parent(use)
            if isinstance(parent, cst.Arg) and parent.star == "**":
                continue  # splatted into another call: fine
            if not (isinstance(parent, cst.Attribute) and parent.value is use):
                return None
            method = parent.attr.value
            if method in ("get", "copy", "items", "keys", "values"):
                continue
            if method != "update":
                return None
            update = self.parent(parent)
            if not isinstance(update, cst.Call) or not all(
                a.keyword is None and not a.star and self._dict_without_shuffle(a.value)
                for a in update.args
            ):
                return None
        shuffle = [i for i, key in enumerate(keys) if key == "shuffle"]
        if shuffle and not _is_movable(dict_node.elements[shuffle[0]].value):
            return None
        return dict_node, (shuffle[0] if shuffle else None)

    def _dict_without_shuffle(self, expr: cst.BaseExpression) -> bool:
        if isinstance(expr, cst.Name):
            refs = referents(self, expr)
            if len(refs) != 1:
                return False
            found = self._assigned_dict(next(iter(refs)))
            if found is None:
                return False
            expr = found
        keys = _literal_keys(expr) if isinstance(expr, cst.Dict) else None
        return keys is not None and "shuffle" not in keys

    def _assigned_dict(self, assignment: BaseAssignment) -> cst.Dict | None:
        target = getattr(assignment, "node", None)
        holder = self.parent(target) if target is not None else None
        assign = self.parent(holder) if isinstance(holder, cst.AssignTarget) else None
        if (
            isinstance(assign, cst.Assign)
            and len(assign.targets) == 1
            and isinstance(assign.value, cst.Dict)
        ):
            return assign.value
        return None

    # -- where the loader goes ------------------------------------------------------------------

    def _sites(self, call: cst.Call) -> tuple[list[_Site], set[int]]:
        """The loops iterating the loader, and every node its value was followed through."""
        sites: list[_Site] = []
        seen: set[int] = set()
        self._flow(call, None, (), 0, sites, seen)
        return sites, seen

    def _flow(
        self,
        node: cst.CSTNode,
        binding: Binding | None,
        trail: tuple[tuple[cst.Call, cst.CSTNode, Binding | None], ...],
        depth: int,
        sites: list[_Site],
        seen: set[int],
    ) -> None:
        """Follow the value of ``node`` to the loops that iterate it."""
        if id(node) in seen or depth > 4:
            return
        seen.add(id(node))
        loop = self._iterated_by(node)
        if loop is not None:
            sites.append(_Site(loop, node, binding, trail))
            return
        target = assigned_binding(self, node)
        if target is not None:
            for use in uses(self, target):
                self._flow(use, target, trail, depth, sites, seen)
            return
        parent = self.parent(node)
        if isinstance(parent, cst.Arg) and parent.value is node:
            call = self.parent(parent)
            if not isinstance(call, cst.Call):
                return
            if self.refers_to(call.func, "builtins.iter"):
                self._flow_iterator(call, binding, trail, depth, sites, seen)
                return
            function = callee(self, call)
            param = param_for_arg(function, call, parent) if function is not None else None
            if param is not None:
                param_binding = binding_of(self, param)
                if param_binding is not None:
                    for use in uses(self, param_binding):
                        self._flow(
                            use,
                            param_binding,
                            (*trail, (call, node, binding)),
                            depth + 1,
                            sites,
                            seen,
                        )
            return
        if isinstance(parent, cst.Return) and parent.value is node:
            function = self.enclosing_function(node)
            for caller in callers(self, function) if function is not None else ():
                self._flow(caller, None, (), depth + 1, sites, seen)
            return
        # ``return train, val`` ... ``train_loader, val_loader = get_loaders()``
        tuple_node = self.parent(parent) if isinstance(parent, cst.Element) else None
        returned = self.parent(tuple_node) if isinstance(tuple_node, cst.Tuple) else None
        if isinstance(returned, cst.Return) and returned.value is tuple_node:
            assert isinstance(tuple_node, cst.Tuple)
            index = next(i for i, e in enumerate(tuple_node.elements) if e is parent)
            function = self.enclosing_function(node)
            for caller in callers(self, function) if function is not None else ():
                element = _unpacked_target(self, caller, index, len(tuple_node.elements))
                unpacked = binding_of(self, element) if element is not None else None
                if unpacked is not None:
                    for use in uses(self, unpacked):
                        self._flow(use, unpacked, (), depth + 1, sites, seen)

    def _flow_iterator(
        self,
        iter_call: cst.Call,
        binding: Binding | None,
        trail: tuple[tuple[cst.Call, cst.CSTNode, Binding | None], ...],
        depth: int,
        sites: list[_Site],
        seen: set[int],
    ) -> None:
        """``it = iter(loader)`` ... ``next(it)`` inside a loop: that loop iterates the loader."""
        target = assigned_binding(self, iter_call)
        if target is None:
            return
        for use in uses(self, target):
            arg = self.parent(use)
            call = self.parent(arg) if isinstance(arg, cst.Arg) else None
            if isinstance(call, cst.Call) and self.refers_to(call.func, "builtins.next"):
                loop = self._enclosing_loop(call)
                if loop is not None:
                    sites.append(_Site(loop, iter_call.args[0].value, binding, trail))

    def _iterated_by(self, node: cst.CSTNode) -> cst.For | None:
        """The ``for`` whose iterable is ``node``, possibly wrapped (``enumerate(node)``)."""
        for _ in range(4):
            parent = self.parent(node)
            if isinstance(parent, cst.For) and parent.iter is node:
                return parent
            if not (isinstance(parent, cst.Arg) and parent.value is node):
                return None
            call = self.parent(parent)
            if not isinstance(call, cst.Call) or self.refers_to(
                call.func, "builtins.iter", "builtins.len"
            ):
                return None
            node = call
        return None

    def _enclosing_loop(self, node: cst.CSTNode) -> cst.For | cst.While | None:
        for parent in self.ancestors(node):
            if isinstance(parent, (cst.For, cst.While)):
                return parent
            if isinstance(parent, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                return None
        return None

    # -- set_epoch ------------------------------------------------------------------------------

    def _set_epochs(
        self,
        sites: list[_Site],
        own: Binding | None,
        plan: _Plan,
        stmt: cst.CSTNode,
        flow: set[int],
    ) -> list[tuple[cst.For | None, cst.BaseStatement]]:
        """``(epoch loop, set_epoch statement)``; loop None: right after the sampler is made."""
        found: list[tuple[cst.For | None, cst.BaseStatement]] = []
        keys: set[tuple[int, str]] = set()
        for site in sites:
            where = self._epoch_loop(site)
            if where is None:
                continue
            loop, holder = where
            if holder is None or (own is not None and holder.same_as(own)):
                receiver = plan.sampler
            elif self._holds_only(holder, flow):
                receiver = f"{holder.code}.sampler"
            else:
                continue  # a parameter other callers fill with other loaders
            target = loop.target
            assert isinstance(target, cst.Name)
            inside = any(a is loop for a in self.ancestors(stmt))
            if inside:
                receiver = plan.sampler  # the loader is made anew each epoch, right here
            key = (id(loop), receiver)
            if key in keys or self._loop_sets_epoch(loop, receiver):
                continue
            if not inside and not isinstance(loop.body, cst.IndentedBlock):
                continue
            keys.add(key)
            set_epoch = cst.parse_statement(f"{receiver}.set_epoch({target.value})\n")
            found.append((None if inside else loop, set_epoch))
        return found

    def _holds_only(self, holder: Binding, flow: set[int]) -> bool:
        """A parameter: whether every call of its function passes this loader to it."""
        param = getattr(holder.assignment, "node", None)
        if not isinstance(param, cst.Param):
            return True
        function = self.enclosing_function(param)
        if function is None:
            return False
        calls = callers(self, function)
        for call in calls:
            arg = next((a for a in call.args if param_for_arg(function, call, a) is param), None)
            if arg is None or id(arg.value) not in flow:
                return False
        return bool(calls)

    def _epoch_loop(self, site: _Site) -> tuple[cst.For, Binding | None] | None:
        """The ``for epoch in range(...)`` around a training loop, and what holds the loader."""
        loop = _range_loop_around(self, site.loop)
        if loop is not None:
            return loop, site.binding
        for call, _use, binding in reversed(site.trail):
            loop = _range_loop_around(self, call)
            if loop is not None:
                return loop, binding
        # A loader in a global or ``self.<attr>``: look where the function using it is called.
        root = site.trail[0][2] if site.trail else site.binding
        if root is None or not root.is_shared:
            return None
        start: cst.CSTNode = site.trail[0][0] if site.trail else site.loop
        frontier = [self.enclosing_function(start)]
        for _ in range(3):
            next_frontier: list[cst.FunctionDef | None] = []
            for function in frontier:
                for caller in callers(self, function) if function is not None else ():
                    loop = _range_loop_around(self, caller)
                    if loop is not None and (
                        root.cls is None or _method_class(self, caller) is root.cls
                    ):
                        return loop, root
                    next_frontier.append(self.enclosing_function(caller))
            frontier = next_frontier
        return None

    def _loop_sets_epoch(self, loop: cst.For, receiver: str) -> bool:
        for call in self.method_calls("set_epoch"):
            assert isinstance(call.func, cst.Attribute)
            if self.module.code_for_node(call.func.value) == receiver and any(
                a is loop for a in self.ancestors(call)
            ):
                return True
        return False

    # -- small questions ------------------------------------------------------------------------

    def _is_distributed_sampler(self, expr: cst.BaseExpression) -> bool:
        if isinstance(expr, cst.IfExp):
            return self._is_distributed_sampler(expr.body) or self._is_distributed_sampler(
                expr.orelse
            )
        if isinstance(expr, cst.Call):
            return self.refers_to(expr.func, *_DISTRIBUTED_SAMPLERS)
        if isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name):
            if expr.value.value == "self":
                return any(
                    self._is_distributed_sampler(v) for v in _self_attribute_values(self, expr)
                )
            return False
        if isinstance(expr, cst.Name):
            return any(self._is_distributed_sampler(v) for v in assigned_values(self, expr))
        return False

    def _is_iterable_dataset(self, expr: cst.BaseExpression) -> bool:
        values: list[cst.BaseExpression] = [expr]
        if isinstance(expr, cst.Name):
            values = assigned_values(self, expr)
        for value in values:
            if not isinstance(value, cst.Call):
                continue
            if self.refers_to(value.func, "datasets.load_dataset") and any(
                a.keyword is not None and a.keyword.value == "streaming" and not _is_false(a.value)
                for a in value.args
            ):
                return True
            if self._is_iterable_class(value.func, 0):
                return True
        return False

    def _is_iterable_class(self, func: cst.BaseExpression, depth: int) -> bool:
        names = self.qualified_names(func)
        if any(n in _ITERABLE_DATASETS or n.startswith(_ITERABLE_PREFIXES) for n in names):
            return True
        if depth > 3 or not isinstance(func, cst.Name):
            return False
        for assignment in referents(self, func):
            cls = getattr(assignment, "node", None)
            if isinstance(cls, cst.ClassDef) and any(
                self._is_iterable_class(base.value, depth + 1) for base in cls.bases
            ):
                return True
        return False

    def _statement_is_plain(self, call: cst.Call, stmt: cst.CSTNode) -> bool:
        """Statements can be inserted before ``stmt`` and run right before ``call``."""
        for parent in self.ancestors(call):
            if parent is stmt:
                return True
            if isinstance(
                parent,
                (cst.SimpleStatementSuite, cst.Lambda, cst.BaseComp, cst.IndentedBlock, cst.IfExp),
            ):
                return False
            if isinstance(parent, cst.BooleanOperation):
                return False
        return False

    def _torch_name(self) -> str:
        """The module-level name bound to ``torch``; schedules an import if there is none."""
        for stmt in self.module.body:
            if not m.matches(stmt, m.SimpleStatementLine(body=[m.Import()])):
                continue
            assert isinstance(stmt, cst.SimpleStatementLine)
            imp = stmt.body[0]
            assert isinstance(imp, cst.Import)
            for alias in imp.names:
                full = cst.helpers.get_full_name_for_node(alias.name) or ""
                if alias.asname is not None:
                    if full == "torch" and isinstance(alias.asname.name, cst.Name):
                        return alias.asname.name.value
                elif full == "torch" or full.startswith("torch."):
                    return "torch"
        AddImportsVisitor.add_needed_import(self.context, "torch.utils.data.distributed")
        return "torch"

    def _unique(self, name: str, scope: cst.CSTNode) -> str:
        """``name``, or ``name_2``, ... : not yet a name in ``scope`` (a function, class, module).

        Every identifier read or written in ``scope`` counts (a global read there must not be
        shadowed); at module level that is every identifier of the file.
        """
        taken = self._taken.get(scope)
        if taken is None:
            taken = self._taken[scope] = names_in(self, scope)
        candidate, n = name, 2
        while candidate in taken:
            candidate, n = f"{name}_{n}", n + 1
        taken.add(candidate)
        if scope is not self.module:
            self._taken.setdefault(self.module, names_in(self, self.module)).add(candidate)
        return candidate

    def _statement(self, head: str, args: list[str], at: cst.CSTNode) -> cst.BaseStatement:
        """``head`` + ``args`` + ``)``: on one line, on three, or one argument a line (as black
        would), whichever first fits in ``_MAX_LINE`` columns where it goes."""
        step = self.module.default_indent
        indent = len(step) * sum(1 for a in self.ancestors(at) if isinstance(a, cst.IndentedBlock))
        inner = ", ".join(args)
        if indent + len(head) + len(inner) + 1 <= _MAX_LINE:
            return cst.parse_statement(f"{head}{inner})\n")
        if indent + len(step) + len(inner) <= _MAX_LINE:
            return cst.parse_statement(f"{head}\n{step}{inner}\n)\n")
        lines = "".join(f"{step}{arg},\n" for arg in args)
        return cst.parse_statement(f"{head}\n{lines})\n")

    # -- the rewrite ----------------------------------------------------------------------------

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
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
                    _fix_last_comma(args, original_node.args)
                break
        else:
            if plan.shuffle_arg is not None:
                args[plan.shuffle_arg] = sampler_arg.with_changes(
                    comma=args[plan.shuffle_arg].comma
                )
            else:
                args = _append_arg(args, sampler_arg, updated_node)
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


def _parse_args(call: cst.Call) -> dict:
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


def _arg(call: cst.Call, index: int | None) -> cst.Arg | None:
    return call.args[index] if index is not None else None


def _is_none(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Name) and expr.value == "None"


def _is_false(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Name) and expr.value in ("False", "None")


def _may_shuffle(code: str) -> bool:
    return code not in ("False", "None", "0")


def _is_simple_reference(expr: cst.BaseExpression) -> bool:
    """A name or a dotted name: cheap and the same each time it is read."""
    while isinstance(expr, cst.Attribute):
        expr = expr.value
    return isinstance(expr, cst.Name)


def _is_movable(expr: cst.BaseExpression) -> bool:
    return _is_simple_reference(expr) or isinstance(expr, (cst.Integer, cst.SimpleString))


def _literal_keys(node: cst.Dict) -> list[str] | None:
    keys: list[str] = []
    for element in node.elements:
        if not isinstance(element, cst.DictElement) or not isinstance(
            element.key, cst.SimpleString
        ):
            return None
        value = element.key.evaluated_value
        keys.append(value if isinstance(value, str) else "")
    return keys


def _loader_base(binding: Binding | None) -> str:
    """``train_loader`` -> ``train``; ``loader`` -> ``loader``; unknown -> ``train``."""
    if binding is None:
        return "train"
    name = binding.attr if binding.cls is not None else binding.name
    for suffix in ("_dataloader", "_loader"):
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name


def _append_arg(args: list[cst.Arg], new: cst.Arg, call: cst.Call) -> list[cst.Arg]:
    """``args`` with ``new`` last, keeping a trailing comma and one-argument-a-line layouts."""
    if not args:
        return [new]
    last = args[-1]
    if isinstance(last.comma, cst.Comma):
        # A trailing comma: the new argument goes after it, laid out as the others are.
        separator = (
            args[-2].comma.whitespace_after
            if len(args) > 1 and isinstance(args[-2].comma, cst.Comma)
            else call.whitespace_before_args
        )
        args[-1] = last.with_changes(comma=last.comma.with_changes(whitespace_after=separator))
        return [*args, new.with_changes(comma=last.comma)]
    args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return [*args, new]


def _fix_last_comma(args: list[cst.Arg], original: Sequence[cst.Arg]) -> None:
    if args and len(original) > len(args):
        args[-1] = args[-1].with_changes(comma=original[-1].comma)


def _unpacked_target(t: Transform, value: cst.CSTNode, index: int, size: int) -> cst.CSTNode | None:
    """In ``a, b = value``, the ``index``-th target (when there are ``size``, none starred)."""
    assign = t.parent(value)
    if not (isinstance(assign, cst.Assign) and assign.value is value and len(assign.targets) == 1):
        return None
    target = assign.targets[0].target
    if not isinstance(target, (cst.Tuple, cst.List)) or len(target.elements) != size:
        return None
    if any(isinstance(e, cst.StarredElement) for e in target.elements):
        return None
    return target.elements[index].value


def _range_loop_around(t: Transform, node: cst.CSTNode) -> cst.For | None:
    """The nearest ``for <name> in range(...)`` (or ``trange``/``tqdm(range(...))``) around node."""
    child = node
    for parent in t.ancestors(node):
        if isinstance(parent, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return None
        if (
            isinstance(parent, cst.For)
            and child is parent.body
            and isinstance(parent.target, cst.Name)
        ):
            it = parent.iter
            if isinstance(it, cst.Call) and (
                t.refers_to(it.func, "builtins.range")
                or any(q.endswith(".trange") for q in t.qualified_names(it.func))
                or (
                    it.args
                    and isinstance(it.args[0].value, cst.Call)
                    and t.refers_to(it.args[0].value.func, "builtins.range")
                )
            ):
                return parent
        child = parent
    return None


# -- value flow: generic helpers (also used by guard_rank0_writes; candidates for base.py) -----


