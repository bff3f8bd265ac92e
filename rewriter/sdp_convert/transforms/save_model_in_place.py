"""Save a wrapped model's weights in the training loop without moving it off its device.

Before::

    model = sdp.DistributedDataParallel(model)
    for epoch in range(epochs):
        for step, (x, y) in enumerate(loader):
            ...
            if (step + 1) % interval == 0:
                model.eval().cpu()
                torch.save(model.state_dict(), path)
                model.to(device).train()

After::

            if (step + 1) % interval == 0:
                torch.save({k: v.cpu() for k, v in model.state_dict().items()}, path)
                model.train()

Why: a DistributedDataParallel must keep its parameters on the device it was built on; moved
to the CPU and back (new tensors), the gradients it averages can silently stop being those the
optimizer steps. ``wrap_model_ddp`` notes such a move (``manual``); this transform repairs the
shape where dropping the two moves provably changes nothing but where the parameters stay: the
move back is a later statement of the same block, and between the two the model is read only by
``model.state_dict()`` inside ``torch.save(...)`` (no forward pass), nothing leaves the block
(``return``, ``break``, ``continue``, ``raise``), and every call is to an import or a builtin (none
that could run the model). The save writes CPU copies of the same state dict
(``sdp.DistributedDataParallel.state_dict()`` gives the wrapped module's keys): the file is the
one the script wrote before. The mode the two moves leave the model in (the last ``eval()`` or
``train()`` of the pair) is kept (``model.train()``). Any other shape (a forward pass or an
evaluation between the moves, a move back in another block) keeps ``wrap_model_ddp``'s note.
A move after the training loop (the final save) harms nothing and is left alone.
"""

from __future__ import annotations

import libcst as cst

from ..base import Transform
from ..program.models import MOVES_OFF_DEVICE, round_trip
from ..program.syntax import code


class SaveModelInPlace(Transform):
    DESCRIPTION = ("Save a wrapped model's weights in the training loop as CPU copies, without "
                   "moving the model off its device and back.")
    FRAMEWORKS = frozenset({"torch"})
    # Wherever wrap_model_ddp runs: it reads that transform's notes.
    PROJECT_ROLES = frozenset({"repair:wrap_model", "repair:unused_parameters"})

    def prepare(self, module: cst.Module) -> None:
        self.saves: set[cst.Call] = set()
        kept, repaired = [], []
        for record in self.state.records:
            node, name, message, manual = record
            trip = None
            if name == "wrap_model_ddp" and manual and isinstance(node, cst.Call) and (
                    message.startswith(code(node) + MOVES_OFF_DEVICE)):
                trip = round_trip(self.fm, node)
            if trip is None:
                kept.append(record)
                continue
            self.replace_statement(trip.away, [])
            mode = [cst.parse_statement(f"{trip.model}.{trip.mode}()\n")] if trip.mode else []
            self.replace_statement(trip.back, mode)
            self.saves.update(trip.saves)
            kept_mode = f", and {trip.model}.{trip.mode}() keeps the mode" if trip.mode else ""
            repaired.append((node, (
                f"{code(node)} and {code(trip.back.body[0])} dropped: {trip.model} stays on "
                f"its device, as {self.sdp}.DistributedDataParallel needs; the save writes CPU "
                f"copies of the same state dict ({{k: v.cpu() for k, v in "
                f"{trip.model}.state_dict().items()}}){kept_mode}")))
        self.state.records[:] = kept
        for node, message in repaired:
            self.record(node, message)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if original_node not in self.saves:
            return updated_node
        return cst.parse_expression(f"{{k: v.cpu() for k, v in {code(updated_node)}.items()}}")
