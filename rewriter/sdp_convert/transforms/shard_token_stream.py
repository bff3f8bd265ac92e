"""Split a tensor of token ids that training reads column by column: each rank its own stretch
of columns.

Before::

    ids = corpus.get_data("data/train.txt", batch_size)  # batch_size rows of the token stream
    for epoch in range(num_epochs):
        states = init_states(batch_size)
        for i in range(0, ids.size(1) - seq_length, seq_length):
            inputs = ids[:, i:i+seq_length]
            targets = ids[:, (i+1):(i+1)+seq_length]
            ...

After::

    ids = corpus.get_data("data/train.txt", batch_size)
    ids = ids.narrow(1, sdp.rank() * (ids.size(1) // sdp.size()), ids.size(1) // sdp.size())

Why: no loader, sampler or dataset is there to split; every rank would train on every window.
Each rank now reads its own contiguous stretch of ``ids.size(1) // sdp.size()`` columns: every
rank takes the same number of steps, the states carried from window to window (truncated
back-propagation through time) stay ``batch_size`` wide and follow a contiguous stretch of text,
and the ranks' rows together are exactly the rows one process would make of the stream with a
batch of ``sdp.size() * batch_size``, so the averaged gradient of each step is that process's.
Up to ``sdp.size() - 1`` tokens at the end of each row are left out (the width is cut to a
multiple of ``sdp.size()``). The learning rate is then scaled as for any split data
(``scale_learning_rate``).

Decisions (``program.stream_splits``): only a tensor bound once by a statement of its own
(``ids = <call>``), read only by training loops over ``range(..., ids.size(1) ..., ...)`` whose
every subscript of it is ``ids[:, <slice of the loop variable>]``, and by ``ids.size(1)`` /
``ids.shape[1]`` (a step count); a tensor evaluation reads too, or rows sliced instead of
columns, keep ``shard_dataloader``'s manual note.
"""

from __future__ import annotations

import libcst as cst

from ..base import Transform
from ..program.stream_splits import stream_splits


class ShardTokenStream(Transform):
    DESCRIPTION = (
        "Give each rank its own contiguous stretch of the columns of a token-id tensor that "
        "training reads window by window."
    )
    FRAMEWORKS = frozenset({"torch"})

    def prepare(self, module: cst.Module) -> None:
        for split in stream_splits(self.fm):
            if split.done:
                continue
            x, sdp = split.name, self.sdp
            self.add_runtime_import()
            width = f"{x}.size(1) // {sdp}.size()"
            line = f"{x} = {x}.narrow(1, {sdp}.rank() * ({width}), {width})"
            self.insert_after(split.statement, cst.parse_statement(line + "\n"))
            self.record(split.statement, (
                f"{line}: each rank trains on its own contiguous stretch of {x}'s columns, the "
                f"same width on every rank (the rows of one process at {sdp}.size() times the "
                "batch)"))
