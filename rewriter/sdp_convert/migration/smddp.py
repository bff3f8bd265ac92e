"""What SMDDP's (SageMaker's) API maps to beyond its module table (``transforms/migrate_smddp``):
the torch.distributed names its scripts may use that keep working through torch.distributed, and
the SageMaker variables and host checks its scripts read (``SM_HOSTS``, ``current_host ==
hosts[0]``), which the migration reports."""

from __future__ import annotations

import re

import libcst as cst
from libcst.helpers import get_full_name_for_node

from ..analysis import Visitor
from .common import names

#: torch.distributed names that SageMaker scripts may use and that sdp_runtime.torch.distributed
#: does not re-export: they keep working through torch.distributed on the runtime's process group.
FALLBACK_NAMES = names(
    """destroy_process_group get_backend new_group reduce gather scatter reduce_scatter
    monitored_barrier all_gather_into_tensor reduce_scatter_tensor""")


_SAGEMAKER_VAR = re.compile(r"^SM_[A-Z0-9_]+$")


class _SageMakerFinder(Visitor):
    """``os.environ["SM_MODEL_DIR"]``-style reads and ``current_host == hosts[0]`` tests."""

    def __init__(self) -> None:
        self.variables: list[tuple[cst.CSTNode, str, bool]] = []
        self.host_checks: list[cst.Comparison] = []

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        value = node.evaluated_value
        if isinstance(value, str) and _SAGEMAKER_VAR.match(value):
            self.variables.append((node, value, False))

    def visit_Subscript(self, node: cst.Subscript) -> None:
        # os.environ["SM_MODEL_DIR"]: fails outside SageMaker unless it is set.
        if (get_full_name_for_node(node.value) or "").endswith("environ") and len(node.slice) == 1:
            index = node.slice[0].slice
            if isinstance(index, cst.Index) and isinstance(index.value, cst.SimpleString):
                value = index.value.evaluated_value
                if isinstance(value, str) and _SAGEMAKER_VAR.match(value):
                    self.variables.append((index.value, value, True))

    def visit_Comparison(self, node: cst.Comparison) -> None:
        if len(node.comparisons) != 1 or not isinstance(node.comparisons[0].operator, cst.Equal):
            return
        left, right = node.left, node.comparisons[0].comparator
        for one, other in ((left, right), (right, left)):
            if (
                isinstance(other, cst.Subscript)
                and "host" in (get_full_name_for_node(one) or "").lower()
                and "hosts" in (get_full_name_for_node(other.value) or "").lower()
            ):
                self.host_checks.append(node)
                return
