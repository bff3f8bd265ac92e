"""Decide what a file is: which framework, whether it trains, and who already distributes it.

Detection looks at imports and at qualified names of calls, on the metadata the engine resolves
once per file. It never runs the code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import libcst as cst
from libcst.metadata import QualifiedNameProvider

Framework = Literal["torch", "tensorflow"]
Origin = Literal["vanilla", "horovod", "smddp", "sdp", "distributed"]

#: Substrings one of which a file must contain to be parsed at all (cheap prefilter).
FRAMEWORK_MARKERS = (b"torch", b"tensorflow", b"keras", b"horovod", b"smdistributed")
#: ... and one of these: a training step, or a library we migrate. A file with neither cannot be
#: anything ``detect`` would convert or note, so it is not parsed by libcst at all.
ACTIVITY_MARKERS = (b"backward", b"GradientTape", b"apply_gradients", b"fit(", b"horovod",
                    b"smdistributed", b"minimize(", b"distributed", b"deepspeed", b"accelerate",
                    b"lightning", b"sdp_runtime")


def worth_parsing(data: bytes) -> bool:
    """Whether ``data`` may be a training script or a distributed one (a cheap byte test)."""
    return any(m in data for m in FRAMEWORK_MARKERS) and any(m in data for m in ACTIVITY_MARKERS)

# Libraries that already make a script distributed; such files are left alone with a note.
_DISTRIBUTED_IMPORTS = {
    "deepspeed": "DeepSpeed",
    "accelerate": "Hugging Face Accelerate",
    "lightning": "PyTorch Lightning",
    "pytorch_lightning": "PyTorch Lightning",
    "torch.distributed.fsdp": "torch FSDP",
    "fairscale": "FairScale",
    "colossalai": "ColossalAI",
}
_DISTRIBUTED_CALLS = {
    "torch.distributed.init_process_group": "torch.distributed",
    "torch.nn.parallel.DistributedDataParallel": "torch DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel": "torch DistributedDataParallel",
    "torch.distributed.fsdp.FullyShardedDataParallel": "torch FSDP",
}
_TF_STRATEGY_PREFIX = "tensorflow.distribute."
_KERAS_PREFIXES = ("tensorflow.keras.", "keras.", "tf_keras.")


@dataclass
class FileInfo:
    """What a file is. ``convertible`` is True for single-process training scripts."""

    framework: Framework | None = None
    origin: Origin = "vanilla"
    training: bool = False
    uses_tape: bool = False
    uses_fit: bool = False
    #: Why the file was judged a training script, or which library already distributes it.
    reason: str = ""
    imports: set[str] = field(default_factory=set)
    #: Every call of the file by the qualified names of what it calls, and by method name
    #: (``backward`` for ``loss.backward()``): an index transforms query instead of re-walking.
    calls: dict[str, list[cst.Call]] = field(default_factory=dict, repr=False)
    method_calls: dict[str, list[cst.Call]] = field(default_factory=dict, repr=False)
    call_order: dict[int, int] = field(default_factory=dict, repr=False)
    #: The parent of every node of the original tree (libcst's ParentNodeProvider costs 3.5x a
    #: parse; this map comes almost free with the detection pass that visits every node anyway).
    parents: dict[cst.CSTNode, cst.CSTNode] = field(default_factory=dict, repr=False)

    #: Set on the engine's own check that a vanilla script's conversion is a fixed point: the
    #: transforms then run on the sdp_runtime code they wrote and must find nothing to do.
    recheck: bool = False

    @property
    def vanilla(self) -> bool:
        """A single-process script (or, on the engine's fixed-point check, its conversion)."""
        return self.origin == "vanilla" or (self.origin == "sdp" and self.recheck)

    @property
    def convertible(self) -> bool:
        return self.training and self.vanilla

    @property
    def label(self) -> str:
        """A short human name for the report: ``torch``, ``keras``, ``horovod``, ..."""
        if self.origin == "distributed":
            return f"already distributed ({self.reason})"
        if self.origin == "sdp" and not self.recheck:
            return "already uses sdp_runtime"
        if self.origin in ("horovod", "smddp"):
            return f"{self.origin} ({self.framework})"
        if not self.training:
            return "not a training script"
        if self.framework == "tensorflow":
            return "keras" if self.uses_fit and not self.uses_tape else "tensorflow"
        return str(self.framework)


class _Detector(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (QualifiedNameProvider,)

    def __init__(self) -> None:
        super().__init__()
        self.imports: set[str] = set()
        self.calls: dict[str, list[cst.Call]] = {}
        self.method_calls: dict[str, list[cst.Call]] = {}
        self.order: dict[int, int] = {}
        self.parents: dict[cst.CSTNode, cst.CSTNode] = {}
        self._stack: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self._stack:
            self.parents[node] = self._stack[-1]
        self._stack.append(node)
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self._stack.pop()
        super().on_leave(original_node)

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            self.imports.add(cst.helpers.get_full_name_for_node_or_raise(alias.name))

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.module is not None and not node.relative:
            base = cst.helpers.get_full_name_for_node_or_raise(node.module)
            self.imports.add(base)
            if not isinstance(node.names, cst.ImportStar):
                for alias in node.names:
                    self.imports.add(f"{base}.{alias.name.value}")

    def visit_Call(self, node: cst.Call) -> None:
        self.order[id(node)] = len(self.order)
        for q in self.get_metadata(QualifiedNameProvider, node.func, set()):
            self.calls.setdefault(q.name, []).append(node)
        if isinstance(node.func, cst.Attribute):
            self.method_calls.setdefault(node.func.attr.value, []).append(node)


def _imports_under(imports: set[str], package: str) -> bool:
    return any(i == package or i.startswith(package + ".") for i in imports)


def detect(
    module: cst.Module,
    metadata: Mapping[object, Mapping[cst.CSTNode, object]],
    force: Literal["auto", "torch", "tensorflow"] = "auto",
    recheck: bool = False,
) -> FileInfo:
    """Classify ``module``. ``metadata`` must hold ``QualifiedNameProvider``'s resolution."""
    detector = _Detector()
    detector.metadata = metadata  # type: ignore[assignment]  # shared, resolved once
    module.visit(detector)
    imports, called, methods = detector.imports, detector.calls, detector.method_calls
    info = FileInfo(
        imports=imports,
        calls=called,
        method_calls=methods,
        call_order=detector.order,
        parents=detector.parents,
    )

    has_torch = _imports_under(imports, "torch")
    has_tf = any(_imports_under(imports, p) for p in ("tensorflow", "keras", "tf_keras"))
    if force != "auto":
        info.framework = force
    elif has_torch and not has_tf:
        info.framework = "torch"
    elif has_tf and not has_torch:
        info.framework = "tensorflow"
    elif has_torch and has_tf:
        # A script mixing both trains with the one whose optimizer steps.
        tf_training = "apply_gradients" in methods or "fit" in methods
        info.framework = "tensorflow" if tf_training and "backward" not in methods else "torch"

    # Who distributes it already?
    for package, framework in (("horovod", None), ("smdistributed.dataparallel", None)):
        if _imports_under(imports, package):
            info.origin = "horovod" if package == "horovod" else "smddp"
            info.reason = package
            if framework is None and info.framework is None:
                info.framework = "tensorflow" if has_tf else "torch"
    if info.origin == "vanilla":
        for package, label in _DISTRIBUTED_IMPORTS.items():
            if _imports_under(imports, package):
                info.origin, info.reason = "distributed", label
                break
    if info.origin == "vanilla":
        for name, label in _DISTRIBUTED_CALLS.items():
            if name in called:
                info.origin, info.reason = "distributed", label
                break
    if info.origin == "vanilla":
        strategies = sorted(
            c for c in called if c.startswith(_TF_STRATEGY_PREFIX) and c.endswith("Strategy")
        )
        if strategies:
            info.origin, info.reason = "distributed", strategies[0].replace("tensorflow", "tf")
    if info.origin == "vanilla" and _imports_under(imports, "sdp_runtime"):
        info.origin, info.reason = "sdp", "sdp_runtime"
    info.recheck = recheck

    # Does it train?
    if info.framework == "torch":
        optimizers = sorted(c for c in called if c.startswith("torch.optim.") and c[12:13].isupper())
        if "backward" in methods and "step" in methods:
            info.training = True
            info.reason = info.reason or "calls .backward() and .step()" + (
                f" ({optimizers[0]})" if optimizers else ""
            )
    elif info.framework == "tensorflow":
        info.uses_tape = any(c.endswith(".GradientTape") for c in called)
        fit = "fit" in methods and "compile" in methods and any(
            c.startswith(_KERAS_PREFIXES) for c in called
        )
        info.uses_fit = fit
        if info.uses_tape and ("apply_gradients" in methods or "apply" in methods):
            info.training = True
            info.reason = info.reason or "records a GradientTape and applies its gradients"
        elif fit:
            info.training = True
            info.reason = info.reason or "compiles and fits a Keras model"
    return info
