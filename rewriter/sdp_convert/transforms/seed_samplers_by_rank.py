"""Split a training loader that samples with replacement: each rank draws its own random stream.

Before::

    loader = DataLoader(
        data,
        sampler=RandomSampler(data, replacement=True, num_samples=int(1e10)),
        batch_size=64,
    )

After::

    loader = DataLoader(
        data,
        sampler=RandomSampler(
            data, replacement=True, num_samples=int(1e10),
            generator=torch.Generator().manual_seed(torch.initial_seed() + sdp.rank()),
        ),
        batch_size=64,
    )

Why: without a ``generator=``, ``RandomSampler`` draws its indices from the global torch
generator, which a script seeds alike on every rank (``torch.manual_seed(3407)``): every rank
would read the same batches, and N ranks would train as one. A DistributedSampler is no
replacement here: it draws without replacement, one pass over this rank's part, and ignores
``num_samples``. Sampling with replacement is split by giving each rank a stream of its own,
seeded from the script's seed (``torch.initial_seed()``, the same on every rank when the script
seeds, each rank's own otherwise) plus the rank: each draws its samples uniformly from the whole
dataset, with replacement, independently of the others, so one step of N ranks at batch B uses
N * B samples drawn as one process at batch N * B draws them (the same distribution, not the same
samples). The global generator is no longer advanced by the sampler, so the script's other
random draws (dropout, initial weights made after the loader) take other values than before.

Left to ``shard_dataloader`` (and its manual note): any other sampler, a sampler held in a name,
one given ``**kwargs``, one with a generator of its own.
"""

from __future__ import annotations

import libcst as cst

from ..base import Transform
from ..program.builders import module_spelling
from ..program.flow import loader_sites
from ..program.loaders import LOADERS
from ..program.project import repairs_of
from ..program.scopes import training_loops
from ..program.sharding import loader_problem, resampling_sampler
from ..program.syntax import add_keyword


class SeedSamplersByRank(Transform):
    DESCRIPTION = (
        "A training RandomSampler with replacement draws from a generator seeded by the rank."
    )
    FRAMEWORKS = frozenset({"torch"})
    #: Project mode: the whole-program contract found the loader unsplit (its training loop is
    #: in another module).
    PROJECT_ROLES = frozenset({"repair:shard_loader"})

    def prepare(self, module: cst.Module) -> None:
        self._seeded: set[cst.Call] = set()
        self._generator = ""
        loaders = self.calls_to(*LOADERS)
        if not loaders:
            return
        repaired = {id(node) for _, node in repairs_of(self.fm, "shard_loader")}
        loops = training_loops(self.fm)
        for call in loaders:
            found = resampling_sampler(self.fm, call)
            if found is None or found[1] or loader_problem(self.fm, call) is not None:
                continue  # (a model not known to be averaged: shard_dataloader's note)
            trains = any(site.loop in loops for site in loader_sites(self.fm, call)[0])
            if not trains and id(call) not in repaired:
                continue  # evaluation, or not iterated where this file shows it
            sampler = found[0]
            if not self._generator:
                torch = module_spelling(self.fm, "torch", self.add_import)
                self.add_runtime_import()
                self._generator = (
                    f"{torch}.Generator().manual_seed({torch}.initial_seed() + {self.sdp}.rank())")
            self._seeded.add(sampler)
            self.record(sampler, (
                "the sampler draws with replacement: each rank draws from its own generator, "
                f"seeded with the script's seed plus the rank ({self._generator}), so the ranks "
                "read different samples, drawn as one process at the ranks' total batch draws "
                "them (a DistributedSampler would draw without replacement)"))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if original_node in self._seeded:
            return add_keyword(updated_node, "generator",
                               cst.parse_expression(self._generator), first=False)
        return updated_node
