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
machine would all compute on GPU 0 and run out of memory. Each worker keeps only the GPU of its
local rank, with memory growth so that nothing is reserved on the others before the choice is made
(both must happen before TensorFlow initialises the GPUs, hence right after ``init()``). On a
machine without GPUs ``gpus`` is empty and nothing changes. A script that chooses its devices
itself
(``set_visible_devices(gpus[0], "GPU")``) gets its index replaced by the local rank instead;
``CUDA_VISIBLE_DEVICES`` set once in the script to a constant that nothing else reads
(``os.environ["CUDA_VISIBLE_DEVICES"] = "0"``) is removed (every worker would see that one GPU,
and a worker past the first none at ``gpus[sdp.local_rank()]``); set otherwise, or a device
choice the converter cannot read, it is reported for a person.

A script that sets memory growth itself (``for gpu in gpus:
tf.config.experimental.set_memory_growth(gpu, True)``, ``gpus`` from ``list_physical_devices``)
keeps its loop, and only the pinning is added right after it, on its own list of GPUs (``if gpus:``
is left out inside the script's own ``if gpus:``). A script that imports TensorFlow only later
(``def main(): import tensorflow as tf``, or in a ``try``) gets the pinning right after that import
(in the function that trains, when several import it), before its first TF op, instead of a new
top-level import of TensorFlow.
"""

from __future__ import annotations

import libcst as cst
from libcst.codemod.visitors import AddImportsVisitor

from ..base import Transform
from ..program.index import FileIndex, file_index, imported_names, nodes_of
from ..program.syntax import code, end_of_import_block, first_import_block_end, mentions

_MEMORY_GROWTH = ("tensorflow.config.experimental.set_memory_growth",)
_LIST_DEVICES = (
    "tensorflow.config.list_physical_devices",
    "tensorflow.config.experimental.list_physical_devices",
)
_SET_VISIBLE = (
    "tensorflow.config.set_visible_devices",
    "tensorflow.config.experimental.set_visible_devices",
)


class PinTfGpus(Transform):
    DESCRIPTION = "Make each worker see only the GPU of its local rank (with memory growth)."
    FRAMEWORKS = frozenset({"tensorflow"})
    PROJECT_ROLES = frozenset({"entry"})

    def prepare(self, module: cst.Module) -> None:
        self.adapt: dict[cst.CSTNode, cst.CSTNode] = {}  # original index node -> the call
        self.pin: tuple[cst.CSTNode, list[cst.BaseStatement]] | None = None
        local_rank = f"{self.state.runtime_module}.local_rank"
        visible = self.calls_to(*_SET_VISIBLE)
        self._environment_notes()
        if visible:
            for call in visible:
                if mentions(self.fm, call, local_rank):
                    continue
                self._adapt(call)
            return
        init = self.calls_to(f"{self.state.runtime_module}.init")
        if not init and not self.state.info.entry_point:
            return  # a module others import: the script that runs it initialises and pins
        init_stmt = self.enclosing_statement(init[0]) if init else None
        import_block = end_of_import_block(module)
        if self._pin_after_growth_loop(init_stmt):
            return
        # After the file's own init, or where add_runtime_init will put one (same anchor: the
        # statements inserted after it keep pipeline order, init first).
        anchor: cst.CSTNode | None = init_stmt or import_block
        tf: str | None = None
        statements: list[str] = []
        where = ""
        later = self._later_tensorflow_import(anchor)
        if later is not None:
            # TensorFlow is imported only later (in main(), in a try): the pinning goes right
            # after that import, before the first TF op, rather than importing TF at the top.
            anchor, tf, needs_import = later
            if needs_import:
                statements.append(f"import tensorflow as {tf}\n")
            function = self.enclosing_function(anchor)
            where = ", right after TensorFlow is imported" + (
                f" in {function.name.value}()" if function is not None else ""
            )
            if init_stmt is not None and self._runs_later_in_same_block(init_stmt, anchor):
                anchor = init_stmt
        if anchor is None:
            self.record(
                module,
                f"no import block to pin the GPU after: make each worker use only GPU "
                f"{self.sdp}.local_rank() (tf.config.set_visible_devices)",
                manual=True,
            )
            return
        if tf is None and anchor is import_block and import_block is not first_import_block_end(
            module
        ):
            # The imports run on past environment settings (``os.environ["KERAS_BACKEND"]``):
            # TensorFlow is imported after them, with the runtime, not at the top.
            tf = self._tensorflow_name(schedule=False)
            if tf is None:
                tf = "tf"
                statements.append("import tensorflow as tf\n")
        if later is None:
            tf = tf or self._tensorflow_name()
            if not statements and not self._bound_by(tf, anchor):
                # ``from tensorflow.python.client import device_lib`` at the top, ``import
                # tensorflow as tf`` only further down: the pinning runs before that import
                # (and before the script's first TF op), so it imports TF itself.
                statements.append(
                    "import tensorflow\n" if tf == "tensorflow" else f"import tensorflow as {tf}\n"
                )
        gpus, gpu = self._free_name("gpus", anchor), self._free_name("gpu", anchor)
        config = module.config_for_parsing
        indent = module.default_indent
        statements += [
            f'{gpus} = {tf}.config.list_physical_devices("GPU")\n',
            f"for {gpu} in {gpus}:\n"
            f"{indent}{tf}.config.experimental.set_memory_growth({gpu}, True)\n",
            f"if {gpus}:\n{indent}{tf}.config.set_visible_devices("
            f'{gpus}[{self.sdp}.local_rank()], "GPU")\n',
        ]
        self.pin = (anchor, [cst.parse_statement(s, config) for s in statements])
        deferred = anchor is import_block  # after add_runtime_init's init(), in leave_Module
        if not deferred:
            # Maybe in a function, whose block is edited before leave_Module would run.
            self._insert()
        self.add_runtime_import()
        self.record(
            anchor,
            f"pin this worker to GPU {gpus}[{self.sdp}.local_rank()], with memory growth{where}",
        )

    # -- the script's own memory-growth loop -----------------------------------------------------

    def _pin_after_growth_loop(self, init_stmt: cst.CSTNode | None) -> bool:
        """``for gpu in gpus: tf.config.experimental.set_memory_growth(gpu, True)`` of the script's
        own: only the pinning is missing, and it goes right after that loop."""
        index = file_index(self.fm)
        for call in self.calls_to(*_MEMORY_GROWTH):
            found = self._growth_loop(index, call)
            if found is None:
                continue
            loop, gpus = found
            first = init_stmt or end_of_import_block(self.module)
            if first is not None and not index.is_before(first, loop):
                continue  # sdp.local_rank() needs the init first
            func = code(call.func)
            suffix = ".experimental.set_memory_growth"
            if not func.endswith(suffix):
                continue
            config_module = func[: -len(suffix)]  # tf.config, or what the script calls it
            config = self.module.config_for_parsing
            indent = self.module.default_indent
            statements: list[str] = []
            name = gpus.value if isinstance(gpus, cst.Name) else None
            if name is None:  # for gpu in tf.config.list_physical_devices("GPU"):
                name = self._free_name("gpus", loop)
                statements.append(f"{name} = {code(gpus)}\n")
            pin = f'{config_module}.set_visible_devices({name}[{self.sdp}.local_rank()], "GPU")\n'
            if isinstance(gpus, cst.Name) and self._inside_if(loop, name):
                statements.append(pin)  # if gpus: ... for gpu in gpus: ... (TensorFlow's guide)
            else:
                statements.append(f"if {name}:\n{indent}{pin}")
            self.pin = (loop, [cst.parse_statement(s, config) for s in statements])
            self._insert()
            self.add_runtime_import()
            self.record(
                loop,
                f"pin this worker to GPU {name}[{self.sdp}.local_rank()] after the script's own "
                f"memory-growth loop",
            )
            return True
        return False

    def _growth_loop(
        self, index: FileIndex, call: cst.Call
    ) -> tuple[cst.For, cst.BaseExpression] | None:
        """(the loop, its list of GPUs) when ``call`` sets memory growth on each listed GPU."""
        loop = next(
            (a for a in self.ancestors(call) if isinstance(a, (cst.For, cst.FunctionDef))), None
        )
        if not isinstance(loop, cst.For) or not isinstance(loop.target, cst.Name) or not call.args:
            return None
        device = call.args[0].value
        if not (isinstance(device, cst.Name) and device.value == loop.target.value):
            return None
        gpus = loop.iter
        listed: cst.BaseExpression | None = gpus
        if isinstance(gpus, cst.Name):
            binding = index.reaching(gpus.value, loop)
            listed = binding.value if binding is not None and binding.kind == "assign" else None
            if binding is None or binding.unpacked:
                return None
        if not (
            isinstance(listed, cst.Call)
            and self.refers_to(listed.func, *_LIST_DEVICES)
            and listed.args
            and code(listed.args[0].value).strip("\"'") == "GPU"
        ):
            return None
        return loop, gpus

    def _inside_if(self, node: cst.CSTNode, name: str) -> bool:
        """Whether ``node`` runs only under ``if <name>:`` (in its function)."""
        child: cst.CSTNode = node
        for parent in self.ancestors(node):
            if isinstance(parent, (cst.FunctionDef, cst.ClassDef)):
                return False
            if (
                isinstance(parent, cst.If)
                and child is parent.body
                and isinstance(parent.test, cst.Name)
                and parent.test.value == name
            ):
                return True
            child = parent
        return False

    # -- where TensorFlow is imported ------------------------------------------------------------

    def _later_tensorflow_import(
        self, anchor: cst.CSTNode | None
    ) -> tuple[cst.BaseStatement, str, bool] | None:
        """(statement, TF's name there, whether TF itself must be imported there) when the file
        imports TensorFlow (or Keras) only after ``anchor``: in a function, in a ``try``, further
        down. None when it is imported at the top (or not at all)."""
        index = file_index(self.fm)
        found = {
            id(b.stmt): b.stmt
            for bindings in index.bindings.values()
            for b in bindings
            if b.kind == "import"
            and isinstance(b.stmt, (cst.Import, cst.ImportFrom))
            and _tensorflow_import(b.stmt)
        }
        imports = sorted(found.values(), key=lambda node: index.order.get(id(node), 0))
        if not imports:
            return None
        if anchor is not None:
            for node in imports:
                stmt = self.enclosing_statement(node)
                if index.scope(node) is None and stmt is not None and (
                    stmt is anchor or index.is_before(stmt, anchor)
                ):
                    return None  # imported at the top
        # The function that trains, if it imports TF itself; else the first import.
        training = [
            call
            for method in ("fit", "apply_gradients", "train_on_batch")
            for call in self.method_calls(method)
        ]
        functions = {id(f) for call in training if (f := self.enclosing_function(call))}
        chosen = next(
            (n for n in imports if id(self.enclosing_function(n)) in functions), imports[0]
        )
        statement = self.enclosing_statement(chosen)
        if statement is None:
            return None
        # Out of a ``try: import tensorflow as tf`` (the ``except`` may leave it unbound).
        while True:
            block = self.parent(statement)
            owner = self.parent(block) if block is not None else None
            if not (isinstance(owner, cst.Try) and block is owner.body):
                break
            statement = owner
        name = _tensorflow_alias(chosen)
        return statement, name or "tf", name is None

    def _bound_by(self, name: str, anchor: cst.CSTNode) -> bool:
        """Whether a module-level import binds ``name`` at or before ``anchor`` (a module-level
        statement); an anchor in a function runs after the module's imports."""
        index = file_index(self.fm)
        if index.scope(anchor) is not None:
            return True
        return any(
            bound == name
            and (self.enclosing_statement(node) is anchor or index.is_before(node, anchor))
            for bound, _, node in imported_names(self.fm)
        ) or not any(bound == name for bound, _, _ in imported_names(self.fm))

    def _runs_later_in_same_block(self, first: cst.CSTNode, then: cst.CSTNode) -> bool:
        """Whether ``first`` comes after ``then`` in the same block."""
        return self.parent(first) is self.parent(then) and file_index(self.fm).is_before(
            then, first
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
        writes = self._environ_writes()
        for binding in writes:
            stmt = self.enclosing_statement(binding)
            block = self.fm.parent(stmt)
            if (len(writes) == 1 and isinstance(binding, cst.AssignTarget)
                    and isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
                    and isinstance(value := getattr(stmt.body[0], "value", None), cst.SimpleString)
                    and len(getattr(block, "body", ())) > 1
                    and code(self.module).count("CUDA_VISIBLE_DEVICES") == 1):
                # A constant choice nothing else reads (``os.environ[...] = "0"``): every worker
                # but the first would see no GPU of its own (gpus[local_rank()] out of range).
                self.replace_statement(stmt, [])
                self.record(binding, (
                    f"removed CUDA_VISIBLE_DEVICES = {value.value}: every worker would see only "
                    f"that GPU; each worker keeps GPU {self.sdp}.local_rank() instead (one "
                    "process: GPU 0, as before)"))
                continue
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
        for target in nodes_of(self.fm, cst.AssignTarget):
            subscript = target.target
            if not isinstance(subscript, cst.Subscript):
                continue
            if self.refers_to(subscript.value, "os.environ") and "CUDA_VISIBLE_DEVICES" in code(
                subscript
            ):
                found.append(target)
        return found

    def leave_Integer(
        self, original_node: cst.Integer, updated_node: cst.Integer
    ) -> cst.BaseExpression:
        call = self.adapt.get(original_node)
        if call is None:
            return updated_node
        self.record(
            call,
            f"visible GPU index {original_node.value} -> {self.sdp}.local_rank(): each worker "
            f"uses its own GPU",
        )
        return cst.parse_expression(f"{self.sdp}.local_rank()")

    def _tensorflow_name(self, schedule: bool = True) -> str | None:
        for name, qualified, node in imported_names(self.fm):
            if isinstance(node, cst.Import) and "tensorflow" in qualified:
                return name
        if not schedule:
            return None
        AddImportsVisitor.add_needed_import(self.context, "tensorflow", asname="tf")
        return "tf"

    def _free_name(self, name: str, at: cst.CSTNode) -> str:
        """``name``, unless the module or the scope of ``at`` uses it already."""
        index = file_index(self.fm)
        taken = index.names_bound(None) | index.names_bound(index.scope(at))
        return name if name not in taken else f"{self.sdp}_{name}"


def _tensorflow_import(node: cst.Import | cst.ImportFrom) -> bool:
    """``import tensorflow as tf``, ``from tensorflow import keras``, ``import keras``..."""
    if isinstance(node, cst.Import):
        names = [alias.evaluated_name for alias in node.names]
    elif node.relative or node.module is None:
        return False
    else:
        names = [code(node.module)]
    return any(n.split(".")[0] in ("tensorflow", "keras", "tf_keras") for n in names)


def _tensorflow_alias(node: cst.Import | cst.ImportFrom) -> str | None:
    """The name ``import tensorflow [as tf]`` binds, None for imports that don't bind TF."""
    if isinstance(node, cst.Import):
        for alias in node.names:
            if alias.evaluated_name == "tensorflow":
                return alias.evaluated_alias or "tensorflow"
    return None

