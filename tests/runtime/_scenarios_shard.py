"""``sdp.shard`` of the torch runtime on real ranks (``test_torch_shard``)."""

from __future__ import annotations

from typing import Any

import sdp_runtime.torch as sdp


class Examples:
    """A legacy torchtext ``Dataset``'s shape: an ``examples`` list, and other attributes."""

    def __init__(self, examples: list) -> None:
        self.examples = examples
        self.fields = {"src": "field"}

    def __len__(self) -> int:
        return len(self.examples)

    def __getattr__(self, attr: str):  # torchtext's: a generator for any missing attribute
        if attr in self.fields:
            for x in self.examples:
                yield getattr(x, attr)


def shard_examples() -> dict[str, Any]:
    before = sdp.shard([0, 1, 2, 3, 4])  # no init(): a one-process program reads all of it
    sdp.init()
    dataset = Examples(list(range(5)))
    part = sdp.shard(dataset)
    return {
        "before_init": before,
        "list": sdp.shard(["a", "b", "c", "d", "e"]),
        "examples": part.examples,
        "fields": part.fields,
        "original_whole": dataset.examples,
        "a_copy": part is not dataset,
    }
