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
same on every rank too, so N ranks do the work of one on that part. Not changed automatically
in general: the same seed may drive both. The note names the draw and the fix: seed again after
the model is built, with ``seed + sdp.rank()``. A seed that already depends on the rank gets no
note.

TensorFlow, where it is safe (``program.seeds.tf_reseed``): ``tf.random.set_seed(22)`` as a
statement of the block whose later training loop draws with ``tf.random`` (``batch_z =
tf.random.uniform(...)``), every model the loop's steps apply gradients to built or called
between the two (``generator.build(...)``), gets ``tf.random.set_seed(22 + sdp.rank())`` right
before that loop: the weights were made with the shared seed (the same everywhere; the broadcast
after the first step makes sure), the draws from then on differ between ranks. A forward pass in
TensorFlow is no collective, so no rank waits on another's draws. A model built lazily by its
first call in the loop, draws outside that one loop statement (in a step function), a second
``set_seed`` or a seed computed by a call keep the note. Draws of other libraries in the loop
(``np.random.uniform`` after ``np.random.seed(22)``) keep theirs.
"""

from __future__ import annotations

import libcst as cst

from ..base import Transform
from ..program.scopes import training_loops
from ..program.seeds import TF_SEED, tf_draws_in_training, tf_reseed
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
        if self.state.info.framework == "tensorflow":
            draws, seeds = self._reseed_tf(draws, seeds)
            if not draws or not seeds:
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

    def _reseed_tf(
        self, draws: list[cst.Call], seeds: list[cst.Call]
    ) -> tuple[list[cst.Call], list[cst.Call]]:
        """Set ``tf.random.set_seed`` again with ``+ rank()`` before the training loop where
        that is safe (``program.seeds.tf_reseed``): the draws and seeds left for the note."""
        tf_draws = tf_draws_in_training(self.fm, draws)
        if not tf_draws:
            return draws, seeds
        rest = [d for d in draws if d not in tf_draws]
        if any("rank" in code(c) for c in self.calls_to(TF_SEED)):
            return rest, [s for s in seeds if not self.fm.refers_to(s.func, TF_SEED)]
        reseed = next(
            (r for r in (tf_reseed(self.fm, s, tf_draws) for s in seeds) if r is not None), None
        )
        if reseed is None:
            return draws, seeds
        again = f"{code(reseed.seed.func)}({code(reseed.argument)} + {self.sdp}.rank())"
        self.insert_before(reseed.loop, cst.parse_statement(again + "\n"))
        self.add_runtime_import()
        self.record(reseed.loop, (
            f"{again} before the training loop: the models' weights were made before it with "
            f"the shared seed (the same on every rank), and {code(tf_draws[0].func)}(...) in the "
            "loop now draws different numbers on each rank"))
        return rest, [s for s in seeds if s is not reseed.seed]
