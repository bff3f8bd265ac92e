"""program.syntax and program.builders: reading arguments, writing ``x * sdp.size()``, spelling."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m
import pytest
from sdp_convert.program.builders import statement, torch_spelling
from sdp_convert.program.syntax import (
    arg_named,
    divided_by_size,
    end_of_import_block,
    insert_keyword,
    times_size,
)

from .helpers import code, find, probe


def _call(text: str) -> cst.Call:
    node = cst.parse_expression(text)
    assert isinstance(node, cst.Call)
    return node


@pytest.mark.parametrize(
    ("call", "keyword", "position", "found"),
    [
        ("SGD(p, 0.1)", "lr", 1, "0.1"),
        ("SGD(p, lr=0.1)", "lr", 1, "0.1"),
        ("SGD(*a, lr=0.1)", "lr", 1, "0.1"),
        ("SGD(*a, 0.1)", "lr", 1, None),  # after *args positions are unknown
        ("SGD(p, **kw)", "lr", 1, None),
    ],
)
def test_arg_named_binds_positions_and_keywords(call, keyword, position, found):
    arg = arg_named(_call(call), keyword, position)
    assert (cst.Module([]).code_for_node(arg.value) if arg else None) == found


@pytest.mark.parametrize(
    ("expr", "scaled", "divided"),
    [
        ("0.1", "0.1 * sdp.size()", "0.1 // sdp.size()"),
        ("base_lr * 2", "base_lr * 2 * sdp.size()", "base_lr * 2 // sdp.size()"),
        ("a + b", "(a + b) * sdp.size()", "(a + b) // sdp.size()"),
        ("-x", "-x * sdp.size()", "-x // sdp.size()"),
    ],
)
def test_size_arithmetic_keeps_precedence(expr, scaled, divided):
    node = cst.parse_expression(expr)
    assert cst.Module([]).code_for_node(times_size(node, "sdp")) == scaled
    assert cst.Module([]).code_for_node(divided_by_size(node, "sdp")) == divided


def test_insert_keyword_after_a_position():
    new = insert_keyword(_call("SGD(params, momentum=0.9)"), 0, "lr", cst.parse_expression("1"))
    assert cst.Module([]).code_for_node(new) == "SGD(params, lr=1, momentum=0.9)"


def test_end_of_import_block_skips_docstring_and_future():
    module = cst.parse_module('"""Doc."""\nfrom __future__ import annotations\nimport os\nx = 1\n')
    last = end_of_import_block(module)
    assert last is not None and cst.Module([]).code_for_node(last).strip() == "import os"


def test_torch_spelling_follows_the_files_alias():
    asked: list[tuple[object, ...]] = []

    def add_import(*args: object) -> None:
        asked.append(args)

    assert torch_spelling(probe("import torch as th\nx = th.ones(1)\n"), add_import) == "th"
    assert asked == []
    assert torch_spelling(probe("import torch.nn as nn\nx = 1\n"), add_import) == "torch"
    assert asked == [("torch.utils.data.distributed",)]  # the import that binds ``torch``


def test_statement_is_laid_out_to_fit_the_line():
    t = probe("def f():\n    x = 1\n")
    at = find(t, m.SimpleStatementLine())
    short = statement(t, "s = Sampler(", ["ds"], at)
    assert code(t, short) == "s = Sampler(ds)"
    long_args = [f"argument_{i}=value_{i}" for i in range(8)]
    laid = code(t, statement(t, "sampler = DistributedSampler(", long_args, at))
    assert laid.splitlines()[0] == "sampler = DistributedSampler("
    assert all(len(line) <= 99 for line in laid.splitlines())
