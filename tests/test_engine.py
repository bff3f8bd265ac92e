"""Engine internals a user relies on indirectly: positions, pipeline registry, hook dispatch."""

from __future__ import annotations

import importlib
import pkgutil

import libcst as cst
from hypothesis import given, settings
from hypothesis import strategies as st
from libcst.metadata import MetadataWrapper, PositionProvider
from sdp_convert import transforms
from sdp_convert.engine import _positions
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
