"""program.models (which object trains, what a module is) and program.writes (file-writing
questions), each on its own."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import libcst.matchers as m
from sdp_convert.program.index import file_index
from sdp_convert.program.model import FileModel
from sdp_convert.program.models import (
    data_parallel_checkpoints,
    data_parallel_notes,
    freezes,
    is_module_value,
    is_module_value_expr,
    is_plain_object,
    model_expression,
    models_from_backward,
    names_held_by,
    trained_models,
)
from sdp_convert.program.syntax import code as text
from sdp_convert.program.syntax import findall
from sdp_convert.program.writes import argument, in_memory, open_mode

from .helpers import code, find, probe

HEAD = "import io\nimport torch\nfrom torch import nn\n"


def _optimizer_models(source: str) -> list[str]:
    t = probe(HEAD + source)
    call = find(t, m.Call(func=m.Attribute(attr=m.Name("SGD"))))
    return [code(t, model_expression(e) or e) for e in trained_models(t, call, 0)]


def test_the_models_an_optimizer_trains_through_variables_parameters_and_sub_modules():
    assert _optimizer_models(
        "model = Net()\nparams = model.parameters()\nopt = torch.optim.SGD(params, lr=0.1)\n"
    ) == ["model"]
    # A parameter is followed to what its callers pass.
    assert _optimizer_models(
        "def make_opt(params):\n    return torch.optim.SGD(params, lr=0.1)\n"
        "make_opt(encoder.parameters())\n"
    ) == ["encoder"]
    groups = _optimizer_models(
        "opt = torch.optim.SGD([{'params': model[0].parameters()}, "
        "{'params': model[2].parameters(), 'lr': 0.01}], lr=0.1)\n"
    )
    assert groups == ["model", "model"]  # model[0] and model[2] are layers of one model


def test_model_expression_names_the_model_of_a_receiver():
    t = probe("self.model.head\nself.layers[0]\nmodel[1].fc\nget().x\n")
    exprs = [s.body[0].value for s in t.module.body]
    found = [model_expression(e) for e in exprs]
    assert [code(t, f) if f is not None else None for f in found] == [
        "self.model", "self.layers", "model", None
    ]


def test_what_is_a_torch_module_with_weights():
    t = probe(
        HEAD
        + "class Net(nn.Module):\n    pass\n"
        + "class Deeper(Net):\n    pass\n"
        + "class Config:\n    pass\n"
        + "a = nn.Linear(2, 2).cuda()\nb = Deeper()\nc = Config()\nd = nn.ReLU()\n"
        + "e = torchvision.models.resnet18()\n"
    )
    values = {
        code(t, s.body[0].targets[0].target): s.body[0].value
        for s in t.module.body
        if isinstance(s, cst.SimpleStatementLine) and isinstance(s.body[0], cst.Assign)
    }
    assert {k: is_module_value_expr(t, v) for k, v in values.items()} == {
        "a": True, "b": True, "c": False, "d": False, "e": False
    }
    assert is_plain_object(t, values["c"]) and not is_plain_object(t, values["b"])
    use = find(t, m.Name("a"), "a")
    assert is_module_value(t, use)


def test_a_class_redefined_under_one_name_is_the_one_defined_above_the_use():
    t = probe(
        HEAD
        + "class Model(nn.Module):\n    pass\n"
        + "first = Model()\n"
        + "class Model:\n    pass\n"
        + "second = Model()\n"
    )
    first, second = [
        s.body[0].value for s in t.module.body
        if isinstance(s, cst.SimpleStatementLine) and isinstance(s.body[0], cst.Assign)
    ]
    assert is_module_value_expr(t, first) and not is_module_value_expr(t, second)
    assert file_index(t).class_named(second.func) is not file_index(t).class_named(first.func)


def test_the_modules_a_loss_is_computed_with():
    t = probe(
        HEAD
        + "net = nn.Linear(4, 1)\nhead = nn.Linear(1, 1)\nlookup = dict()\n"
        + "out = head(net(x))\nloss = (out - lookup(y)).pow(2).mean()\nloss.backward()\n"
    )
    assert sorted(code(t, callee) for callee, _ in models_from_backward(t)) == ["head", "net"]


def test_freezing_statements():
    t = probe("for p in enc.parameters():\n    p.requires_grad = False\nenc.requires_grad_(False)\nx = 1\n")
    assert [freezes(s) for s in t.module.body] == [True, True, False]


def test_write_arguments_modes_and_memory_buffers():
    t = probe(
        HEAD
        + "buf = io.BytesIO()\n"
        + "torch.save(state, buf)\ntorch.save(state, 'w.pt')\n"
        + "open(p)\nopen(p, 'wb')\nopen(p, mode=m)\nopen(*args)\n"
    )
    saves = [c for c in m.findall(t.module, m.Call(func=m.Attribute(attr=m.Name("save"))))]
    assert [in_memory(t, argument(c, 1, "f")) for c in saves] == [True, False]
    opens = [c for c in m.findall(t.module, m.Call(func=m.Name("open")))]
    assert [open_mode(c, "r", 1) for c in opens] == ["r", "wb", None, None]


def test_removing_data_parallel_names_the_checkpoints_that_change_format():
    t = probe("""
        import torch
        import torch.nn as nn

        model = nn.DataParallel(Recognizer()).to("cuda")
        if opt.pretrained:
            model.load_state_dict(torch.load(opt.pretrained), strict=False)
        for epoch in range(3):
            torch.save(model.state_dict(), "best.pth")
        snapshot = {"model": model.state_dict(), "epoch": 3}
        torch.save(snapshot, "last.pth")
        copy = model.state_dict()
        """)
    dp = find(t, m.Call(), 'nn.DataParallel(Recognizer())')
    # The wrapped model is the name the DataParallel call is assigned to.
    note = data_parallel_checkpoints(t, dp, "sdp")
    assert note is not None
    assert "load_state_dict at line 7 of the original" in note and "strict=False silently loads nothing" in note
    assert "consume_prefix_in_state_dict_if_present" in note
    # Saved directly and through a dict that is saved; the in-memory copy is no checkpoint.
    assert "saved at lines 9, 10 of the original" in note and "'module.' + k" in note
    # A load before the DataParallel call (the plain model's keys) and a save of the module
    # inside it keep their format: nothing to say.
    other = probe("""
        import torch.nn as nn
        net.load_state_dict(torch.load("plain.pt"))
        net = nn.DataParallel(net)
        torch.save(net, "whole.pt")
        torch.save(net.module.state_dict(), "plain.pt")
        """)
    assert data_parallel_checkpoints(other, find(other, m.Call(), "nn.DataParallel(net)"),
                                     "sdp") is None


def test_removing_data_parallel_names_what_the_gpu_count_grew():
    t = probe("""
        import torch
        import torch.nn as nn

        opt.num_gpu = torch.cuda.device_count()
        if opt.num_gpu > 1:
            opt.batch_size = opt.batch_size * opt.num_gpu
            workers *= torch.cuda.device_count()
        lr = 0.1 * 2
        model = nn.DataParallel(Net()).cuda()
        head = nn.DataParallel(Head()).cuda()
        """)
    first = find(t, m.Call(), "nn.DataParallel(Net())")
    noted = [code(t, node) for node, _ in data_parallel_notes(t, first, "sdp")]
    # The products with the count (called, or the name it went to); not the test, not lr.
    assert noted == ["opt.batch_size * opt.num_gpu", "workers *= torch.cuda.device_count()"]
    # Once a file: the second DataParallel adds nothing.
    assert data_parallel_notes(t, find(t, m.Call(), "nn.DataParallel(Head())"), "sdp") == []


def test_names_held_by_answers_for_the_wanted_names_what_reading_every_name_answers():
    """``names_held_by`` makes the text only of names and attributes that can be wanted: for
    every name or attribute assigned in the fixtures (and spellings with parentheses and
    comments), the objects it gives are those of reading every name and attribute's code."""
    edges = (
        "import torch\n"
        "enc = Enc()\n(enc2) = Enc()\nself.a.b = X()\n"
        "dec = Dec(enc, (enc2), self . a . b, (self.a  # c\n  ).b, f(enc).enc)\n"
        "other = Dec(encoder, self.a, enc2x)\n"
    )
    root = Path(__file__).resolve().parents[2]
    sources = [edges] + [p.read_text() for p in sorted((root / "fixtures").rglob("input.py"))]
    checked = 0
    for source in sources:
        fm = FileModel.from_source(source)
        assigns = [n for n in findall(fm.module, m.Assign()) if isinstance(n, cst.Assign)]
        creations = [(i, fm.index.scope(a), a.value) for i, a in enumerate(assigns)]
        wanted = {text(t.target) for a in assigns for t in a.targets
                  if isinstance(t.target, (cst.Name, cst.Attribute))}
        every: dict[tuple[int, str], list[int]] = {}
        for obj, scope, value in creations:
            for name in {text(n) for n in findall(value, m.Name() | m.Attribute())}:
                every.setdefault((id(scope), name), []).append(obj)
        expected = {k: v for k, v in every.items() if k[1] in wanted}
        assert names_held_by(creations, wanted) == expected
        checked += len(expected)
    assert checked > 1000
