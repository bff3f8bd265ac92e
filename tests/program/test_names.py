"""program.names: the qualified names of every node are the ones libcst's QualifiedNameProvider
gives, on every Python file of the fixtures (inputs and expected outputs) and on the benchmark's
generated scripts; then each rule on its own.

Stated exception (see ``program.names``): a string annotation (``x: "torch.Tensor"``), which
libcst parses and answers for on the string node; here strings have no names.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import libcst as cst
import pytest
from libcst._metadata_dependent import LazyValue
from libcst.metadata import MetadataWrapper, QualifiedNameProvider, QualifiedNameSource
from sdp_convert.program.index import index_module

ROOT = Path(__file__).resolve().parents[2]
FIXTURE_FILES = sorted(
    p for p in (ROOT / "fixtures").rglob("*.py")
)
_STRINGS = (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)


def _walk(node: cst.CSTNode):
    stack = [node]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children)


def _pairs(found) -> set[tuple[str, QualifiedNameSource]]:
    if isinstance(found, LazyValue):
        found = found()
    return {(q.name, q.source) for q in found}


def _differences(source: str) -> tuple[int, list[str]]:
    """How many nodes have names, and the nodes (as code) where ours and libcst's differ."""
    module = cst.parse_module(source)
    ours = index_module(module).names
    theirs = MetadataWrapper(module, unsafe_skip_copy=True).resolve(QualifiedNameProvider)
    named, differ = 0, []
    for node in _walk(module):
        expected = _pairs(theirs.get(node, set()))
        got = _pairs(ours.get(node, set()))
        if isinstance(node, _STRINGS) and not got:
            continue  # the stated exception: a string annotation
        named += bool(expected)
        if got != expected:
            differ.append(f"{type(node).__name__} {module.code_for_node(node)[:60]!r}: "
                          f"ours {sorted(got)} libcst {sorted(expected)}")
    return named, differ


@pytest.mark.parametrize(
    "path", FIXTURE_FILES, ids=[str(p.relative_to(ROOT / "fixtures")) for p in FIXTURE_FILES]
)
def test_every_node_of_every_fixture_has_libcsts_qualified_names(path):
    named, differ = _differences(path.read_text(encoding="utf-8"))
    assert not differ, "\n".join(differ[:20])
    assert named > 0


def test_every_node_of_the_benchmark_corpus_has_libcsts_qualified_names(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_convert
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    paths = [p for p in bench_convert.corpus(tmp_path, 8) if p.name.startswith("generated")]
    assert len(paths) == 8
    for path in paths:
        named, differ = _differences(path.read_text())
        assert not differ, f"{path.name}:\n" + "\n".join(differ[:20])
        assert named > 100


# -- the rules, one by one (each also checked against libcst) ----------------------------------

def _names_of(source: str, text: str, index: int = 0) -> set[tuple[str, str]]:
    """The qualified names (name, source) of the ``index``-th node whose code is ``text``."""
    source = textwrap.dedent(source)
    named, differ = _differences(source)
    assert not differ, "\n".join(differ)
    module = cst.parse_module(source)
    names = index_module(module).names
    nodes = [
        n for n in _walk(module)
        if isinstance(n, (cst.Name, cst.Attribute, cst.Call)) and module.code_for_node(n) == text
    ]
    nodes.sort(key=lambda n: _position(module, n))
    return {(q.name, q.source.name) for q in names.get(nodes[index], set())}


def _position(module: cst.Module, node: cst.CSTNode) -> tuple[int, int]:
    positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(
        cst.metadata.PositionProvider
    )
    start = positions[node].start
    return start.line, start.column


def test_aliases_and_dotted_imports():
    src = """
        import torch.optim as optim
        import torch.nn
        import numpy as np, os.path
        optim.SGD
        torch.nn.Linear(3, 4)
        torch.cuda
        np.load
        os.path.join
    """
    assert _names_of(src, "optim.SGD") == {("torch.optim.SGD", "IMPORT")}
    assert _names_of(src, "torch.nn.Linear(3, 4)") == {("torch.nn.Linear", "IMPORT")}
    assert _names_of(src, "torch.cuda") == {("torch.cuda", "IMPORT")}
    assert _names_of(src, "np.load") == {("numpy.load", "IMPORT")}
    assert _names_of(src, "os.path.join") == {("os.path.join", "IMPORT")}


def test_relative_imports_keep_their_dots():
    src = """
        from . import utils
        from .data import get_loaders as loaders
        from ..models import Net
        utils.seed()
        loaders()
        Net
    """
    assert _names_of(src, "utils.seed()") == {(".utils.seed", "IMPORT")}
    assert _names_of(src, "loaders()") == {(".data.get_loaders", "IMPORT")}
    assert _names_of(src, "Net", 1) == {("..models.Net", "IMPORT")}


def test_a_local_assignment_shadows_an_import_and_a_name_assigned_twice_has_both():
    src = """
        from torch.optim import SGD
        opt = SGD
        opt
        if cond:
            SGD = make()
        SGD
        def f():
            SGD
    """
    assert _names_of(src, "opt", 1) == {("opt", "LOCAL")}
    assert _names_of(src, "SGD", 1) == {("torch.optim.SGD", "IMPORT")}  # only earlier ones
    assert _names_of(src, "SGD", 2) == {("SGD", "LOCAL")}  # a binding's own node: itself
    assert _names_of(src, "SGD", 3) == {("torch.optim.SGD", "IMPORT"), ("SGD", "LOCAL")}
    # A function sees every binding of the module, wherever it is.
    assert _names_of(src, "SGD", 4) == {("torch.optim.SGD", "IMPORT"), ("SGD", "LOCAL")}
    assert _names_of(src, "SGD", 0) == set()  # the imported name itself: not visited by libcst


def test_function_and_class_scopes_qualify_local_names():
    src = """
        class Trainer:
            lr = 0.1
            def step(self):
                lr
                model = build()
                model.train()
                return lambda x: x
    """
    assert _names_of(src, "lr", 1) == set()  # a method does not see its class's names
    assert _names_of(src, "lr", 0) == {("Trainer.lr", "LOCAL")}
    assert _names_of(src, "model.train()") == {
        ("Trainer.step.<locals>.model.train", "LOCAL")
    }
    assert _names_of(src, "x", 1) == {("Trainer.step.<locals>.<locals>.x", "LOCAL")}


def test_global_and_nonlocal_move_a_binding():
    src = """
        import torch
        def setup():
            global torch
            torch = None
        def outer():
            best = 0
            def bump():
                nonlocal best
                best = 1
            best
        torch
    """
    assert _names_of(src, "torch", 2) == {("torch", "LOCAL")}  # stored to, in the module
    assert _names_of(src, "torch", 3) == {("torch", "IMPORT"), ("torch", "LOCAL")}
    assert _names_of(src, "best", 3) == {("outer.<locals>.best", "LOCAL")}


def test_comprehension_variables_have_their_own_scope_and_the_first_iterable_is_outside():
    src = """
        batches = load()
        sizes = [len(b) for b in batches if b]
        pairs = {k: v for k, v in items(batches)}
    """
    assert _names_of(src, "b", 0) == {("<comprehension>.b", "LOCAL")}
    assert _names_of(src, "b", 2) == {("<comprehension>.b", "LOCAL")}
    assert _names_of(src, "batches", 1) == {("batches", "LOCAL")}
    assert _names_of(src, "v", 0) == {("<comprehension>.v", "LOCAL")}
    assert _names_of(src, "len(b)") == {("builtins.len", "BUILTIN")}


def test_builtins_and_a_star_import():
    src = """
        from utils import *
        print(open)
        train()
        print = log
        print
    """
    # A call is named by every binding of its callee in the scope, later ones too (libcst):
    assert _names_of(src, "print(open)") == {("print", "LOCAL")}
    assert _names_of(src, "print", 0) == {("builtins.print", "BUILTIN")}  # a read: earlier only
    assert _names_of(src, "open") == {("builtins.open", "BUILTIN")}
    assert _names_of(src, "train()") == set()  # a star import binds nothing libcst can see
    assert _names_of(src, "print", 1) == {("print", "LOCAL")}


def test_decorators_defaults_and_bases_are_read_in_the_enclosing_scope():
    src = """
        import torch
        def build(device=torch.device("cpu"), torch=None):
            return torch
        class Net(torch.nn.Module):
            pass
    """
    assert _names_of(src, 'torch.device("cpu")') == {("torch.device", "IMPORT")}
    assert _names_of(src, "torch", 3) == {("build.<locals>.torch", "LOCAL")}
    assert _names_of(src, "torch.nn.Module") == {("torch.nn.Module", "IMPORT")}


def test_a_read_in_its_own_scope_sees_only_earlier_bindings_and_a_loop_target_its_loop():
    src = """
        def f(x):
            y = x
            x = y
            for x in x:
                x
    """
    assert _names_of(src, "x", 1) == {("f.<locals>.x", "LOCAL")}
    assert _names_of(src, "y", 1) == {("f.<locals>.y", "LOCAL")}
