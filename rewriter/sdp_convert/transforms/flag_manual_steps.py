"""Point out what cannot be made data-parallel safely, and what a person must do about it.

Before::

    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad

After: the same code, and a manual report entry::

    train.py:9:13: [flag_manual_steps] (manual) parameters updated by hand (`p -= lr * p.grad`):
    with several ranks, average the gradient first (p.grad = sdp.allreduce(p.grad)) and start
    every rank from the same values (sdp.broadcast), or train with a torch.optim optimizer so that
    the model can be wrapped in DistributedDataParallel

Why: the recipe relies on a torch.optim optimizer stepping a model that DistributedDataParallel
wraps: that is where gradients get averaged. Code that steps differently would silently train N
diverging copies, or hang, so it is never half-converted: each such spot gets a manual note with
its line and the fix.

Noted: parameters updated from their ``.grad`` by hand (``p -= ...``, ``p.data = ...``,
``p.data.add_(...)``/``sub_``/...), a backward() with no optimizer step at all,
``torch.optim.LBFGS`` (its closure's loss decides how often it runs), Hogwild and hand-made
launchers (``model.share_memory()``, ``torch.multiprocessing`` ``Process``/``spawn``/
``start_processes``/``Pool``), ``nn.DataParallel`` (only when ``wrap_model_ddp``, which replaces
it, does not run), a model variable called inside another module's ``forward`` without being its
submodule (DDP of the outer model would not average its gradients), and ``torch.distributed`` calls
of the script's own (except ``is_available``/``is_initialized``/``get_rank``/``get_world_size``,
which keep working once ``sdp.init()`` has set up the process group). Not noted:
``torch.manual_seed`` (fine as it is), ``CUDA_VISIBLE_DEVICES`` (``pin_gpu_device``), custom
samplers (``shard_dataloader``, which knows which loaders feed training).

This transform changes no code. It also runs on torch files that call ``.backward()`` without any
optimizer ``.step()``, which detection does not count as convertible training scripts, so that a
hand-written training loop gets its note rather than silence.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from ..analysis import FileInfo
from ..base import Transform
from ..program.scopes import Binding, assigned_binding, class_of, node_order, referents, uses

_IN_PLACE_UPDATES = ("add_", "sub_", "addcdiv_", "addcmul_", "copy_", "lerp_")
_LBFGS = ("torch.optim.LBFGS", "torch.optim.lbfgs.LBFGS")
_PROCESSES = (
    "torch.multiprocessing.Process",
    "torch.multiprocessing.spawn",
    "torch.multiprocessing.start_processes",
    "torch.multiprocessing.Pool",
    "torch.multiprocessing.spawn.spawn",
    "torch.multiprocessing.spawn.start_processes",
)
_DATA_PARALLEL = (
    "torch.nn.DataParallel",
    "torch.nn.parallel.DataParallel",
    "torch.nn.parallel.data_parallel.DataParallel",
)
# torch.distributed queries that keep working once sdp.init() has set up the process group.
_HARMLESS_DIST = {
    "torch.distributed.is_available",
    "torch.distributed.is_initialized",
    "torch.distributed.get_rank",
    "torch.distributed.get_world_size",
}


class FlagManualSteps(Transform):
    DESCRIPTION = "Report what needs a person: hand updates, LBFGS, Hogwild, DataParallel, ..."
    FRAMEWORKS = frozenset({"torch"})

    @classmethod
    def applies_to(cls, info: FileInfo) -> bool:
        # Also a backward() without any optimizer step: the hand-written loop must be reported.
        return (
            info.framework in cls.FRAMEWORKS
            and info.vanilla
            and (info.training or "backward" in info.method_calls)
        )

    def prepare(self, module: cst.Module) -> None:
        self._notes: list[tuple[cst.CSTNode, str]] = []
        hand_updates = self._hand_updates()
        if not hand_updates and not self.state.info.training:
            backward = self.method_calls("backward")
            self._note(
                backward[0],
                "gradients are computed but no optimizer steps: update the parameters with a "
                "torch.optim optimizer so that the model can be wrapped in DistributedDataParallel "
                "(or average the gradients across ranks by hand before updating)",
            )
        self._lbfgs()
        self._processes()
        self._data_parallel()
        self._distributed_calls()
        self._models_in_forward()
        order = node_order(self.fm)
        for node, message in sorted(self._notes, key=lambda n: order.get(id(n[0]), -1)):
            self.record(node, message, manual=True)

    def _note(self, node: cst.CSTNode, message: str) -> None:
        self._notes.append((node, message))

    # -- the checks -----------------------------------------------------------------------------

    def _hand_updates(self) -> bool:
        """``p -= lr * p.grad``, ``p.data = p.data - ...``, ``p.data.add_(p.grad, alpha=-lr)``."""
        found = False
        seen: set[int] = set()
        for node in self._updates_with_grad():
            stmt = self.enclosing_statement(node)
            if stmt is None or id(stmt) in seen:
                continue
            seen.add(id(stmt))
            code = self.module.code_for_node(node).strip().splitlines()[0]
            param = self._updated_param(node)
            self._note(
                node,
                f"parameters updated by hand (`{code}`): with several ranks, average the gradient "
                f"first ({param}.grad = {self.sdp}.allreduce({param}.grad)) and start every rank "
                f"from the same values ({self.sdp}.broadcast), or train with a torch.optim "
                "optimizer so that the model can be wrapped in DistributedDataParallel",
            )
            found = True
        return found

    def _updates_with_grad(self) -> list[cst.CSTNode]:
        """Statements and in-place calls that write a tensor from a ``.grad``, in file order.

        Found from the ``<x>.grad`` reads up (the parent map lists every node): cheaper than
        matching every assignment of the file.
        """
        found: dict[int, cst.CSTNode] = {}
        for node in self.state.info.parents:
            if type(node) is not cst.Attribute or node.attr.value != "grad":
                continue
            assert isinstance(node, cst.Attribute)
            owner = self.module.code_for_node(node.value)  # ``p`` of ``p.grad``
            child: cst.CSTNode = node
            for parent in self.ancestors(node):
                if isinstance(parent, (cst.AugAssign, cst.Assign)):
                    target = (
                        parent.target
                        if isinstance(parent, cst.AugAssign)
                        else (parent.targets[0].target if len(parent.targets) == 1 else None)
                    )
                    if child is parent.value and target is not None and self._base(target) == owner:
                        found[id(parent)] = parent
                    break
                if (
                    isinstance(parent, cst.Call)
                    and isinstance(parent.func, cst.Attribute)
                    and parent.func.attr.value in _IN_PLACE_UPDATES
                    and child is not parent.func
                ):
                    if self._base(parent.func.value) == owner:
                        found[id(parent)] = parent
                    break
                if isinstance(parent, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
                    break
                child = parent
        order = node_order(self.fm)
        return sorted(found.values(), key=lambda n: order.get(id(n), -1))

    def _base(self, target: cst.BaseExpression) -> str:
        """``p`` for ``p`` and ``p.data`` (the tensor an update writes)."""
        if isinstance(target, cst.Attribute) and target.attr.value == "data":
            target = target.value
        return self.module.code_for_node(target)

    def _updated_param(self, node: cst.CSTNode) -> str:
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            target: cst.BaseExpression = node.func.value
        elif isinstance(node, cst.AugAssign):
            target = node.target
        elif isinstance(node, cst.Assign):
            target = node.targets[0].target
        else:
            return "p"
        if m.matches(target, m.Attribute(attr=m.Name("data"))):
            assert isinstance(target, cst.Attribute)
            target = target.value
        return self.module.code_for_node(target)

    def _lbfgs(self) -> None:
        for call in self.calls_to(*_LBFGS):
            self._note(
                call,
                "LBFGS evaluates its closure several times per step and decides how often from "
                "the loss: average the loss across ranks in the closure (loss = "
                f"{self.sdp}.allreduce(loss) after backward) so that every rank takes the same "
                "decisions, or ranks diverge and hang; or train on one process",
            )

    def _processes(self) -> None:
        for call in self.calls_to(*_PROCESSES):
            what = self.module.code_for_node(call.func)
            self._note(
                call,
                f"{what}(...) starts its own training processes (Hogwild or a hand-made launcher): "
                "sdp-run starts one process per GPU already; call the worker directly (the rank "
                f"comes from {self.sdp}.rank()) or keep this script single-process",
            )
        for call in self.method_calls("share_memory"):
            if not call.args:
                self._note(
                    call,
                    "model.share_memory() is Hogwild training (processes updating shared "
                    "weights without averaging): replace it with one process per GPU under sdp-run "
                    "and a torch.optim optimizer",
                )

    def _data_parallel(self) -> None:
        # wrap_model_ddp replaces (or notes) every nn.DataParallel when it runs; its prepare runs
        # before this one and always sets ``wrapped_models``. Only without it is the note ours.
        if self.state.facts.wrapped_models is not None:
            return
        for call in self.calls_to(*_DATA_PARALLEL):
            self._note(
                call,
                "nn.DataParallel splits each batch over this machine's GPUs inside one process: "
                f"remove it and wrap the model in {self.sdp}.DistributedDataParallel (one process "
                "per GPU under sdp-run)",
            )

    def _distributed_calls(self) -> None:
        for call in self.calls_to("torch.distributed", prefix=True):
            names = self.qualified_names(call.func)
            if names & _HARMLESS_DIST:
                continue
            what = self.module.code_for_node(call.func)
            self._note(
                call,
                f"{what}(...) talks to torch.distributed directly: {self.sdp}.init() now sets up "
                f"the process group; use the runtime's own call ({self.sdp}.allreduce, "
                f"{self.sdp}.broadcast, ...) or check that this runs on every rank in the same "
                "order",
            )

    def _models_in_forward(self) -> None:
        """A model variable called inside another module's ``forward`` without being its part."""
        for binding, call in self._models():
            for use in uses(self.fm, binding):
                forward = self.enclosing_function(use)
                if forward is None or forward.name.value != "forward":
                    continue
                cls = class_of(self.fm, forward)
                if cls is None or any(a is cls for a in self.ancestors(call)):
                    continue
                self._note(
                    use,
                    f"{binding.code} is used inside {cls.name.value}.forward without being one of "
                    f"its submodules: DistributedDataParallel({cls.name.value}) would not average "
                    f"{binding.code}'s gradients; make it an attribute (self.{binding.code} = "
                    f"{binding.code}) in {cls.name.value}.__init__, or wrap it too",
                )

    def _models(self) -> list[tuple[Binding, cst.Call]]:
        """Variables bound to a torch.nn module made in this file: (binding, constructor call)."""
        found: list[tuple[Binding, cst.Call]] = []
        order = node_order(self.fm)
        calls = {id(c): c for cs in self.state.info.calls.values() for c in cs}
        for call in sorted(calls.values(), key=lambda c: order.get(id(c), -1)):
            if not self._is_module_class(call.func, 0):
                continue
            value: cst.CSTNode = call
            while True:  # model = Net().to(device) / .cuda() / .double()
                attribute = self.parent(value)
                outer = self.parent(attribute) if isinstance(attribute, cst.Attribute) else None
                if not (isinstance(outer, cst.Call) and outer.func is attribute):
                    break
                value = outer
            binding = assigned_binding(self.fm, value)
            if binding is not None and binding.cls is None:
                found.append((binding, call))
        return found

    def _is_module_class(self, func: cst.BaseExpression, depth: int) -> bool:
        """``func`` is a torch.nn module class, or a class of this file deriving from one."""
        for name in self.qualified_names(func):
            last = name.rsplit(".", 1)[-1]
            if (
                name.startswith("torch.nn.")
                and last[:1].isupper()
                and last not in ("Parameter", "DataParallel", "DistributedDataParallel")
                and not name.startswith(("torch.nn.utils.", "torch.nn.init."))
            ):
                return True
        if depth > 3 or not isinstance(func, cst.Name):
            return False
        for assignment in referents(self.fm, func):
            cls = getattr(assignment, "node", None)
            if isinstance(cls, cst.ClassDef) and any(
                self._is_module_class(base.value, depth + 1) for base in cls.bases
            ):
                return True
        return False


def _is_grad(expr: cst.CSTNode) -> bool:
    return m.matches(expr, m.Attribute(attr=m.Name("grad")))


def _is_data(expr: cst.CSTNode) -> bool:
    return m.matches(expr, m.Attribute(attr=m.Name("data")))
