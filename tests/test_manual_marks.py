"""Manual notes stay in the file (``sdp_convert.manual_marks``), through the real command line:
a converted file carries ``# sdp-convert: manual - ...`` comments that every later run reports,
``--check`` fails on them unless allowed, ``-q`` never hides them, and the file is a fixed point.
"""

from __future__ import annotations

from sdp_convert import manual_marks
from sdp_convert.changes import Change

from .test_cli import UNSHARDED, sdp, write

NOTE = b"# sdp-convert: manual - "


def test_manual_notes_are_reported_by_every_later_run(tmp_path):
    script = write(tmp_path / "train.py", UNSHARDED)
    first = sdp(str(script))
    assert first.returncode == 0, first.stderr
    firsts = [ln for ln in first.stderr.splitlines() if b"(manual)" in ln]
    assert len(firsts) == 2
    converted = script.read_bytes()
    assert converted.count(NOTE) == 2
    # Each comment sits on its own line right above the statement it is about.
    lines = converted.splitlines()
    above = {lines[i + 1].strip().split(b"(")[0] for i, ln in enumerate(lines) if NOTE in ln}
    assert above == {b"opt = torch.optim.SGD", b"loss.backward"}

    again = sdp(str(script))  # the pre-commit rewrite hook's second run
    assert again.returncode == 0
    assert script.read_bytes() == converted, "a converted file is a fixed point"
    assert again.stderr.count(b"[manual_marker] (manual)") == 2
    assert b"2 manual items" in again.stderr

    check = sdp("--check", str(script))
    assert check.returncode == 1
    assert check.stderr.count(b"[manual_marker] (manual)") == 2
    assert b"--allow-manual-markers" in check.stderr
    assert sdp("--check", "--allow-manual-markers", str(script)).returncode == 0
    (tmp_path / "pyproject.toml").write_text("[tool.sdp-convert]\nallow-manual-markers = true\n")
    assert sdp("--check", str(script)).returncode == 0

    quiet = sdp("-q", "--check", "--allow-manual-markers", str(script))
    assert quiet.stderr.count(b"(manual)") == 2, "-q hides changes, never manual items"

    # The person deletes the comments without splitting the data: the whole-program check,
    # which runs every time and is never written into the file, still says so, and --check
    # still fails (issue 38: a hook that passes while work is left is a gap).
    script.write_bytes(b"".join(ln + b"\n" for ln in lines if NOTE not in ln))
    (tmp_path / "pyproject.toml").unlink()
    done = sdp("--check", str(script))
    assert done.returncode == 1, done.stderr
    assert b"[manual_marker]" not in done.stderr
    assert done.stderr.count(b"[contract] (manual)") == 1 and b"[data]" in done.stderr
    assert b"a program's contract does not hold" in done.stderr
    assert sdp("--check", "--allow-manual-markers", str(script)).returncode == 0
    assert NOTE not in script.read_bytes()


def test_quiet_still_prints_the_manual_items_of_a_conversion(tmp_path):
    script = write(tmp_path / "train.py", UNSHARDED)
    out = sdp("-q", str(script))
    assert out.stderr.count(b"(manual)") == 2
    assert b"[wrap_model_ddp]" not in out.stderr  # the edits are what -q hides


def test_a_marker_in_a_string_is_not_a_manual_item():
    data = b'x = """\n# sdp-convert: manual - not a comment\n"""\n# sdp-convert: manual - do it\n'
    (found,) = manual_marks.read(data)
    assert (found.line, found.col, found.manual) == (4, 1, True)
    assert found.message.startswith("do it")


def test_the_comment_goes_above_the_whole_statement_never_inside_it():
    source = b"x = f(\n    a,\n    b,\n)\nif x:\n    y = '''\nz\n'''\n"
    output = b"import q\n" + source
    notes = [Change(3, 5, "t", "about b", manual=True), Change(7, 1, "t", "in a string", True)]
    marked = manual_marks.write(source, output, notes)
    compile(marked, "<marked>", "exec")
    assert marked == (b"import q\n# sdp-convert: manual - about b\nx = f(\n    a,\n    b,\n)\n"
                      b"if x:\n    # sdp-convert: manual - in a string\n    y = '''\nz\n'''\n")
    # Converting again does not write them twice.
    assert manual_marks.write(source, marked, notes) == marked
