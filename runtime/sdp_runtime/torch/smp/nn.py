"""``smp.nn``: SMP's fused layers that are plain torch layers here.

``FusedLayerNorm`` is ``torch.nn.LayerNorm`` (SMP's is the same computation, fused on the GPU; FSDP
shards it like any other module). SMP's tensor-parallel layers (``DistributedTransformer*``,
``DistributedLinear``, ...) are not provided: tensor parallelism is emulated with FSDP.
"""

from __future__ import annotations

from torch.nn import LayerNorm


class FusedLayerNorm(LayerNorm):
    """``torch.nn.LayerNorm`` under SMP's name (``normalized_shape``, ``eps``,
    ``elementwise_affine``).

    Example:
        >>> norm = smp.nn.FusedLayerNorm(768)
    """


__all__ = ["FusedLayerNorm"]
