"""program.deletions: which calls delete, and what goes to rank 0 with a deletion."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m
from sdp_convert.program.deletions import deletion_unit, is_deletion, reads_file_system

from .helpers import code, find, probe

HEAD = "import os\nimport glob\nimport shutil\nimport tensorflow as tf\nfrom pathlib import Path\n"


def _calls(source: str) -> list[str]:
    t = probe(HEAD + source)
    return [code(t, c) for c in m.findall(t.module, m.Call()) if is_deletion(t, c)]


def test_deletions_by_qualified_name_and_pathlib_methods():
    assert _calls(
        "import os as system\nfrom shutil import rmtree\n"
        "rmtree('a')\nsystem.remove('b')\nos.unlink('c')\ntf.io.gfile.rmtree('d')\n"
        "p = Path('e') / 'f'\np.unlink()\nPath('g').rmdir()\n"
    ) == [
        "rmtree('a')",
        "system.remove('b')",
        "os.unlink('c')",
        "tf.io.gfile.rmtree('d')",
        "p.unlink()",
        "Path('g').rmdir()",
    ]
    # ``unlink`` of something that is not a path is not known to delete a file.
    assert _calls("conn.unlink()\nos.path.join('a', 'b')\n") == []


def test_tests_reading_the_file_system():
    t = probe(HEAD + "a = os.path.exists('x')\nb = Path('x').is_dir()\nc = flag and n > 0\n")
    values = [s.body[0].value for s in t.module.body if isinstance(s, cst.SimpleStatementLine)
              and isinstance(s.body[0], cst.Assign)]
    assert [reads_file_system(t, v) for v in values] == [True, True, False]


def _unit(source: str, call: str) -> tuple[str, bool]:
    t = probe(HEAD + source)
    node = find(t, m.Call(), call)
    stmt = t.enclosing_statement(node)
    assert stmt is not None
    unit, barrier = deletion_unit(t, stmt)
    return code(t, unit).splitlines()[0], barrier


def test_the_existence_test_or_file_loop_goes_with_the_deletion():
    assert _unit("if os.path.exists('d'):\n    shutil.rmtree('d')\n", "shutil.rmtree('d')") == (
        "if os.path.exists('d'):", True
    )
    assert _unit("for f in glob.glob('*.pt'):\n    os.remove(f)\n", "os.remove(f)") == (
        "for f in glob.glob('*.pt'):", True
    )
    # A test that does not read the file system stays where it is; the ranks agree on it.
    assert _unit("if clean:\n    shutil.rmtree('d')\n", "shutil.rmtree('d')") == (
        "shutil.rmtree('d')", True
    )


def test_no_barrier_where_the_ranks_may_not_all_get():
    # In a loop, an except or under a file-system test that must stay (it binds a name read later).
    assert _unit("for e in range(3):\n    shutil.rmtree('d')\n", "shutil.rmtree('d')")[1] is False
    assert _unit(
        "try:\n    x = 1\nexcept OSError:\n    shutil.rmtree('d')\n", "shutil.rmtree('d')"
    )[1] is False
    assert _unit(
        "if os.path.exists('d'):\n    shutil.rmtree('d')\n    gone = True\nprint(gone)\n",
        "shutil.rmtree('d')",
    ) == ("shutil.rmtree('d')", False)


def test_no_barrier_in_a_function_called_in_a_loop():
    source = (
        "def rotate(path):\n    if os.path.exists(path):\n        os.remove(path)\n"
        "for epoch in range(3):\n    if improved:\n        rotate('best.pt')\n"
    )
    assert _unit(source, "os.remove(path)") == ("if os.path.exists(path):", False)
    once = "def clean():\n    shutil.rmtree('d')\nclean()\n"
    assert _unit(once, "shutil.rmtree('d')") == ("shutil.rmtree('d')", True)
