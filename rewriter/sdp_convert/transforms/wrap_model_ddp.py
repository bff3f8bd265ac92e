"""Wrap each trained model in ``sdp.DistributedDataParallel`` once it sits on its device.

Before::

    model = Net()
    if use_cuda:
        model.cuda()
    optimizer = optim.SGD(model.parameters(), lr=0.01)

    class Trainer:
        def __init__(self):
            self.model = nn.DataParallel(WaveNet()).cuda()

After::

    model = Net()
    if use_cuda:
        model.cuda()
    model = sdp.DistributedDataParallel(model)
    optimizer = optim.SGD(model.parameters(), lr=0.01)

    class Trainer:
        def __init__(self):
            self.model = WaveNet().cuda()
            self.model = sdp.DistributedDataParallel(self.model)

Why: data parallelism averages the gradients of all processes before each step; DDP does it
during ``backward()``, overlapping communication with compute, and broadcasts rank 0's weights
when it wraps, so every process starts from the same model.

Which object is the model: the one whose ``.parameters()`` (or ``named_parameters()``) an
optimizer gets, followed through variables, function arguments and factories
(``build_optimizer(model.parameters())``, ``model = build_model(cfg)``), local, module-level or
``self.<attr>``; with no optimizer in sight, a module whose output feeds ``loss.backward()``.
Each such model (a GAN has two) is wrapped right after the last statement that creates, moves
(``.to``, ``.cuda()``, ...), freezes or sets its weights (``model.apply(init_fn)``,
``load_state_dict``, a helper of this file that only initialises them:
``initialize_weights(model)``) before it is first trained, and before ``torch.compile``; the
optimizer keeps working on the same parameters either way. A model that gets no gradient (every
parameter frozen, or only run under ``torch.no_grad()``: ``program.model_setup``) is not wrapped
(DDP refuses it) but gets ``sdp.broadcast_parameters(model.state_dict(), root_rank=0)`` there
instead, so that every rank runs rank 0's weights; the report says why. A model whose
outputs are partly discarded (``validity, _, _ = D(x)``) gets ``find_unused_parameters=True``.
``nn.DataParallel`` is removed (one process per GPU) and the model wrapped instead; its
``module.`` keys go from the checkpoints, so where the file saves or loads that model's
``state_dict`` a manual note names those lines and the edit that keeps the old format. A model
already wrapped (``sdp``'s or torch's DDP) is left alone.

``sdp.DistributedDataParallel`` keeps the unwrapped ``state_dict`` keys and looks up attributes it
lacks on the wrapped module, so ``model.encoder`` and checkpoint code keep working unchanged; the
converter does not rewrite them to ``model.module.<attr>``. A *call* of a user method
(``model.encode(x)``) in a function that calls ``backward()`` gets a manual note: it runs around
DDP's forward, so its gradients would not be averaged. Models no optimizer trains (evaluation
only), models that are part of another wrapped model, and models the converter cannot locate get
manual notes too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m

from ..base import Transform
from ..program.index import Binding, FileIndex, file_index
from ..program.model_setup import (
    broadcast_already,
    not_trained,
    wrap_anchor,
)
from ..program.models import (
    COMPILE,
    DATA_PARALLEL,
    DDP,
    arguments,
    branch_join,
    data_parallel_notes,
    data_parallel_statement,
    discarded_outputs,
    is_plain_object,
    is_wrapper,
    model_bindings,
    model_creation,
    model_expression,
    models_from_backward,
    move_off_device_note,
    moves_off_device,
    names_held_by,
    no_grad_submodule,
    owner_class,
    stepped_models,
    stepped_optimizers,
    trained_models,
    untrained_models,
    unused_parameters_reason,
    used_inside,
    user_methods_in_training,
)
from ..program.optimizers import optimizer_class, params_argument
from ..program.project import repairs_of
from ..program.scopes import uses as reads_of
from ..program.syntax import arg_named, assigned_target, code, findall

Scope = cst.FunctionDef | cst.ClassDef | None


@dataclass(eq=False)
class _Model:
    """One model to wrap: ``model`` (a name of ``scope``) or ``self.model`` (of class ``owner``)."""

    target: str
    scope: Scope
    owner: cst.ClassDef | None
    creation: Binding
    seen_at: list[cst.CSTNode] = field(default_factory=list)
    #: Parameters the model is passed in as: ``(name, function)`` (``def train(net, ...)``).
    aliases: list[tuple[str, Scope]] = field(default_factory=list)
    #: Wrapped by the script already (``model = sdp.DistributedDataParallel(model)``).
    wrapped: bool = False

    @property
    def key(self) -> tuple[str, int]:
        return self.target, id(self.owner if self.owner is not None else self.scope)


class WrapModelDdp(Transform):
    DESCRIPTION = "Wrap each trained model in sdp.DistributedDataParallel."
    FRAMEWORKS = frozenset({"torch"})
    #: Project mode: the whole-program contract names a model made here and trained elsewhere
    #: (``wrap_model``), or a model this file's optimizer trains that another module makes and
    #: wraps (``known_model``: no "could not tell" note).
    PROJECT_ROLES = frozenset({"repair:wrap_model", "repair:unused_parameters"})

    def prepare(self, module: cst.Module) -> None:
        self.index: FileIndex = file_index(self.fm)
        # original DataParallel call nested in an expression -> replaced by its module argument
        self.unwrap: set[cst.Call] = set()
        self.models: dict[tuple[str, int], _Model] = {}
        self.state.facts.wrapped_models = []
        if self.calls_to("sdp_runtime.torch.DistributedOptimizer"):
            return  # the optimizer averages the gradients already; DDP would do it twice
        unresolved: list[tuple[cst.CSTNode, str]] = []
        known = {id(node) for _, node in repairs_of(self.fm, "known_model")}
        self._repairs()
        if not self.state.info.training:
            # A module that only makes what another module trains: the repairs alone.
            for model in self.models.values():
                self._plan(model)
            return

        for call in self.calls_to("torch.optim", prefix=True):
            if optimizer_class(self.fm, call) is None:
                continue
            params = params_argument(call)
            receivers = list(trained_models(self.fm, params.value, 0)) if params is not None else []
            if id(call) in known:
                # Made in another module, and wrapped there (the whole-program model says so).
                for receiver in receivers:
                    self._add(receiver, receiver)
                continue
            if not receivers:
                unresolved.append((call, "could not tell which model this optimizer trains"))
            for receiver in receivers:
                if not self._add(receiver, receiver):
                    where = f"could not tell where {code(receiver)} is created"
                    unresolved.append((receiver, where))
        for call in stepped_optimizers(self.fm):
            for receiver in stepped_models(self.fm, call):
                self._add(receiver, receiver)
        for call in self.calls_to(*DATA_PARALLEL):
            self._data_parallel(call)
        from_optimizers = bool(self.models)
        if not from_optimizers:
            for model, at in models_from_backward(self.fm):
                self._add(model, at)
        if from_optimizers or not self.models:
            for node, what in unresolved:
                self.record(
                    node,
                    f"{what}: wrap it in {self.sdp}.DistributedDataParallel by hand (or average "
                    f"the gradients with {self.sdp}.allreduce before each step)",
                    manual=True,
                )

        held = self._held_names()
        planned = [m_ for m_ in self.models.values() if not self._part_of_another(m_, held)]
        for model in planned:
            self._plan(model)
        self._note_untrained()

    def _repairs(self) -> None:
        """The models the whole-program contract found unwrapped where they are made here
        (``program.project.Repair``): each becomes a model to wrap, as if an optimizer of this
        file trained it."""
        for repair, node in repairs_of(self.fm, "wrap_model"):
            target = assigned_target(self.fm, node)
            if isinstance(target, (cst.Name, cst.Attribute)) and self._add(target, node):
                continue
            self.record(
                node,
                f"the model made here is trained in {repair.detail} and no "
                f"{self.sdp}.DistributedDataParallel wraps it, but it is not assigned to a name "
                "the wrap could follow: wrap it by hand where it is made "
                f"(`model = {self.sdp}.DistributedDataParallel(model)`)",
                manual=True,
            )

    # -- which object is the model ------------------------------------------------------------

    def _add(
        self,
        receiver: cst.BaseExpression,
        at: cst.CSTNode,
        depth: int = 0,
        aliases: tuple[tuple[str, Scope], ...] = (),
    ) -> bool:
        """Make the model ``receiver`` (original) refers to a candidate. False: not locatable."""
        target = model_expression(receiver)
        if target is None or depth > 5:
            return False
        if isinstance(target, cst.Name):
            binding = self.index.reaching(target.value, target)
            if binding is None:
                return False
            if binding.kind == "param":
                alias = (*aliases, (target.value, binding.scope))
                found = [
                    self._add(value, call, depth + 1, alias)
                    for value, call in arguments(self.fm, binding)
                ]
                return bool(found) and all(found)
            if binding.kind != "assign" or binding.value is None:
                return False
            bindings = self.index.bindings_of(target.value, binding.scope)
            creation = model_creation(self.fm, bindings, binding, target)
            owner = None
            if (
                receiver is not target
                and creation is not None
                and is_plain_object(self.fm, creation.value)
            ):
                return False  # ``trainer.model.parameters()``: the model is not ``trainer``
        else:
            owner = owner_class(self.fm, target)
            if owner is None:
                return False
            bindings = [
                b for b in self.index.attribute_bindings.get(code(target), [])
                if owner_class(self.fm, b.stmt) is owner
            ]
            creation = model_creation(self.fm, bindings, None, target)
        wrapped = [b for b in bindings if is_wrapper(self.fm, b.value, DDP)]
        creation = creation or next(iter(wrapped), None)
        if creation is None:
            return False
        if findall(receiver, m.Subscript()) and isinstance(
            creation.value, (cst.List, cst.Tuple, cst.Dict, cst.ListComp, cst.DictComp)
        ):
            return False  # ``models[0]``: one of several models, which one is not known
        model = _Model(code(target), creation.scope, owner, creation, wrapped=bool(wrapped))
        model = self.models.setdefault(model.key, model)
        model.seen_at.append(at)
        model.aliases.extend(a for a in aliases if a not in model.aliases)
        return True

    def _data_parallel(self, call: cst.Call) -> None:
        """``nn.DataParallel`` goes: one process per GPU, and the model gets DDP instead."""
        arg = arg_named(call, "module", 0)
        if arg is None:
            self.record(call, "nn.DataParallel without a module: replace it by hand", manual=True)
            return
        for node, note in data_parallel_notes(self.fm, call, self.sdp):
            self.record(node, note, manual=True)  # checkpoints' ``module.`` keys, GPU counts
        parent = self.parent(call)
        message = (f"nn.DataParallel removed: one process per GPU, the model is wrapped in "
                   f"{self.sdp}.DistributedDataParallel instead")
        if isinstance(parent, cst.Assign) and len(parent.targets) == 1 and code(
                parent.targets[0].target) == code(arg.value):
            removed = data_parallel_statement(self.fm, call)
            if removed is None:
                self.record(call, "nn.DataParallel: replace it by hand with the DDP wrap",
                            manual=True)
                return
            self.replace_statement(removed, [])
            self.record(call, message)
            self._add(arg.value, call)
            return
        self.unwrap.add(call)
        self.record(call, message)
        if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
            self._add(parent.targets[0].target, call)
        elif not self.models:
            self._add(arg.value, call)

    def _part_of_another(self, model: _Model, held: dict[tuple[int, str], list[_Model]]) -> bool:
        """``decoder = Decoder(encoder)``: ``encoder`` is not wrapped on its own."""
        key = (id(model.scope), model.target)
        other = next((o for o in held.get(key, ()) if o is not model), None)
        if other is not None:
            self.record(model.creation.stmt, f"{model.target} is part of {other.target}, which "
                        "is wrapped: not wrapped on its own", manual=True)
        return other is not None

    def _held_names(self) -> dict[tuple[int, str], list[_Model]]:
        """The models whose creation names ``(id(scope), name or attribute)``, in the order of
        ``self.models``: each creation read once, not once per pair of models."""
        return names_held_by([(m_, m_.scope, m_.creation.value) for m_ in self.models.values()],
                             {m_.target for m_ in self.models.values()})

    # -- where the wrap goes ------------------------------------------------------------------

    def _plan(self, model: _Model) -> None:
        if model.wrapped:
            return
        frozen = None if model.owner else not_trained(
            self.fm, model.target, model.scope, model.creation.stmt)
        if frozen is not None and broadcast_already(self.fm, model.target):
            return
        same = model_bindings(self.fm, model.target, model.scope, model.owner)
        first = self.enclosing_statement(model.creation.stmt)
        if first is None:
            return
        first, branched = self._join(model, same, first)
        uses = self._uses(model)
        anchor = wrap_anchor(self.fm, first, same, uses)

        def order(node: cst.CSTNode) -> int:
            return self.index.order.get(id(node), -1)

        if branched is not None:
            # Wrapped in one branch only, unless the anchor moved past the join (after
            # ``model = model.to(device)`` below it): then every branch's model is wrapped.
            join, message = branched
            if order(anchor) < order(join) or any(a is join for a in self.ancestors(anchor)):
                self.record(join, message, manual=True)

        self.add_runtime_import()
        if frozen is not None:  # no DDP (no gradient), but every rank runs rank 0's weights
            sync = f"{self.sdp}.broadcast_parameters({model.target}.state_dict(), root_rank=0)"
            self.insert_after(anchor, cst.parse_statement(sync + "\n"))
            self.record(frozen[0], f"{frozen[1]}: not wrapped in {self.sdp}.DistributedData"
                        f"Parallel (no gradient to average); {sync} instead")
            return
        unused = None if model.owner else discarded_outputs(self.fm, model.target, model.scope)
        frozen_part = no_grad_submodule(self.fm, model.creation.value)
        elsewhere = next(
            (repair for repair, node in repairs_of(self.fm, "unused_parameters")
             if model.creation.value is not None and (
                 node is model.creation.value or any(
                     a is model.creation.value for a in self.ancestors(node)))), None)
        extra = ", find_unused_parameters=True" if unused or frozen_part or elsewhere else ""
        wrap = f"{model.target} = {self.sdp}.DistributedDataParallel({model.target}{extra})"
        self.insert_after(anchor, cst.parse_statement(wrap + "\n"))
        compiled = any(
            is_wrapper(self.fm, b.value, COMPILE) and order(b.stmt) > order(anchor)
            for b in same
        )
        self.record(
            anchor,
            f"wrap {model.target} in {self.sdp}.DistributedDataParallel"
            + (" (before torch.compile)" if compiled else "")
            + (unused_parameters_reason(unused, frozen_part) or (
                " with find_unused_parameters=True: the forward of its class runs a submodule "
                f"under torch.no_grad() ({elsewhere.detail}), so those parameters get no "
                "gradient" if elsewhere is not None else "")),
        )
        if model.creation.value is not None and any(
            isinstance(c, cst.Call) and self.refers_to(c.func, *COMPILE)
            for c in findall(model.creation.value, m.Call())
        ):
            self.record(
                model.creation.stmt,
                f"{model.target} is compiled before it is wrapped: compile the wrapped model "
                f"instead (torch.compile after {self.sdp}.DistributedDataParallel)",
                manual=True,
            )
        self._note_moves_off_device(model, uses, order(anchor))
        wrapped = self.state.facts.wrapped_models
        if wrapped is not None:
            wrapped.append(model.target)
        for name, scope in model.aliases:
            uses.extend(self.index.loads_of(name, scope))
        self._note_method_calls(uses)

    def _join(self, model: _Model, same: list[Binding], first: cst.BaseStatement
              ) -> tuple[cst.BaseStatement, tuple[cst.BaseStatement, str] | None]:
        """A model chosen in ``if``/``else`` (or ``try``) is wrapped where the branches join;
        used inside one of them, in that branch, with the note to give (the join, the note)
        unless the wrap moves past the join after all."""
        creations = [b.stmt for b in same if b.value and not is_wrapper(self.fm, b.value)]
        join = branch_join(self.fm, model.creation.stmt, creations)
        if join is None or not used_inside(self.fm, self._uses(model), join):
            return join or first, None
        made = self.module.code_for_node(first).strip().splitlines()[0]
        return first, (join, f"{model.target} is created in several branches and used inside "
                       f"one: wrapped only in the branch of `{made}`; wrap it in {self.sdp}."
                       f"DistributedDataParallel in every branch (or after they join)")

    def _uses(self, model: _Model) -> list[cst.CSTNode]:
        """Loads of the model: ``model`` names of its scope, or ``self.model`` in its class."""
        if model.owner is None:
            return list(self.index.loads_of(model.target, model.scope))
        attr = model.target.split(".", 1)[1]
        held = Binding(attr, None, "attribute", model.owner, cls=model.owner, attr=attr)
        return [a for a in reads_of(self.fm, held) if owner_class(self.fm, a) is model.owner]

    # -- notes --------------------------------------------------------------------------------

    def _note_moves_off_device(self, model: _Model, uses: list[cst.CSTNode], after: int) -> None:
        """``transformer.eval().cpu()`` after the wrap, in a loop that trains: moved away and
        back, a DistributedDataParallel's gradients can silently stop being averaged."""
        for call in moves_off_device(self.fm, uses, after):
            self.record(call, move_off_device_note(call, model.target, self.sdp), manual=True)

    def _note_method_calls(self, uses: list[cst.CSTNode]) -> None:
        for call, method, use in user_methods_in_training(self.fm, uses):
            self.record(
                call,
                f"{code(method)}(...) runs the wrapped module around DDP's forward: gradients "
                f"computed through it are not averaged; in the training step call "
                f"{code(use)}(...) instead",
                manual=True,
            )

    def _note_untrained(self) -> None:
        """Models built and called here that no optimizer trains (evaluation, a teacher)."""
        trained = {(m_.target, id(m_.scope)) for m_ in self.models.values() if m_.owner is None}
        for name, binding in untrained_models(self.fm, self.index, trained, self.models):
            self.record(
                binding.stmt,
                f"{name} is not trained here (no optimizer gets its parameters): left "
                f"unwrapped, each process runs its own copy",
                manual=True,
            )

    # -- rewriting ----------------------------------------------------------------------------

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if original_node not in self.unwrap:
            return updated_node
        arg = arg_named(updated_node, "module", 0)
        assert arg is not None
        return arg.value.with_changes(
            lpar=[*updated_node.lpar, *arg.value.lpar], rpar=[*arg.value.rpar, *updated_node.rpar]
        )

    # -- helpers ------------------------------------------------------------------------------


