"""Migrate a SageMaker smdistributed.dataparallel (SMDDP) script to sdp_runtime.

Before::

    import smdistributed.dataparallel.torch.distributed as dist
    from smdistributed.dataparallel.torch.parallel.distributed import DistributedDataParallel as DDP

    dist.init_process_group()
    model = DDP(model)

After::

    import sdp_runtime.torch.distributed as dist
    from sdp_runtime.torch.parallel.distributed import DistributedDataParallel as DDP

    dist.init_process_group()
    model = DDP(model)

The backend form (SMDDP 1.4 and later), where SMDDP only registers a torch.distributed backend::

    import smdistributed.dataparallel.torch.torch_smddp
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group(backend="smddp")

becomes::

    import sdp_runtime.torch.distributed as dist
    from sdp_runtime.torch.parallel import DistributedDataParallel as DDP

    dist.init_process_group()

The ``torch_smddp`` import goes, the file's ``torch.distributed`` and ``DistributedDataParallel``
become the runtime's (which has SMDDP's PyTorch names: ``init_process_group``, ``get_rank``,
``get_local_rank``, ``get_world_size``, ``barrier``, ``all_reduce``, ...), and the backend argument
goes: the runtime picks NCCL on GPUs and Gloo on CPUs, so the same script runs under ``sdp-run`` on
either, and as one plain ``python`` process. (Keeping torch's own ``init_process_group`` with
``backend=None`` would also pick a backend, but the script would then need a launcher even for one
process, and would stay a torch-DDP script rather than an sdp_runtime one.) The few
torch.distributed names the runtime does not re-export (``destroy_process_group``, ``new_group``,
...) keep calling torch.distributed, on the runtime's process group, and are reported.

``smdistributed.dataparallel.tensorflow`` (``as sdp``/``smdp``) and its ``keras`` module become
``sdp_runtime.tensorflow`` and ``sdp_runtime.tensorflow.keras``, whose API was, like SMDDP's, made
close to Horovod's.

What else names SMDDP goes too: the string ``"smddp"`` (``backend = "smddp"`` handed to
``deepspeed.init_distributed(dist_backend=backend)``) becomes ``"nccl"``, since the backend it
named is no longer registered; in a DeepSpeed script, which makes its own process group, the
file's ``torch.distributed`` stays torch's. Arithmetic that assumes SageMaker's 8 GPUs per instance
(``world_size // 8``, ``local_size == 8``) is reported: under fewer than 8 processes per machine
``world_size // 8`` is 0 (``batch_size //= 0`` divides by zero).

Why: so that a SageMaker script runs anywhere with ``sdp-run``. SageMaker's environment
(``SM_MODEL_DIR``, ``SM_CHANNEL_*``) and ``current_host == hosts[0]`` guards are left working and
reported. The import machinery, the unsupported-API notes and the checks of the usual mistakes are
``migrate_horovod``'s.
"""

from __future__ import annotations

from collections.abc import Mapping

import libcst as cst

from .. import migration as hvd

_ROOT = "smdistributed.dataparallel"
_TORCH_SMDDP = f"{_ROOT}.torch.torch_smddp"

#: SMDDP's PyTorch API (v1.0-1.3), as sdp_runtime.torch.distributed provides it.
_DIST = hvd.names(
    """init_process_group is_available is_initialized get_rank get_local_rank get_world_size
    get_local_size barrier all_reduce all_to_all_single broadcast all_gather all_gather_object
    broadcast_object_list group ReduceOp DistributedDataParallel"""
)
_TF = hvd.names(
    """init shutdown is_initialized size local_size rank local_rank allreduce oob_allreduce
    grouped_allreduce allgather broadcast broadcast_variables broadcast_object allgather_object
    overlap barrier DistributedGradientTape DistributedOptimizer Compression ReduceOp Average Sum
    Min Max keras"""
)
#: torch.distributed's name -> sdp_runtime.torch's (leaving the job destroys the runtime's group).
_RENAMED = {"destroy_process_group": "shutdown"}
_KERAS = hvd.RUNTIME_KERAS_NAMES
_CALLBACKS = hvd.RUNTIME_CALLBACK_NAMES
_DDP = hvd.names("DistributedDataParallel")

SMDDP_MODULES: Mapping[str, hvd.Target] = {
    f"{_ROOT}.torch": hvd.Target("sdp_runtime.torch", hvd.names("distributed parallel")),
    f"{_ROOT}.torch.distributed": hvd.Target(
        "sdp_runtime.torch.distributed", _DIST, "torch.distributed", _RENAMED
    ),
    f"{_ROOT}.torch.parallel": hvd.Target("sdp_runtime.torch.parallel", _DDP | {"distributed"}),
    f"{_ROOT}.torch.parallel.distributed": hvd.Target(
        "sdp_runtime.torch.parallel.distributed", _DDP
    ),
    f"{_ROOT}.tensorflow": hvd.Target("sdp_runtime.tensorflow", _TF),
    f"{_ROOT}.tensorflow.keras": hvd.Target("sdp_runtime.tensorflow.keras", _KERAS),
    f"{_ROOT}.tensorflow.keras.callbacks": hvd.Target(
        "sdp_runtime.tensorflow.keras.callbacks", _CALLBACKS
    ),
}

#: The backend form: the file's torch.distributed and torch DDP become the runtime's.
_BACKEND_MODULES: Mapping[str, hvd.Target] = {
    "torch.distributed": hvd.Target(
        "sdp_runtime.torch.distributed", _DIST, "torch.distributed", _RENAMED
    ),
}
_RUNTIME_DDP = "sdp_runtime.torch.parallel.DistributedDataParallel"
_BACKEND_NAMES: Mapping[str, str] = {
    "torch.nn.parallel.DistributedDataParallel": _RUNTIME_DDP,
    "torch.nn.parallel.distributed.DistributedDataParallel": _RUNTIME_DDP,
}
_INIT = ("torch.distributed.init_process_group", f"{_ROOT}.torch.distributed.init_process_group")


class MigrateSmddp(hvd.Migration):
    DESCRIPTION = "Point SageMaker smdistributed.dataparallel imports at sdp_runtime."
    FRAMEWORKS = frozenset({"torch", "tensorflow"})
    ROOT = _ROOT
    LIBRARY = "SageMaker smdistributed.dataparallel"
    MODULES = SMDDP_MODULES
    DROPPED_MODULES = frozenset({_TORCH_SMDDP})
    LAUNCH = (
        "launch with `sdp-run -n N train.py` (N processes per machine) instead of SageMaker's "
        "smdistributed launcher"
    )

    def configure(self) -> None:
        imports = self.state.info.imports
        if any(i == "deepspeed" or i.startswith("deepspeed.") for i in imports):
            return  # DeepSpeed makes the process group: its torch.distributed calls stay torch's
        if _TORCH_SMDDP in imports:
            self.modules.update(_BACKEND_MODULES)
            self.moved_names.update(_BACKEND_NAMES)

    def dropped_message(self, full: str) -> str:
        return f"removed import {full}: it registers the smddp backend, which sdp_runtime replaces"

    def leave_ImportFrom(
        self, original_node: cst.ImportFrom, updated_node: cst.ImportFrom
    ) -> cst.ImportFrom:
        # from smdistributed.dataparallel.torch import torch_smddp
        if (
            updated_node.module is not None
            and not isinstance(updated_node.names, cst.ImportStar)
            and len(updated_node.names) == 1
            and f"{cst.helpers.get_full_name_for_node(updated_node.module)}."
            f"{cst.helpers.get_full_name_for_node(updated_node.names[0].name)}"
            in self.DROPPED_MODULES
        ):
            self.record(original_node, self.dropped_message(_TORCH_SMDDP))
            self._remove_statement(original_node)
            return updated_node
        return super().leave_ImportFrom(original_node, updated_node)

    def leave_SimpleString(
        self, original_node: cst.SimpleString, updated_node: cst.SimpleString
    ) -> cst.SimpleString:
        if original_node.evaluated_value != "smddp" or self._init_argument(original_node):
            return updated_node
        self.record(
            original_node,
            '"smddp" -> "nccl": the smddp backend is no longer registered (its import is gone); '
            "torch.distributed and DeepSpeed use NCCL on GPUs",
        )
        quote = original_node.quote
        return updated_node.with_changes(value=f"{original_node.prefix}{quote}nccl{quote}")

    def _init_argument(self, node: cst.CSTNode) -> bool:
        """The backend argument of ``init_process_group``, which ``rewrite_call`` removes."""
        arg = self.parent(node)
        call = self.parent(arg) if isinstance(arg, cst.Arg) else None
        return isinstance(call, cst.Call) and bool(self.qualified_names(call.func) & set(_INIT))

    def leave_BinaryOperation(
        self, original_node: cst.BinaryOperation, updated_node: cst.BinaryOperation
    ) -> cst.BinaryOperation:
        if isinstance(
            original_node.operator, (cst.FloorDivide, cst.Divide, cst.Modulo)
        ) and _eight_gpus(original_node.left, original_node.right):
            self._eight(original_node)
        return updated_node

    def leave_Comparison(
        self, original_node: cst.Comparison, updated_node: cst.Comparison
    ) -> cst.Comparison:
        if len(original_node.comparisons) == 1 and _eight_gpus(
            original_node.left, original_node.comparisons[0].comparator
        ):
            self._eight(original_node)
        return updated_node

    def _eight(self, node: cst.CSTNode) -> None:
        self.record(
            node,
            f"{self.module.code_for_node(node)} assumes SageMaker's 8 GPUs per instance: under "
            "fewer processes per machine it is wrong (a // 8 of them is 0); use the number of "
            "processes on this machine (sdp_runtime's local_size())",
            manual=True,
        )

    def rewrite_call(
        self, original_node: cst.Call, updated_node: cst.Call, qualified: set[str]
    ) -> cst.BaseExpression:
        if not qualified.intersection(_INIT):
            return updated_node
        args = list(updated_node.args)
        for i, (arg, original) in enumerate(zip(args, original_node.args, strict=True)):
            if (arg.keyword is None and i == 0 and arg.star == "") or (
                arg.keyword is not None and arg.keyword.value == "backend"
            ):
                del args[i]
                if args and i == len(args):  # it was the last one: no trailing comma left behind
                    args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
                self.record(
                    original,
                    f"init_process_group({self.module.code_for_node(original.value)}) -> "
                    f"init_process_group(): sdp_runtime picks NCCL on GPUs and Gloo on CPUs",
                )
                return updated_node.with_changes(args=args)
        return updated_node


def _eight_gpus(one: cst.BaseExpression, other: cst.BaseExpression) -> bool:
    """``<a world or local size> <op> 8`` (either way round)."""
    for size, eight in ((one, other), (other, one)):
        if isinstance(eight, cst.Integer) and eight.evaluated_value == 8:
            spelled = cst.helpers.get_full_name_for_node(
                size.func if isinstance(size, cst.Call) else size
            ) or ""
            if "size" in spelled.lower() or "gpus" in spelled.lower():
                return True
    return False
