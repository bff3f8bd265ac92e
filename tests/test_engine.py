"""Engine internals a user relies on indirectly: positions, pipeline registry, hook dispatch."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import libcst as cst
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from libcst.metadata import MetadataWrapper, PositionProvider
from sdp_convert import transforms
from sdp_convert.engine import _positions, convert
from sdp_convert.pipeline import PIPELINE


def test_every_transform_module_is_in_the_pipeline_exactly_once():
    modules = sorted(m.name for m in pkgutil.iter_modules(transforms.__path__))
    names = [t.NAME for t in PIPELINE]
    assert sorted(names) == modules
    assert len(set(names)) == len(names)
    for t in PIPELINE:
        module = importlib.import_module(t.__module__)
        assert t.DESCRIPTION and "\\n" not in t.DESCRIPTION
        assert module.__doc__ and "Before" in module.__doc__ and "After" in module.__doc__, t.NAME
        assert t.FRAMEWORKS


SOURCE = '''\
"""Doc."""
import torch  # c

if  True :
    for i in range( 3 ):
        x = [1,
             2]; y = torch.ones(3)
        print( f"{x}" ,
               y)
    class A:
        @staticmethod
        def f(a, b=(1, 2)):
            return a \\
                + b
else:
    z = lambda q: q
'''


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_target_positions_match_libcst_position_provider(data):
    module = cst.parse_module(SOURCE)
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    expected = wrapper.resolve(PositionProvider)
    nodes = [n for n in expected if not isinstance(n, (cst.Module,))]
    picked = data.draw(st.lists(st.sampled_from(nodes), min_size=1, max_size=8))
    records = [(node, "t", str(i), False) for i, node in enumerate(picked)]
    got = {c.message: (c.line, c.col) for c in _positions(module, records)}
    for i, node in enumerate(picked):
        start = expected[node].start
        assert got[str(i)] == (start.line, start.column + 1), type(node).__name__


# -- any import spelling: a result, never "internal error" --------------------------------------

_FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
#: How the same module may be imported: (line in the fixtures, replacements for it).
_SPELLINGS = {
    "import tensorflow as tf\n": [
        "import tensorflow.compat.v2 as tf\n",
        "import tensorflow as tf_\ntf = tf_\n",
        "from tensorflow import compat\ntf = compat.v2\n",
    ],
    "import torch\n": [
        "import torch as torch\n",
        "import torch.nn\n",
    ],
}


def _respelled() -> list[tuple[str, str]]:
    cases = []
    for path in sorted(_FIXTURES.glob("*/*/input.py")):
        text = path.read_text()
        for line, spellings in _SPELLINGS.items():
            if line in text:
                for i, spelling in enumerate(spellings):
                    cases.append((f"{path.parent.parent.name}/{path.parent.name}-{i}",
                                  text.replace(line, spelling, 1)))
    return cases


@pytest.mark.parametrize(("case", "source"), _respelled(), ids=[c for c, _ in _respelled()])
def test_any_import_spelling_gives_a_fixed_point_or_the_file_unchanged(case: str, source: str):
    # convert() checks that its output is a fixed point; where a second pass would change it,
    # it leaves the file as it was with a note, instead of failing with an internal error.
    result = convert(source)
    if result.changed:
        assert not convert(result.output).changed
    else:
        assert result.output == source.encode()


def test_the_compat_v2_alias_is_tensorflow():
    source = (_FIXTURES / "tensorflow" / "eager_loop" / "input.py").read_text()
    plain = convert(source)
    aliased = convert(
        source.replace("import tensorflow as tf\n", "import tensorflow.compat.v2 as tf\n")
    )
    assert aliased.changed
    assert [(c.line, c.transform, c.manual) for c in aliased.changes] == [
        (c.line, c.transform, c.manual) for c in plain.changes
    ]


def test_a_result_that_would_change_again_leaves_the_file_alone_with_a_note(monkeypatch):
    from sdp_convert import engine

    real = engine._check_once

    def unstable(data: bytes, options):  # the check finds work (tests/test_fixed_point.py: how)
        result = real(data, options)
        return engine.Result(data, data + b"# again\n", result.info, result.changes)

    monkeypatch.setattr(engine, "_check_once", unstable)
    source = (_FIXTURES / "torch" / "mnist_basic" / "input.py").read_bytes()
    result = engine.convert(source)
    assert result.output == source and not result.changed
    (note,) = result.changes
    assert note.manual and note.message.startswith("not converted: converting the result again")


def test_a_script_that_optimises_an_input_tensor_is_left_as_it_is_with_a_note():
    # Neural style transfer trains the image: nothing to split between processes.
    source = (
        "import torch\n"
        "cnn = make_cnn()\n"
        "image = torch.rand(1, 3, 8, 8).requires_grad_(True)\n"
        "optimizer = torch.optim.Adam([image], lr=0.02)\n"
        "for step in range(10):\n"
        "    optimizer.zero_grad()\n"
        "    cnn(image).sum().backward()\n"
        "    optimizer.step()\n"
        "torch.save(image, 'out.pt')\n"
    )
    result = convert(source)
    assert result.output == source.encode()
    assert [(c.line, c.manual) for c in result.changes] == [(4, True)]
    assert "not converted: the optimizer trains image, an input tensor" in result.changes[0].message


def test_no_libcst_scope_metadata_is_resolved(monkeypatch):
    """Qualified names come from ``program.names``: libcst's scope analysis (and the expression
    contexts it stands on, and its qualified-name walk) never runs, in a conversion with its
    fixed-point check nor in project mode's probe."""
    from libcst.metadata import (
        ExpressionContextProvider,
        QualifiedNameProvider,
        ScopeProvider,
    )
    from sdp_convert.engine import probe_module
    from sdp_convert.options import Options

    def visit_Module(self, node):  # the name libcst's batched visit looks for
        raise AssertionError(f"{type(self).__name__} resolved")

    for provider in (ScopeProvider, ExpressionContextProvider, QualifiedNameProvider):
        monkeypatch.setattr(provider, "visit_Module", visit_Module)
    with pytest.raises(AssertionError, match="resolved"):  # the trap works
        MetadataWrapper(cst.parse_module("x = 1")).resolve(QualifiedNameProvider)
    source = (_FIXTURES / "torch" / "mnist_basic" / "input.py").read_bytes()
    assert convert(source).changed
    assert probe_module(source, Options(), lambda name: None).script


def test_only_a_migration_note_excuses_a_name_the_inserted_code_reads_unbound():
    from sdp_convert.changes import Change
    from sdp_convert.engine import dropped_names

    # A note that merely mentions ``tf.data`` must not hide a pinning reading ``tf`` before the
    # file imports it (yolov3-tf2: NameError on every run, and no note said so).
    other = Change(9, 1, "shard_tf_dataset", "give each worker its own part: tf.data ...", True)
    assert "tf" not in dropped_names([other])
    migration = Change(2, 1, "migrate_horovod", "from horovod.torch import join: left as is", True)
    assert "join" in dropped_names([other, migration])
    assert "join" not in dropped_names([Change(2, 1, "migrate_horovod", "join", False)])
