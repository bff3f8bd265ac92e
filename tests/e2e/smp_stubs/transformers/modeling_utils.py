"""``PreTrainedModel`` of the transformers test stub: ``init_weights`` applies ``_init_weights``."""

from __future__ import annotations

from torch import nn


class PreTrainedModel(nn.Module):
    def init_weights(self):
        self.apply(self._init_weights)

    def _init_weights(self, module):
        pass
