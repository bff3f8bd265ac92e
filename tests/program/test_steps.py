"""program.steps: the loops that step one optimizer; program.sharding.optimizer_data: whether
their data is split."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m
from sdp_convert.program.sharding import optimizer_data
from sdp_convert.program.steps import stepping_loops

from .helpers import code, probe

HEAD = "import torch\nfrom torch.utils.data import DataLoader\n"


def _optimizers(t):
    return [
        c for c in m.findall(t.module, m.Call(func=m.Attribute(attr=m.Name("SGD"))))
        if isinstance(c, cst.Call)
    ]


def _loops(source: str) -> list[list[str] | None]:
    t = probe(HEAD + source)
    found = []
    for call in _optimizers(t):
        loops = stepping_loops(t, call)
        found.append(
            None if loops is None
            else sorted(code(t, loop).splitlines()[0] for loop in loops)
        )
    return found


def test_steps_followed_through_parameters_and_attributes_out_to_the_callers_loops():
    assert _loops(
        "def train(net, loader, opt):\n    for x, y in loader:\n        opt.step()\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for epoch in range(3):\n    train(model, loader, optimizer)\n"
    ) == [["for epoch in range(3):", "for x, y in loader:"]]
    assert _loops(
        "class Trainer:\n    def __init__(self, opt):\n        self.opt = opt\n"
        "    def fit(self, data):\n        for batch in data:\n            self.opt.step()\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "Trainer(optimizer).fit(loader)\n"
    ) == [["for batch in data:"]]
    # A scaler steps it; a scheduler only reads it.
    assert _loops(
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "sched = torch.optim.lr_scheduler.StepLR(optimizer, 1)\n"
        "for x in loader:\n    scaler.step(optimizer)\n"
    ) == [["for x in loader:"]]


def test_an_optimizer_handed_somewhere_not_followed_has_no_known_loops():
    assert _loops(
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "engine = make_engine(optimizer)\nfor x in loader:\n    engine.step()\n"
    ) == [None]
    assert _loops("opts = [torch.optim.SGD(model.parameters(), lr=0.1)]\n") == [None]


def test_each_optimizer_by_the_data_of_its_own_loops():
    t = probe(
        HEAD
        + "loader = DataLoader(data, batch_size=8)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x, y in loader:\n    model(x).sum().backward()\n    opt.step()\n"
        "head_opt = torch.optim.SGD(head.parameters(), lr=0.1)\n"
        "for step in range(100):\n    head(features).sum().backward()\n    head_opt.step()\n"
    )
    assert [optimizer_data(t, c).kind for c in _optimizers(t)] == ["sharded", "full batch"]
