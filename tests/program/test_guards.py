"""program.guards: whether a statement can run on rank 0 only, and None tests of a handle."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m
from sdp_convert.program.guards import is_none_test, under_handle_test, why_not_guardable
from sdp_convert.program.scopes import binding_of

from .helpers import find, probe


def _why(source: str, call: str) -> str | None:
    t = probe(source)
    node = find(t, m.Call(), call)
    return why_not_guardable(t, node, t.enclosing_statement(node))


def test_what_can_be_guarded_and_why_not():
    assert _why("torch.save(state, 'a.pt')\n", "torch.save(state, 'a.pt')") is None
    assert _why("ok = torch.save(state, 'a.pt')\n", "torch.save(state, 'a.pt')") is None
    assert _why("ok = save(s)\nprint(ok)\n", "save(s)") == (
        "it assigns a name used later, which the other ranks would miss"
    )
    assert _why("def f():\n    return save(s)\n", "save(s)") == "its result is returned"
    assert _why("if save(s):\n    pass\n", "save(s)") == "it is in a condition"
    assert _why("while save(s):\n    pass\n", "save(s)") == "it is in a condition"
    assert _why("cb = lambda: save(s)\n", "save(s)") == "it is inside a lambda"
    assert _why("def f(): save(s)\n", "save(s)") == "it shares its line with a def, class or try"


def test_uses_that_already_test_the_handle_for_none():
    t = probe(
        "writer = make()\n"
        "if writer is not None:\n    writer.add(1)\n"
        "if writer:\n    writer.add(2)\n"
        "writer.add(3)\n"
        "done = writer is None\n"
    )
    target = t.module.body[0].body[0].targets[0].target
    binding = binding_of(t, target)
    reads = [n for n in m.findall(t.module, m.Name("writer")) if n is not target]
    calls = [n for n in reads if isinstance(t.parent(n), cst.Attribute)]
    assert [under_handle_test(t, n, binding) for n in calls] == [True, True, False]
    assert [is_none_test(t, n) for n in reads] == [True, False, True, False, False, True]
