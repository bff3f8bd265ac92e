"""Split the training data of a loader factory that builds the evaluation loaders too: a flag that
only the training calls set gives its DataLoader a DistributedSampler.

Before::

    def get_data_loader(dataset, batch_size, shuffle=False):
        data_loader = DataLoader(dataset=dataset, batch_size=batch_size, shuffle=shuffle)
        return data_loader

    train_loader = get_data_loader(train_data, 64, shuffle=True)
    valid_loader = get_data_loader(valid_data, 64)
    for epoch in range(epochs):
        train(train_loader, model, optimizer)
        evaluate(valid_loader, model)

After::

    def get_data_loader(dataset, batch_size, shuffle=False, shard=False):
        data_loader_sampler = (
            torch.utils.data.distributed.DistributedSampler(
                dataset, num_replicas=sdp.size(), rank=sdp.rank(), shuffle=shuffle
            )
            if shard
            else None
        )
        data_loader = DataLoader(dataset=dataset, batch_size=batch_size,
                                 shuffle=False if shard else shuffle, sampler=data_loader_sampler)
        return data_loader

    train_loader = get_data_loader(train_data, 64, shuffle=True, shard=True)
    valid_loader = get_data_loader(valid_data, 64)
    for epoch in range(epochs):
        train_loader.sampler.set_epoch(epoch)
        train(train_loader, model, optimizer)
        evaluate(valid_loader, model)

Why: a DistributedSampler added where the loader is built (``shard_dataloader``'s edit) would
split the evaluation data as well, each rank scoring its own part. With the flag, only the loaders
that feed training are split; the others are built exactly as before (the flag defaults to off,
also for callers in other modules).

Decisions:

* Which calls train and which evaluate is ``program.sharding.shared_factory``'s answer (the loops
  each call's loader reaches); the edit is ``factory_split``'s plan. Where it cannot be made (a
  ``**`` argument, a sampler of the loader's own that is not a plain ``RandomSampler`` /
  ``SequentialSampler``, a dataset that is not a name) ``shard_dataloader`` keeps its manual note
  naming the callers and this same edit.
* The flag is named ``shard`` (``shard_2``, ... where taken), added after the last parameter
  (keyword-only after ``*args``); the training calls pass ``shard=True``.
* A plain sampler of the loader's own (``sampler=RandomSampler(ds)``, or a name bound to one and
  read only there) stays the sampler when the flag is off; the DistributedSampler takes its
  ``shuffle`` (True for ``RandomSampler``). ``shuffle=`` on the loader becomes
  ``False if shard else <shuffle>`` (DataLoader refuses shuffle next to a sampler).
* ``<loader>.sampler.set_epoch(epoch)`` goes first in the ``for epoch in range(...)`` around each
  training loop, on the caller's variable (``program.sharding.set_epoch_site``); a manual note
  where there is none.
"""

from __future__ import annotations

import libcst as cst

from ..base import Transform
from ..program.builders import conditional_statement, fresh_name, torch_spelling
from ..program.flow import epoch_loop, loader_sites
from ..program.loaders import LOADERS, loader_base_name, sets_epoch
from ..program.scopes import assigned_binding, runs_whenever, training_loops
from ..program.sharding import FactorySplit, factory_split, set_epoch_site
from ..program.syntax import append_arg


def _keyword(name: str, value: str) -> cst.Arg:
    return cst.Arg(
        keyword=cst.Name(name),
        value=cst.parse_expression(value),
        equal=cst.AssignEqual(
            whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
        ),
    )


class ShardSharedLoader(Transform):
    DESCRIPTION = (
        "Give a loader factory shared by training and evaluation a flag that only the training "
        "calls set, adding a DistributedSampler (and set_epoch each epoch)."
    )
    FRAMEWORKS = frozenset({"torch"})

    def prepare(self, module: cst.Module) -> None:
        self._taken: dict[cst.CSTNode, set[str]] = {}
        #: loader call -> (its plan, its sampler's name, the flag)
        self._loaders: dict[cst.Call, tuple[FactorySplit, str, str]] = {}
        self._functions: dict[cst.FunctionDef, str] = {}  # factory -> its flag
        self._callers: dict[cst.Call, str] = {}  # training call -> the flag it sets
        self._epochs: set[tuple[int, str]] = set()
        self._strip: set[cst.CSTNode] = set()  # statements whose leading lines moved up
        if "shard_dataloader" in self.fm.skip:
            return  # the user splits the data by hand (``--skip shard_dataloader``)
        for call in self.calls_to(*LOADERS):
            split = factory_split(self.fm, call)
            if split is not None:
                self._plan(call, split)

    def _plan(self, call: cst.Call, split: FactorySplit) -> None:
        function = split.shared.function
        flag = self._functions.get(function)
        if flag is None:
            flag = self._functions[function] = fresh_name(self.fm, self._taken, "shard", function)
        own = assigned_binding(self.fm, call)
        sampler = fresh_name(self.fm, self._taken, loader_base_name(own) + "_sampler", function)
        self._loaders[call] = (split, sampler, flag)
        stmt = self.enclosing_statement(call)
        assert stmt is not None
        torch = torch_spelling(self.fm, self.add_import)
        args = [split.dataset, f"num_replicas={self.sdp}.size()", f"rank={self.sdp}.rank()",
                f"shuffle={split.shuffle}"]
        new = conditional_statement(self.fm, sampler,
                                    f"{torch}.utils.data.distributed.DistributedSampler", args,
                                    flag, split.fallback)
        if isinstance(stmt, cst.SimpleStatementLine) and stmt.leading_lines:
            # The statement's comment and blank lines go above the sampler.
            new = new.with_changes(leading_lines=stmt.leading_lines)
            self._strip.add(stmt)
        self.insert_before(stmt, new)
        self.add_runtime_import()
        helper = function.name.value
        for caller in split.shared.train:
            self._callers[caller] = flag
        self.record(call, (
            f"give the DataLoader {helper}() builds a DistributedSampler ({sampler}, "
            f"shuffle={split.shuffle}) when its new {flag}= flag is set, so that each rank reads "
            f"its own shard of the training data; only the training calls set it "
            f"({', '.join(split.shared.train_names)}); the loaders for "
            f"{split.shared.others} stay whole"))
        self._set_epochs(call, split, own, sampler, stmt)

    def _set_epochs(self, call: cst.Call, split: FactorySplit, own: object, sampler: str,
                    stmt: cst.BaseStatement) -> None:
        sites, flow = loader_sites(self.fm, call)
        loops = training_loops(self.fm)
        found = unbound = False
        for site in sites:
            if site.loop not in loops:
                continue
            where = set_epoch_site(self.fm, site, own, sampler, stmt, flow)  # type: ignore[arg-type]
            if where is None or where.inside or where.receiver == sampler:
                continue  # no epoch loop, or one that cannot see the caller's loader
            loop, receiver = where.loop, where.receiver
            holder = epoch_loop(self.fm, site)
            if holder is not None and holder[1] is not None and holder[1].kind == "assign" and (
                not runs_whenever(self.fm, holder[1].stmt, loop)
            ):
                unbound = True  # bound on some paths to the loop only (``if __name__ ...``)
                continue
            found = True
            key = (id(loop), receiver)
            if key in self._epochs or sets_epoch(self.fm, loop, receiver) or where.before is None:
                continue
            self._epochs.add(key)
            set_epoch = f"{receiver}.set_epoch({where.counter})"
            self.insert_before(where.before, cst.parse_statement(set_epoch + "\n"))
            self.record(loop, f"call {set_epoch} at the start of each epoch")
        if not found and split.shuffle not in ("False", "None", "0"):
            calls = " and ".join(f"{name}.sampler.set_epoch(epoch)"
                                 for name in split.shared.train_names)
            why = ("the epoch loop can run where the loader is not bound, so it is not put "
                   "there" if unbound else "found no `for epoch in range(...)` loop, nor a loop "
                   "counting its passes over the loader, to put it in")
            self.record(call, f"call {calls} at the start of every epoch ({why}), or every epoch "
                        "sees the same order", manual=True)

    # -- the rewrite ----------------------------------------------------------------------------

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        flag = self._callers.get(original_node)
        if flag is not None:
            args = append_arg(list(updated_node.args), _keyword(flag, "True"), updated_node)
            return updated_node.with_changes(args=args)
        planned = self._loaders.get(original_node)
        if planned is None or len(updated_node.args) != len(original_node.args):
            return updated_node
        split, sampler, flag = planned
        args = list(updated_node.args)
        if split.shuffle_arg is not None:
            arg = args[split.shuffle_arg]
            shuffle = self.module.code_for_node(arg.value)
            args[split.shuffle_arg] = arg.with_changes(
                value=cst.parse_expression(f"False if {flag} else {shuffle}"))
        if split.sampler_arg is not None:
            args[split.sampler_arg] = args[split.sampler_arg].with_changes(value=cst.Name(sampler))
        else:
            args = append_arg(args, _keyword("sampler", sampler), updated_node)
        return updated_node.with_changes(args=args)

    def leave_Parameters(
        self, original_node: cst.Parameters, updated_node: cst.Parameters
    ) -> cst.Parameters:
        function = self.parent(original_node)
        flag = self._functions.get(function) if isinstance(function, cst.FunctionDef) else None
        if flag is None:
            return updated_node
        param = cst.Param(name=cst.Name(flag), default=cst.Name("False"),
                          equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                whitespace_after=cst.SimpleWhitespace("")))
        if isinstance(updated_node.star_arg, (cst.Param, cst.ParamStar)):
            return updated_node.with_changes(
                kwonly_params=_appended(list(updated_node.kwonly_params), param))
        return updated_node.with_changes(params=_appended(list(updated_node.params), param))

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.SimpleStatementLine:
        if original_node in self._strip:
            return updated_node.with_changes(leading_lines=())
        return updated_node


def _appended(params: list[cst.Param], new: cst.Param) -> list[cst.Param]:
    """``params`` with ``new`` last, keeping a trailing comma where there was one."""
    if params and isinstance(params[-1].comma, cst.Comma):
        return [*params, new.with_changes(comma=params[-1].comma)]
    if params:
        params[-1] = params[-1].with_changes(
            comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return [*params, new]
