"""program.flow and program.scopes: where a value goes, who calls what, which parameter binds."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m
from sdp_convert.program.flow import loader_sites
from sdp_convert.program.scopes import callee, callers, param_for_arg, training_calls

from .helpers import code, find, probe

HEAD = "import torch\nfrom torch.utils.data import DataLoader\n"


def _loops_of_loader(source: str) -> list[str]:
    t = probe(HEAD + source)
    call = find(t, m.Call(func=m.Name("DataLoader")))
    sites, _ = loader_sites(t, call)
    return sorted(code(t, s.loop).splitlines()[0] for s in sites)


def test_a_loader_is_followed_to_the_loop_through_variables_and_parameters():
    assert _loops_of_loader(
        "loader = DataLoader(ds, shuffle=True)\n"
        "def train(data):\n    for x in data:\n        step(x)\n"
        "train(loader)\n"
    ) == ["for x in data:"]


def test_a_keyword_of_a_wrapper_is_not_what_the_loop_iterates():
    """``tqdm(data, total=steps)``: the loop iterates ``data``; ``steps`` (the step count a
    dataset factory returns beside it) is not training data (eco check: cyclegan-tf2 was told
    its ``len_dataset`` was a pipeline the converter could not follow)."""
    def loops(source: str, name: str) -> list[str]:
        t = probe(HEAD + "from tqdm import tqdm\n" + source)
        call = find(t, m.Call(func=m.Name(name)))
        sites, _ = loader_sites(t, call)
        return [code(t, s.loop).splitlines()[0] for s in sites]

    source = (
        "loader = DataLoader(ds, shuffle=True)\n"
        "steps = len(ds)\n"
        "for x in tqdm(loader, total=steps):\n    step(x)\n"
    )
    assert loops(source, "DataLoader") == ["for x in tqdm(loader, total=steps):"]
    assert loops(source, "len") == []


def test_through_a_function_returning_a_tuple_and_enumerate():
    assert _loops_of_loader(
        "def get_loaders():\n"
        "    train = DataLoader(a, shuffle=True)\n"
        "    val = DataLoader(b)\n"
        "    return train, val\n"
        "tr, va = get_loaders()\n"
        "for i, x in enumerate(tr):\n    step(x)\n"
        "for x in va:\n    check(x)\n"
    ) == ["for i, x in enumerate(tr):"]


def test_through_iter_and_next_in_a_loop():
    assert _loops_of_loader(
        "it = iter(DataLoader(ds))\nwhile True:\n    x = next(it)\n    step(x)\n"
    ) == ["while True:"]


def test_one_argument_to_parameter_rule_for_positions_and_keywords():
    t = probe("def fit(model, loader, epochs=1, *, lr=0.1):\n    pass\nfit(net, dl, lr=2, epochs=3)\n")
    call = find(t, m.Call(func=m.Name("fit")))
    assert isinstance(call, cst.Call)
    function = callee(t, call)
    assert function is not None and function.name.value == "fit"
    bound = {code(t, a.value): param_for_arg(function, call, a) for a in call.args}
    assert {k: v.name.value for k, v in bound.items() if v is not None} == {
        "net": "model", "dl": "loader", "2": "lr", "3": "epochs"
    }
    assert callers(t, function) == [call]


def test_training_calls_include_the_functions_that_lead_to_backward():
    t = probe(
        "def step(x):\n    loss(x).backward()\n    opt.step()\n"
        "def epoch(data):\n    for x in data:\n        step(x)\n"
        "epoch(d)\n"
    )
    found = sorted(code(t, c) for c in training_calls(t))
    assert found == ["epoch(d)", "loss(x).backward()", "opt.step()", "step(x)"]


def test_the_epoch_loop_is_found_through_a_loader_a_trainer_keeps():
    from sdp_convert.program.flow import epoch_loop

    t = probe(
        HEAD
        + "class Trainer:\n"
        "    def __init__(self, data):\n        self.train_data = data\n"
        "    def _run_epoch(self):\n        for x in self.train_data:\n            step(x)\n"
        "    def train(self, n):\n        for epoch in range(n):\n            self._run_epoch()\n"
        "def main():\n    Trainer(DataLoader(ds, shuffle=True)).train(3)\n"
    )
    call = find(t, m.Call(func=m.Name("DataLoader")))
    sites, _ = loader_sites(t, call)
    assert len(sites) == 1
    found = epoch_loop(t, sites[0])
    assert found is not None
    loop, holder = found
    assert code(t, loop).splitlines()[0] == "for epoch in range(n):"
    assert holder is not None and holder.code == "self.train_data"


def _counted_pass(body: str) -> tuple[str, str] | None:
    """(the counter, the statement set_epoch goes before) for the loader of ``body`` (in
    ``def main():``, the loader ``loader`` made first), or None."""
    from sdp_convert.program.flow import counted_pass

    t = probe(HEAD + "def main(n, ckpt):\n    loader = DataLoader(ds, shuffle=True)\n" + body)
    sites, _ = loader_sites(t, find(t, m.Call(func=m.Name("DataLoader"))))
    assert len(sites) == 1
    found = counted_pass(t, sites[0])
    return None if found is None else (found.counter, code(t, found.before).splitlines()[0])


def test_a_pass_over_the_loader_in_a_loop_that_counts_its_epochs_is_found():
    # Counted before the pass, or after it; a pass under an ``if`` of the loop's body.
    assert _counted_pass(
        "    it = 0\n    ep = 0\n    while True:\n        ep += 1\n"
        "        for x in loader:\n            it += 1\n            step(x)\n"
    ) == ("ep", "for x in loader:")
    assert _counted_pass(
        "    ep = 0\n    while ep < n:\n        if n > 0:\n"
        "            for x in loader:\n                step(x)\n        ep += 1\n"
    ) == ("ep", "if n > 0:")


def test_no_counted_pass_where_the_count_is_not_one_per_pass_or_not_the_same_everywhere():
    loop = "        for x in loader:\n            step(x)\n"
    # No counter at all.
    assert _counted_pass("    while True:\n" + loop) is None
    # Counted under an ``if`` (not every pass), or stored again inside the loop.
    assert _counted_pass("    ep = 0\n    while True:\n        if n:\n            ep += 1\n"
                         + loop) is None
    assert _counted_pass("    ep = 0\n    while True:\n        ep += 1\n        ep = ep % 3\n"
                         + loop) is None
    # Several passes per count: an inner loop between the counter's loop and the pass.
    assert _counted_pass("    ep = 0\n    while True:\n        ep += 1\n"
                         "        for phase in (1, 2):\n    " + loop.replace("\n    ", "\n        ")
                         ) is None
    # A count started from a value computed on each rank (a loss) may differ between them.
    assert _counted_pass("    ep = int(loss(ckpt))\n    while True:\n        ep += 1\n"
                         + loop) is None
    assert _counted_pass("    ep = int(n)\n    while True:\n        ep += 1\n" + loop) == (
        "ep", "for x in loader:")
    # Read through next(): an iterator made once does not see set_epoch.
    assert _counted_pass(
        "    it = iter(loader)\n    ep = 0\n    while True:\n        ep += 1\n"
        "        for _ in range(n):\n            step(next(it))\n"
    ) is None


def test_a_loader_is_followed_into_a_dict_or_tuple_literal_and_out_by_its_key():
    assert _loops_of_loader(
        "loaders = {'train': DataLoader(a, shuffle=True), 'val': DataLoader(b)}\n"
        "for x in loaders['val']:\n    check(x)\n"
        "for x in loaders['train']:\n    step(x)\n"
    ) == ["for x in loaders['train']:"]
    assert _loops_of_loader(
        "pair = [DataLoader(a, shuffle=True), DataLoader(b)]\n"
        "for x in pair[1]:\n    check(x)\n"
        "for x in pair[0]:\n    step(x)\n"
    ) == ["for x in pair[0]:"]
    # Packed and unpacked in one statement: the matching target.
    assert _loops_of_loader(
        "tr, va = DataLoader(a, shuffle=True), DataLoader(b)\n"
        "for x in va:\n    check(x)\n"
        "for x in tr:\n    step(x)\n"
    ) == ["for x in tr:"]


def _origin_chain(source: str, use: str) -> list[str]:
    from sdp_convert.program.flow import origin
    from sdp_convert.program.index import file_index

    t = probe(HEAD + source)
    index = file_index(t)
    expr = find(t, m.OneOf(m.Name(), m.Subscript(), m.Attribute(), m.Call()), use)
    chain, at = [], expr
    for _ in range(6):
        back = origin(t, index, expr, at)
        if back is None:
            break
        if back.problem is not None:
            chain.append(f"problem: {back.problem}")
            break
        expr, at = back.value, back.at
        chain.append(code(t, expr))
    return chain


def test_origin_goes_back_through_names_literals_tuples_parameters_and_returns():
    # Step by step: the unpacked name, then the subscript, then the dict's value.
    t_chain = _origin_chain(
        "splits = {'train': make_train(), 'test': make_test()}\n"
        "train, test = splits['train'], splits['test']\n"
        "run(train)\n",
        "run(train)",
    )
    assert t_chain == []  # a call of no function of this file: the caller decides
    assert _origin_chain(
        "splits = {'train': make_train(), 'test': make_test()}\n"
        "train, test = splits['train'], splits['test']\n"
        "consume(train)\n",
        "train",
    ) == ["splits['train']", "make_train()"]
    assert _origin_chain(
        "def data():\n    return build()\n"
        "def fit(ds):\n    consume(ds)\n"
        "fit(data())\n",
        "ds",
    ) == ["data()", "build()"]


def test_origin_stops_with_the_reason_when_it_is_ambiguous():
    assert _origin_chain(
        "def fit(ds):\n    consume(ds)\n"
        "fit(a)\nfit(b)\n",
        "ds",
    ) == ["problem: parameter 'ds' of fit(), called 2 times"]
    # Called from another module only (a trainer's method): never "called 0 times".
    assert _origin_chain(
        "class Trainer:\n    def train(self, ds):\n        consume(ds)\n",
        "ds",
    ) == ["problem: parameter 'ds' of train(), not called in this file"]
    assert _origin_chain(
        "a, b = load()\nconsume(a)\n",
        "a",
    ) == ["problem: a is unpacked from load()"]


def test_branch_join_of_a_model_chosen_in_if_else():
    from sdp_convert.program.models import branch_join

    t = probe(
        "if a:\n    model = A()\nelif b:\n    model = B()\nelse:\n    model = C()\n"
        "if train:\n    net = D()\n    net = E(net)\n"
        "try:\n    m2 = F()\nexcept ImportError:\n    m2 = G()\n"
    )
    assigns = [s for s in m.findall(t.module, m.SimpleStatementLine())]
    by_code = {t.module.code_for_node(s).strip(): s for s in assigns}
    models = [by_code["model = A()"], by_code["model = B()"], by_code["model = C()"]]
    join = branch_join(t, models[2], models)
    assert join is t.module.body[0]
    assert branch_join(t, models[0], models) is t.module.body[0]
    nets = [by_code["net = D()"], by_code["net = E(net)"]]
    assert branch_join(t, nets[1], nets) is None  # same branch: no join
    tries = [by_code["m2 = F()"], by_code["m2 = G()"]]
    assert branch_join(t, tries[1], tries) is t.module.body[2]
