"""program.ranks: one answer to "does this run on rank 0 only"."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m
from sdp_convert.program.ranks import is_rank0_test, only_called_on_rank0, rank0_only

from .helpers import find, probe

HEAD = "import torch\nimport torch.distributed as dist\nimport sdp_runtime.torch as sdp\n"


def _save(source: str, text: str = 'torch.save(m, "a.pt")') -> bool:
    t = probe(HEAD + source)
    return rank0_only(t, find(t, m.Call(), text))


def test_the_body_of_a_rank_zero_test_runs_on_rank_zero_only():
    assert _save('if sdp.rank() == 0:\n    torch.save(m, "a.pt")\n')
    assert _save('if 0 == dist.get_rank():\n    torch.save(m, "a.pt")\n')
    assert _save('if not sdp.rank():\n    torch.save(m, "a.pt")\n')
    assert _save('x = torch.save(m, "a.pt") if sdp.rank() == 0 else None\n')


def test_the_else_branch_and_other_tests_do_not():
    assert not _save('if sdp.rank() == 0:\n    pass\nelse:\n    torch.save(m, "a.pt")\n')
    assert not _save('if sdp.rank() == 1:\n    torch.save(m, "a.pt")\n')
    assert not _save('if verbose:\n    torch.save(m, "a.pt")\n')
    assert not _save('torch.save(m, "a.pt")\n')


def test_a_variable_that_holds_the_rank_counts_as_the_rank():
    assert _save('rank = dist.get_rank()\nif rank == 0:\n    torch.save(m, "a.pt")\n')
    assert not _save('rank = 3\nif rank == 0:\n    torch.save(m, "a.pt")\n')


def test_code_after_a_horovod_style_exit_of_the_other_ranks():
    body = 'def save(m):\n    if sdp.rank() != 0:\n        return\n    torch.save(m, "a.pt")\n'
    assert _save(body)
    assert _save('for m in models:\n    if sdp.rank() > 0:\n        continue\n    torch.save(m, "a.pt")\n')
    assert _save('import sys\nif dist.get_rank() != 0:\n    sys.exit(0)\ntorch.save(m, "a.pt")\n')
    # the exit must come first, and it does not reach into a function defined after it
    assert not _save('def save(m):\n    torch.save(m, "a.pt")\n    if sdp.rank() != 0:\n        return\n')
    assert not _save(
        'if sdp.rank() != 0:\n    raise SystemExit\ndef later(m):\n    torch.save(m, "a.pt")\n'
    )


def test_a_function_only_called_on_rank_zero():
    t = probe(
        HEAD + 'def dump(m):\n    torch.save(m, "a.pt")\n\nif sdp.rank() == 0:\n    dump(net)\n'
    )
    assert only_called_on_rank0(t, find(t, m.Call(), 'torch.save(m, "a.pt")'))
    t = probe(HEAD + 'def dump(m):\n    torch.save(m, "a.pt")\n\ndump(net)\n')
    assert not only_called_on_rank0(t, find(t, m.Call(), 'torch.save(m, "a.pt")'))


def test_is_rank0_test_knows_every_librarys_rank_call():
    t = probe(
        "import horovod.torch as hvd\nimport smdistributed.dataparallel.torch.distributed as smd\n"
        "a = hvd.rank() == 0\nb = smd.get_rank() == 0\nc = hvd.size() == 0\n"
    )
    tests = [n for n in m.findall(t.module, m.Comparison())]
    assert [is_rank0_test(t, x) for x in tests if isinstance(x, cst.Comparison)] == [
        True, True, False
    ]
