"""A fixed TensorFlow seed that makes every rank draw the same numbers in training, and where it
can be set again per rank (``tf_reseed``).

``tf.random.set_seed(22)`` at the start of ``main()`` gives every rank the same initial weights
(as it must) but also the same draws in the training loop (a GAN's ``tf.random.uniform`` noise):
N ranks then average N copies of one batch of noise. Setting it again with ``22 + rank()`` right
before that loop changes only what is drawn from then on; the weights were made before it, with
the shared seed, so they stay the same on every rank (and TensorFlow's forward passes are no
collectives, so nothing else waits on the draws). That is safe only where

* the seed call is a statement of its own, directly in the block (a function's body or the
  module) whose later statement is the training loop, its argument plain (a literal or a name,
  no call), and it is the file's one ``tf.random.set_seed``;
* every ``tf.random`` draw inside training loops is in that one loop statement;
* every model whose variables the loop's steps apply gradients to
  (``apply_gradients(zip(grads, model.trainable_variables))``) is built or called in a statement
  of the block between the seed and the loop (``model.build(...)``, ``model(x)``): its weights
  exist before the new seed (a model built lazily in its first step would get rank-dependent
  weights for that step).

``tf_reseed`` returns that loop statement and the seed's argument, or None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from .syntax import code, findall
from .training import training_facts

if TYPE_CHECKING:
    from .model import FileModel

TF_SEED = "tensorflow.random.set_seed"
_VARIABLES = frozenset({"trainable_variables", "trainable_weights"})


@dataclass(frozen=True)
class Reseed:
    """Seed again with ``<seed> + rank()`` before ``loop`` (a statement of the seed's block)."""

    seed: cst.Call
    loop: cst.For | cst.While
    argument: cst.BaseExpression


def tf_draws_in_training(fm: FileModel, draws: list[cst.Call]) -> list[cst.Call]:
    return [d for d in draws if any(q.startswith("tensorflow.random.")
                                    for q in fm.qualified_names(d.func))]


def tf_reseed(fm: FileModel, seed: cst.Call, draws: list[cst.Call]) -> Reseed | None:
    """Where ``seed`` (a ``tf.random.set_seed`` call) can be set again per rank so that the
    TensorFlow ``draws`` (in training loops) differ between ranks; None where that is not safe."""
    if not fm.refers_to(seed.func, TF_SEED) or len(fm.calls_to(TF_SEED)) != 1:
        return None
    keyword = seed.args[0].keyword if len(seed.args) == 1 else None
    if len(seed.args) != 1 or keyword is not None and keyword.value != "seed":
        return None
    argument = seed.args[0].value
    if findall(argument, m.Call()) or not isinstance(
        argument, (cst.Integer, cst.Name, cst.Attribute)
    ):
        return None
    line = fm.parent(fm.parent(seed))
    if not isinstance(fm.parent(seed), cst.Expr) or not isinstance(line, cst.SimpleStatementLine):
        return None
    block = fm.parent(line)
    body = list(getattr(block, "body", ()))
    if line not in body or not draws:
        return None
    statements = body[body.index(line) + 1:]
    loops = {id(s): s for s in statements if isinstance(s, (cst.For, cst.While))}
    owners = set()
    for draw in draws:
        owner = next((a for a in fm.ancestors(draw) if id(a) in loops), None)
        if owner is None:
            return None
        owners.add(id(owner))
    if len(owners) != 1:
        return None
    loop = loops[owners.pop()]
    before = statements[:statements.index(loop)]
    models = _trained_models(fm, loop)
    if not models or any(not _made_before(fm, name, before) for name in models):
        return None
    return Reseed(seed, loop, argument)


def _trained_models(fm: FileModel, loop: cst.CSTNode) -> set[str]:
    """The names whose ``trainable_variables`` the loop's steps apply gradients to (empty when
    any step's variables are not of such a name)."""
    names: set[str] = set()
    for site in training_facts(fm).sites:
        if loop not in site.loops and not any(loop is a for a in fm.ancestors(site.statement)):
            continue
        found = [a for a in findall(site.apply, m.Attribute())
                 if isinstance(a, cst.Attribute) and a.attr.value in _VARIABLES]
        if not found or any(not isinstance(a.value, cst.Name) for a in found):
            return set()
        names.update(a.value.value for a in found)  # type: ignore[attr-defined]
    return names


def _made_before(fm: FileModel, name: str, statements: list[cst.CSTNode]) -> bool:
    """``name.build(...)`` or ``name(...)`` in one of ``statements``."""
    for statement in statements:
        for call in findall(statement, m.Call()):
            assert isinstance(call, cst.Call)
            func = call.func
            if isinstance(func, cst.Name) and func.value == name:
                return True
            if (isinstance(func, cst.Attribute) and func.attr.value == "build"
                    and code(func.value) == name):
                return True
    return False
