"""What every migration maps, whatever the library: where an old module's names go in sdp_runtime
(``Target``), and the names the checks of a library's usual mistakes look for (rank and size
functions, broadcasts, saves, writing callbacks, optimizers)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import libcst as cst


@dataclass(frozen=True)
class Target:
    """Where an old module's names live in sdp_runtime.

    ``names``: the members the runtime provides under the same name. ``renamed``: members the
    runtime's main module (``sdp_runtime.torch``) provides under another name. ``fallback``: a real
    module that still provides the other members (``torch.distributed`` for SageMaker's PyTorch
    API), used for the names of ``FALLBACK_NAMES`` only.
    """

    module: str
    names: frozenset[str]
    fallback: str | None = None
    renamed: Mapping[str, str] = field(default_factory=dict)


def names(text: str) -> frozenset[str]:
    return frozenset(text.split())


_RANK_FUNCTIONS = names("rank local_rank get_rank get_local_rank")


_SIZE_FUNCTIONS = names("size get_world_size")


_BROADCASTS = names(
    """broadcast_parameters broadcast_variables broadcast_global_variables
    BroadcastGlobalVariablesCallback BroadcastGlobalVariablesHook DistributedDataParallel"""
)


_TORCH_DDP = ("torch.nn.parallel.DistributedDataParallel",
              "torch.nn.parallel.distributed.DistributedDataParallel")


_SAVE_FUNCTIONS = (
    "torch.save", "tensorflow.saved_model.save", "tensorflow.keras.models.save_model",
    "keras.models.save_model", "keras.saving.save_model",
)


_SAVE_METHODS = ("save", "save_weights")


_WRITING_CALLBACKS = (
    "ModelCheckpoint", "TensorBoard", "CSVLogger", "BackupAndRestore", "BestModelCheckpoint",
)


_KERAS_CALLBACK_MODULES = (
    "tensorflow.keras.callbacks", "keras.callbacks", "tf_keras.callbacks",
    "horovod.tensorflow.keras.callbacks", "horovod.keras.callbacks",  # BestModelCheckpoint
)


_OPTIMIZER = re.compile(
    r"^(torch\.optim|(tensorflow\.keras|keras|tf_keras|tensorflow)\.optimizers(\.legacy)?)"
    r"\.[A-Z]\w*$"
)


#: A statement using size() like this scales something on purpose (lr, or the batch instead).
_SCALING_TEXT = re.compile(r"lr|learning|rate|scal|batch", re.IGNORECASE)


_RANK_STRINGS = ("RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")


def _parent_and_name(dotted: str) -> tuple[str, str]:
    parent, _, name = dotted.rpartition(".")
    return parent, name


def _dotted(dotted: str) -> cst.Attribute | cst.Name:
    node = cst.parse_expression(dotted)
    assert isinstance(node, (cst.Attribute, cst.Name))
    return node
