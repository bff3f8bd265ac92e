"""Pin each worker to its own GPU, right after the runtime is initialised.

Before::

    import tensorflow as tf
    import sdp_runtime.tensorflow as sdp

    sdp.init()

After::

    import tensorflow as tf
    import sdp_runtime.tensorflow as sdp

    sdp.init()
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.set_visible_devices(gpus[sdp.local_rank()], "GPU")

Why: TensorFlow grabs every visible GPU, and all of its memory, in every process; N workers on one
machine would all compute on GPU 0 and run out of memory. Each worker keeps only the GPU of its local
rank, with memory growth so that nothing is reserved on the others before the choice is made (both
must happen before TensorFlow initialises the GPUs, hence right after ``init()``). On a machine
without GPUs ``gpus`` is empty and nothing changes. A script that chooses its devices itself
(``set_visible_devices(gpus[0], "GPU")``) gets its index replaced by the local rank instead;
``CUDA_VISIBLE_DEVICES`` set in the script, or a device choice the converter cannot read, is
reported for a person.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m
from libcst.codemod.visitors import AddImportsVisitor
from libcst.metadata import ScopeProvider

from ..base import Transform
from .add_runtime_init import _end_of_import_block
from .scale_keras_learning_rate import code, mentions

_SET_VISIBLE = (
    "tensorflow.config.set_visible_devices",
    "tensorflow.config.experimental.set_visible_devices",
)


class PinTfGpus(Transform):
    DESCRIPTION = "Make each worker see only the GPU of its local rank (with memory growth)."
    FRAMEWORKS = frozenset({"tensorflow"})

    def prepare(self, module: cst.Module) -> None:
        self.adapt: dict[cst.CSTNode, cst.CSTNode] = {}  # original index node -> the call
        self.pin: tuple[cst.CSTNode, list[cst.BaseStatement]] | None = None
        local_rank = f"{self.state.runtime_module}.local_rank"
        visible = self.calls_to(*_SET_VISIBLE)
        self._environment_notes()
        if visible:
            for call in visible:
                if mentions(self, call, local_rank):
                    continue
                self._adapt(call)
            return
        init = self.calls_to(f"{self.state.runtime_module}.init")
        # After the file's own init, or where add_runtime_init will put one (same anchor: the
        # statements inserted after it keep pipeline order, init first).
        anchor = self.enclosing_statement(init[0]) if init else _end_of_import_block(module)
        if anchor is None:
            self.record(
                module,
                f"no import block to pin the GPU after: make each worker use only GPU "
                f"{self.sdp}.local_rank() (tf.config.set_visible_devices)",
                manual=True,
            )
            return
        tf = self._tensorflow_name()
        gpus, gpu = self._free_name("gpus"), self._free_name("gpu")
        config = module.config_for_parsing
        indent = module.default_indent
        statements = [
            f'{gpus} = {tf}.config.list_physical_devices("GPU")\n',
            f"for {gpu} in {gpus}:\n{indent}{tf}.config.experimental.set_memory_growth({gpu}, True)\n",
            f"if {gpus}:\n{indent}{tf}.config.set_visible_devices("
            f'{gpus}[{self.sdp}.local_rank()], "GPU")\n',
        ]
        self.pin = (anchor, [cst.parse_statement(s, config) for s in statements])
        if init:
            # Maybe in a function, whose block is edited before leave_Module would run.
            self._insert()
        self.add_runtime_import()
        self.record(
            anchor,
            f"pin this worker to GPU {gpus}[{self.sdp}.local_rank()], with memory growth",
        )

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        # add_runtime_init inserts its init() after the import block in its leave_Module, which
        # runs before this one: inserting here puts the pinning after the init.
        self._insert()
        return updated_node

    def _insert(self) -> None:
        if self.pin is not None:
            anchor, statements = self.pin
            self.insert_after(anchor, *statements)
            self.pin = None

    def _adapt(self, call: cst.Call) -> None:
        devices = call.args[0].value if call.args else None
        if isinstance(devices, cst.List) and len(devices.elements) == 1:
            devices = devices.elements[0].value
        if isinstance(devices, cst.Subscript) and len(devices.slice) == 1:
            index = devices.slice[0].slice
            if isinstance(index, cst.Index) and isinstance(index.value, cst.Integer):
                self.adapt[index.value] = call
                self.add_runtime_import()
                return
        if isinstance(devices, cst.List) and not devices.elements:
            return  # hides the GPUs: trains on CPU, nothing to pin
        self.record(
            call,
            f"the script chooses its visible devices: make each worker use only GPU "
            f"{self.sdp}.local_rank()",
            manual=True,
        )

    def _environment_notes(self) -> None:
        for binding in self._environ_writes():
            self.record(
                binding,
                f"CUDA_VISIBLE_DEVICES set by the script: every worker would use the same GPU; "
                f"remove it (each worker is pinned to GPU {self.sdp}.local_rank())",
                manual=True,
            )

    def _environ_writes(self) -> list[cst.CSTNode]:
        """``os.environ["CUDA_VISIBLE_DEVICES"] = ...`` (or ``setdefault``/``update``) anywhere."""
        found: list[cst.CSTNode] = []
        for call in self.method_calls("setdefault") + self.method_calls("update"):
            func = call.func
            assert isinstance(func, cst.Attribute)
            if self.refers_to(func.value, "os.environ") and "CUDA_VISIBLE_DEVICES" in code(call):
                found.append(call)
        for target in m.findall(self.module, m.AssignTarget(target=m.Subscript())):
            assert isinstance(target, cst.AssignTarget) and isinstance(target.target, cst.Subscript)
            subscript = target.target
            if self.refers_to(subscript.value, "os.environ") and "CUDA_VISIBLE_DEVICES" in code(
                subscript
            ):
                found.append(target)
        return found

    def leave_Integer(self, original_node: cst.Integer, updated_node: cst.Integer) -> cst.BaseExpression:
        call = self.adapt.get(original_node)
        if call is None:
            return updated_node
        self.record(
            call,
            f"visible GPU index {original_node.value} -> {self.sdp}.local_rank(): each worker "
            f"uses its own GPU",
        )
        return cst.parse_expression(f"{self.sdp}.local_rank()")

    def _tensorflow_name(self) -> str:
        scope = self.get_metadata(ScopeProvider, self.module, None)
        for assignment in scope.assignments if scope is not None else ():
            if isinstance(getattr(assignment, "node", None), cst.Import) and any(
                q.name == "tensorflow" for q in scope.get_qualified_names_for(assignment.name)
            ):
                return assignment.name
        AddImportsVisitor.add_needed_import(self.context, "tensorflow", asname="tf")
        return "tf"

    def _free_name(self, name: str) -> str:
        scope = self.get_metadata(ScopeProvider, self.module, None)
        taken = {a.name for a in scope.assignments} if scope is not None else set()
        return name if name not in taken else f"{self.sdp}_{name}"

