"""Say where one fixed seed makes every rank draw the same "random" numbers in training.

Before::

    torch.manual_seed(999)
    netG = Generator()
    for data in loader:
        noise = torch.randn(b_size, nz, 1, 1)   # the same noise on every rank
        ...

After: unchanged, with a manual note at the seed (seed again with ``seed + sdp.rank()`` after
the model is built, if the draws should differ).

Why: a seed set once is the same on every rank. That is right for the model's initial weights
(they must match; DDP and the broadcast make sure anyway), but the numbers drawn in the training
loop (a GAN's noise, augmentation in the main process, dropout masks drawn by hand) are then the
same on every rank too, so N ranks do the work of one on that part. Not changed automatically: the
same seed may drive both. The note names the draw and the fix: seed again after the model is
built, with ``seed + sdp.rank()``. A seed that already depends on the rank gets no note.
"""

from __future__ import annotations

import libcst as cst

from ..base import Transform
from ..program.scopes import training_loops
from ..program.syntax import code
from ..program.training import training_facts

SEEDS = (
    "torch.manual_seed",
    "torch.random.manual_seed",
    "random.seed",
    "numpy.random.seed",
    "tensorflow.random.set_seed",
    "tensorflow.keras.utils.set_random_seed",
    "keras.utils.set_random_seed",
    "lightning.seed_everything",
    "pytorch_lightning.seed_everything",
)

DRAWS = (
    "torch.randn", "torch.rand", "torch.randint", "torch.randn_like", "torch.rand_like",
    "torch.randint_like", "torch.randperm", "torch.normal", "torch.bernoulli",
    "torch.multinomial", "random.random", "random.randint", "random.uniform", "random.choice",
    "random.shuffle", "random.sample", "random.gauss", "tensorflow.random.normal",
    "tensorflow.random.uniform", "tensorflow.random.shuffle",
)


class NoteSharedSeeds(Transform):
    DESCRIPTION = "Note a fixed seed that makes every rank draw the same numbers in training."
    FRAMEWORKS = frozenset({"torch", "tensorflow"})

    def prepare(self, module: cst.Module) -> None:
        seeds = [c for c in self.calls_to(*SEEDS) if "rank" not in code(c)]
        if not seeds:
            return
        loops: set[cst.CSTNode] = set(training_loops(self.fm))
        if self.state.info.framework == "tensorflow":
            # The loops that apply a tape's gradients, and the step functions they call.
            for site in training_facts(self.fm).sites:
                loops.update(site.loops)
                loops.update(function for function, _ in site.chain)
        draws = [
            c for c in self.calls_to(*DRAWS, "numpy.random", prefix=True)
            if any(p in loops for p in self.ancestors(c))
        ]
        if not draws:
            return
        first = draws[0]
        seed = seeds[0]
        what = code(first.func)
        self.record(
            seed,
            f"{code(seed)} is the same on every rank: right for the initial weights, but "
            f"{what}(...) in the training loop then draws the same "
            f"numbers on every rank; if they should differ, seed again after the model is built "
            f"with seed + {self.sdp}.rank()",
            manual=True,
        )
