"""The program model built on its own, from source text: no transform, no engine, no options.

``FileModel.from_source`` is all a newcomer needs to ask the program layer a question."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m
from sdp_convert.program.flow import loader_sites, origin
from sdp_convert.program.index import file_index
from sdp_convert.program.model import FileModel
from sdp_convert.program.models import model_creation, trained_models
from sdp_convert.program.optimizers import params_argument
from sdp_convert.program.sharding import training_data

SCRIPT = """\
import torch
from torch import nn, optim
from torch.utils.data import DataLoader, TensorDataset


def get_loader(batch_size):
    ds = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    return DataLoader(ds, batch_size=batch_size, shuffle=True)


def main():
    net = nn.Linear(4, 1)
    net = torch.compile(net)
    opt = optim.SGD(net.parameters(), lr=0.1)
    loader = get_loader(16)
    for epoch in range(2):
        for x, y in loader:
            opt.zero_grad()
            loss = nn.functional.mse_loss(net(x), y)
            loss.backward()
            opt.step()


if __name__ == "__main__":
    main()
"""


def _code(fm: FileModel, node: cst.CSTNode) -> str:
    return fm.code(node).strip()


def test_the_model_says_what_the_file_is_and_where_its_calls_are():
    fm = FileModel.from_source(SCRIPT)
    assert fm.info.framework == "torch" and fm.info.convertible
    assert fm.runtime_module == "sdp_runtime.torch"
    [loader] = fm.calls_to("torch.utils.data.DataLoader")
    assert fm.refers_to(loader.func, "torch.utils.data.DataLoader")
    assert fm.qualified_names(loader.func) == {"torch.utils.data.DataLoader"}
    function = fm.enclosing_function(loader)
    assert function is not None and function.name.value == "get_loader"
    statement = fm.enclosing_statement(loader)
    assert statement is not None and _code(fm, statement).startswith("return DataLoader(")
    assert [_code(fm, c) for c in fm.method_calls("backward")] == ["loss.backward()"]


def test_a_loaders_origin_is_traced_back_through_the_function_that_returns_it():
    fm = FileModel.from_source(SCRIPT)
    index = file_index(fm)
    loop = next(f for f in m.findall(fm.module, m.For()) if _code(fm, f.target) == "x, y")
    assert isinstance(loop, cst.For)
    chain, expr, at = [], loop.iter, loop
    for _ in range(4):
        back = origin(fm, index, expr, at)
        if back is None or back.value is None:
            break
        expr, at = back.value, back.at or at
        chain.append(_code(fm, expr))
    assert chain == [
        "get_loader(16)", "DataLoader(ds, batch_size=batch_size, shuffle=True)",
    ]


def test_a_loader_is_followed_forward_to_the_loop_that_iterates_it():
    fm = FileModel.from_source(SCRIPT)
    [loader] = fm.calls_to("torch.utils.data.DataLoader")
    sites, _ = loader_sites(fm, loader)
    assert [_code(fm, s.loop).splitlines()[0] for s in sites] == ["for x, y in loader:"]
    # Split in this run (shard_dataloader gives it a DistributedSampler), unless it is skipped:
    # the model answers for the run it was built for.
    assert training_data(fm).sharded is True
    skipped = FileModel.from_source(SCRIPT, skip=frozenset({"shard_dataloader"}))
    assert training_data(skipped).sharded is False


def test_the_trained_models_wrap_site_is_its_creation_not_the_compile_around_it():
    fm = FileModel.from_source(SCRIPT)
    [sgd] = fm.calls_to("torch.optim.SGD")
    params = params_argument(sgd)
    assert params is not None
    [receiver] = trained_models(fm, params.value, 0)
    assert isinstance(receiver, cst.Name) and receiver.value == "net"
    index = file_index(fm)
    binding = index.reaching("net", receiver)
    assert binding is not None
    creation = model_creation(fm, index.bindings_of("net", binding.scope), binding, receiver)
    assert creation is not None and _code(fm, creation.stmt) == "net = nn.Linear(4, 1)"


def test_a_model_needs_no_transform_and_answers_for_its_own_tree_only():
    fm = FileModel.from_source("import torch\nx = torch.ones(1)\n")
    other = cst.parse_expression("torch.ones(1)")
    assert fm.parent(other) is None and fm.qualified_names(other) == set()
    call = fm.calls_to("torch.ones")[0]
    assert isinstance(fm.parent(call), cst.Assign)
    assert not fm.info.training  # no training step: not a training script
