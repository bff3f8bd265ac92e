"""program.smp_saves: SMP's saves under a rank test, which can be made safe and why not."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m
from sdp_convert.program.smp_saves import SmpSaves, partial

from .helpers import find, probe

HEAD = (
    "import smdistributed.modelparallel.torch as smp\nimport torch\n"
    "model = smp.DistributedModel(torch.nn.Linear(2, 2))\n"
    "optimizer = smp.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))\n"
    "sched = torch.optim.lr_scheduler.StepLR(optimizer, 1)\n"
)


def _saves(source: str, text: str) -> tuple[SmpSaves, cst.Call, cst.If | None]:
    t = probe(HEAD + source)
    saves = SmpSaves(t, lambda _: False, lambda _: False)
    call = cst.ensure_type(find(t, m.Call(), text), cst.Call)
    return saves, call, saves.rank_guard(call)


def test_every_smp_rank_query_tested_against_zero_is_a_rank_guard():
    for query in ("rank", "dp_rank", "rdp_rank", "mp_rank", "local_rank"):
        saves, call, guard = _saves(f"if smp.{query}() == 0:\n    x = model.state_dict()\n",
                                    "model.state_dict()")
        assert guard is not None and saves.not_hoistable(call, guard) is None, query
    saves, call, guard = _saves("if not smp.rank():\n    x = model.state_dict()\n",
                                "model.state_dict()")
    assert guard is not None and saves.not_hoistable(call, guard) is None
    assert _saves("if epoch == 0:\n    x = model.state_dict()\n", "model.state_dict()")[2] is None


def test_why_a_state_dict_cannot_move_before_its_test():
    cases = {
        "if smp.rank() == 0 and best:\n    x = model.state_dict()\n":
            "the test is not only `smp.<x>_rank() == 0`",
        "if smp.rank() == 0:\n    x = 1\nelse:\n    x = model.state_dict()\n": None,  # no guard
        "if smp.rank() == 0:\n    model.eval()\n    x = model.state_dict()\n":
            "code before it in the test's body uses model",
        "if smp.rank() == 0:\n    f = lambda: model.state_dict()\n": None,  # the caller decides
        "if smp.rank() == 0:\n    x = [model.state_dict() for _ in range(2)]\n":
            "it runs inside a function or comprehension",
        "if smp.rank() == 0:\n    with open('a') as f:\n        x = model.state_dict()\n":
            "it is not directly in the test's body",
        "if smp.rank() == 0:\n    x = sched.state_dict()\n":
            "its receiver is not shown to be smp.DistributedModel/DistributedOptimizer",
        "import os\nif os.path.exists('a'):\n    if smp.rank() == 0:\n        x = model.state_dict()\n":
            "the test itself runs on some ranks only",
    }
    for source, why in cases.items():
        saves, call, guard = _saves(source, "model.state_dict()" if "model.state" in source
                                    else "sched.state_dict()")
        got = None if guard is None else saves.not_hoistable(call, guard)
        assert got == why, source


def test_only_smp_wrappers_and_unknown_receivers_may_be_sharded():
    saves, call, _ = _saves("x = optimizer.state_dict()\n", "optimizer.state_dict()")
    assert saves.may_be_sharded(call)
    saves, call, _ = _saves("x = sched.state_dict()\n", "sched.state_dict()")
    assert not saves.may_be_sharded(call)
    saves, call, _ = _saves("x = self.model.state_dict()\n", "self.model.state_dict()")
    assert saves.may_be_sharded(call)


def test_a_test_around_partial_saves_only_can_go():
    saves, _, guard = _saves(
        "if smp.dp_rank() == 0:\n    smp.save(model.local_state_dict(), 'p.pt')\n"
        "    smp.save(1, 'q.pt', partial=True)\n", "smp.save(1, 'q.pt', partial=True)")
    assert guard is not None and saves.not_unguardable(guard) is None
    saves, _, guard = _saves(
        "if smp.dp_rank() == 0:\n    print('saving')\n    smp.save(1, 'p.pt')\n",
        "smp.save(1, 'p.pt')")
    assert guard is not None
    assert saves.not_unguardable(guard) == (
        "the test guards more than smp.save(..., partial=True) calls")
    saves, _, guard = _saves("if smp.dp_rank() == 0:\n    smp.save(model.state_dict(), 'p.pt')\n",
                             "smp.save(model.state_dict(), 'p.pt')")
    assert guard is not None and saves.not_unguardable(guard) is not None


def test_partial_is_smp_saves_default():
    def call(text: str) -> cst.Call:
        return cst.ensure_type(cst.parse_expression(text), cst.Call)

    assert partial(call("smp.save(obj, 'p.pt')"))
    assert partial(call("smp.save(obj, 'p.pt', partial=True)"))
    assert not partial(call("smp.save(obj, 'p.pt', partial=False)"))
    assert not partial(call("smp.save(obj, 'p.pt', False)"))
    assert not partial(call("smp.save(obj, 'p.pt', partial=flag)"))
