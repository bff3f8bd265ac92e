"""The result cache (``sdp_convert.cache``), through the real command line and through its API.

Each test gets its own empty cache directory (``conftest.py`` sets ``SDP_CONVERT_CACHE_DIR``);
the subprocesses started here inherit it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time
import typing
from pathlib import Path

import pytest
from sdp_convert.cache import Cache, Entry, code_identity, options_key
from sdp_convert.changes import Change
from sdp_convert.options import Options

from .test_cli import NOT_TRAINING, SDP_CONVERT, TRAIN, UNSHARDED, sdp, write


def cache_dir() -> Path:
    return Path(os.environ["SDP_CONVERT_CACHE_DIR"])


def stored() -> list[Path]:
    """Every file in the cache: conversions and the whole-program check's views of files."""
    return [p for p in cache_dir().rglob("*") if p.is_file()]


def is_conversion(path: Path) -> bool:
    """A conversion's entry, not a view of the whole-program check (nor a temporary file)."""
    try:
        return "changed" in meta_of(path)
    except ValueError:  # the view of a file that does not parse
        return False


def entries() -> list[Path]:
    """The conversions' entries (the views the whole-program check keeps are not)."""
    return [p for p in stored() if p.name.startswith(".") or is_conversion(p)]


def tree(root: Path) -> Path:
    write(root / "train.py", TRAIN)
    write(root / "unsharded.py", UNSHARDED)  # unchanged... or converted, with a manual note
    write(root / "notes.py", NOT_TRAINING)
    write(root / "broken.py", "import torch\ndef f(:\n")
    return root


def meta_of(entry: Path) -> dict:
    """An entry's metadata: the line after its digest."""
    return json.loads(entry.read_bytes().split(b"\n", 2)[1])


def seen(out: subprocess.CompletedProcess) -> tuple[int, bytes, bytes]:
    return out.returncode, out.stdout, out.stderr


def test_a_warm_run_reports_exactly_what_a_cold_run_reports(tmp_path):
    src = tree(tmp_path / "src")
    for args in (["--check", "--diff"], ["--report", "-", "--report-format", "json", "--check"],
                 ["--diff", "--report", "-", "--report-format", "github"]):
        cold = sdp(*args, str(src))
        assert entries(), "nothing was remembered"
        warm = sdp(*args, str(src))
        assert seen(warm) == seen(cold), args
    assert b"(manual)" in cold.stderr or b'"manual": true' in cold.stdout
    report = json.loads(sdp("--check", "--report", "-", "--report-format", "json",
                            str(src)).stdout)
    assert {f["path"].rsplit("/", 1)[1]: f["status"] for f in report["files"]} == {
        "broken.py": "failed", "notes.py": "unchanged", "train.py": "converted",
        "unsharded.py": report["files"][3]["status"],
    }
    with_no_cache = sdp("--check", "--diff", "--no-cache", str(src))
    assert seen(with_no_cache) == seen(sdp("--check", "--diff", str(src)))


def test_a_warm_run_does_not_load_the_converter(tmp_path):
    src = tree(tmp_path / "src")
    sdp("--check", str(src))
    probe = (
        "import sys\nfrom sdp_convert.cli import main\n"
        f"code = main(['--check', '-q', {str(src)!r}])\n"
        "print(code, 'libcst' in sys.modules, 'sdp_convert.engine' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120)
    # broken.py is remembered with its syntax error: nothing needs the converter.
    assert out.stdout.split() == ["2", "False", "False"], out.stderr


def test_a_warm_run_reads_no_file_again_for_the_whole_program_check(tmp_path):
    """The contract's answers for a run are remembered too (keyed on every text it reads): a
    warm run gives the same report (its contract findings included) without checking the program
    again; an edit to any file of it makes the check run again."""
    src = tree(tmp_path / "src")
    args = ["--check", "--report", "-", "--report-format", "json", str(src)]
    cold = sdp(*args)
    assert b'"contract"' in cold.stdout  # the entry point's parts are in the report
    probe = (
        "import json, sys\nimport sdp_convert.runner as r\n"
        "def checked_again(*a, **k):\n    raise AssertionError('checked again')\n"
        "r._check_program = checked_again\n"
        "from sdp_convert.cli import main\n"
        f"sys.exit(main({args!r}))\n"
    )
    warm = subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=120)
    assert b"whole-program check could not run" not in warm.stderr, warm.stderr
    assert seen(warm) == seen(cold)
    # An edit is read again.
    write(src / "unsharded.py", UNSHARDED + "\n# edited\n")
    again = subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=120)
    assert b"whole-program check could not run (AssertionError: checked again)" in again.stderr


def test_an_edit_between_runs_is_seen(tmp_path):
    script = write(tmp_path / "train.py", NOT_TRAINING)
    assert sdp("--check", str(script)).returncode == 0
    write(script, TRAIN)
    out = sdp("--check", str(script))
    assert out.returncode == 1 and b"[wrap_model_ddp]" in out.stderr
    # Same size, same modification time, different content: still seen (content is the key).
    before = script.stat()
    write(script, TRAIN.replace("lr=0.1", "lr=0.2"))
    os.utime(script, ns=(before.st_atime_ns, before.st_mtime_ns))
    out = sdp("--diff", str(script))
    assert b"lr=0.2 * sdp.size()" in out.stdout


def test_options_that_change_the_output_are_in_the_key(tmp_path):
    script = write(tmp_path / "train.py", TRAIN)
    linear = sdp("--diff", str(script)).stdout
    none = sdp("--diff", "--lr-scaling", "none", str(script)).stdout
    assert b"sdp.size()" in linear and b"lr=0.1 * sdp.size()" not in none
    assert sdp("--diff", "--skip", "wrap_model_ddp", str(script)).stdout.count(
        b"DistributedDataParallel") == 0


def test_writing_from_a_cached_result_writes_the_conversion(tmp_path):
    fresh = write(tmp_path / "fresh" / "train.py", TRAIN)
    assert sdp("--no-cache", str(fresh)).returncode == 0
    assert not stored()
    script = write(tmp_path / "cached" / "train.py", TRAIN)
    assert sdp("--check", str(script)).returncode == 1  # remembered, not written
    assert script.read_text() == TRAIN
    out = sdp(str(script))
    assert out.returncode == 0 and b"[wrap_model_ddp]" in out.stderr
    assert script.read_bytes() == fresh.read_bytes()
    # The written file is converted once more (a new content), and found to be a fixed point.
    assert sdp("--check", str(script)).returncode == 0


def test_cache_false_in_the_configuration_turns_it_off(tmp_path):
    write(tmp_path / "pyproject.toml", "[tool.sdp-convert]\ncache = false\n")
    script = write(tmp_path / "train.py", TRAIN)
    assert sdp("--check", str(script)).returncode == 1
    assert not stored()
    assert sdp("--check", "--cache", str(script)).returncode == 1
    assert entries()
    write(tmp_path / "pyproject.toml", "[tool.sdp-convert]\ncache = 'no'\n")
    out = sdp("--check", str(script))
    assert out.returncode == 2 and b"cache: must be true or false" in out.stderr


@pytest.mark.timeout(300)
def test_concurrent_parallel_runs_share_the_cache_safely(tmp_path):
    src = tmp_path / "src"
    for i in range(12):
        write(src / f"t{i:02d}.py", f"# script {i}\n{TRAIN}")
        write(src / f"u{i:02d}.py", f"# script {i}\n{UNSHARDED}")
        write(src / f"n{i:02d}.py", f"# module {i}\n{NOT_TRAINING}")
    expected = seen(sdp("--check", "--diff", "--no-cache", "-j", "1", str(src)))
    args = [SDP_CONVERT, "--check", "--diff", "-j", "2", str(src)]
    runs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for _ in range(2)]
    results = []
    for proc in runs:
        out, err = proc.communicate(timeout=240)
        results.append((proc.returncode, out, err))
    assert results == [expected, expected]
    assert len(entries()) == 36
    # and the whole-program check's answers for the run (one entry: the run's texts are its key)
    assert len(stored()) == 36 + 1
    assert not [p for p in stored() if p.name.startswith(".")], "temporary files left"
    assert seen(sdp("--check", "--diff", "-j", "2", str(src))) == expected


def test_a_damaged_entry_is_recomputed(tmp_path):
    script = write(tmp_path / "train.py", TRAIN)
    cold = seen(sdp("--check", "--diff", str(script)))
    # The script's entry (the other one is its conversion's, "nothing to change").
    (entry,) = [e for e in entries() if meta_of(e)["changed"]]
    entry.write_bytes(entry.read_bytes()[:40])
    assert seen(sdp("--check", "--diff", str(script))) == cold
    entry.write_bytes(b"")
    assert seen(sdp("--check", "--diff", str(script))) == cold


def test_stdin_is_answered_from_the_cache_too(tmp_path):
    first = sdp("-", stdin=TRAIN.encode())
    assert len(entries()) == 2  # the source's, and its conversion's
    assert seen(sdp("-", stdin=TRAIN.encode())) == seen(first)
    assert seen(sdp("-", stdin=first.stdout)) == seen(sdp("--no-cache", "-", stdin=first.stdout))
    assert len(entries()) == 2


# -- a conversion's output ----------------------------------------------------------------


def _check_in_process(*args: str, cwd: Path | None = None) -> tuple[str, bool]:
    """``main(['--check', *args])`` in a fresh interpreter: (exit code, whether it loaded
    libcst), with its report on stderr as the command prints it."""
    probe = (
        "import sys\nfrom sdp_convert.cli import main\n"
        f"code = main(['--check', *{list(args)!r}])\n"
        "print(code, 'libcst' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120, cwd=cwd)
    code, loaded = out.stdout.split()
    return code, loaded == "True"


@pytest.mark.parametrize("first", [[], ["--check"], ["--diff"]], ids=["write", "check", "diff"])
def test_a_converted_file_is_answered_from_the_cache(tmp_path, first):
    """A run that converts a file (writing it, or only computing it with --check / --diff)
    remembers its output as a file with nothing to change: the next run over the converted file
    reports what a run without the cache reports, without loading the converter."""
    script = write(tmp_path / "alone" / "train.py", TRAIN)
    assert sdp(*first, str(script)).returncode == (1 if first == ["--check"] else 0)
    if first:  # the user converts it later: that run is answered from the cache
        assert script.read_text() == TRAIN
        assert sdp("-q", str(script)).returncode == 0
    assert "sdp_runtime" in script.read_text()
    # The converted file is a new text: the whole-program check of it runs once (and is
    # remembered), then nothing loads the converter.
    assert _check_in_process(str(script))[0] == "0"
    assert _check_in_process(str(script)) == ("0", False)
    args = ("--diff", "--report", "-", "--report-format", "json", str(script))
    assert seen(sdp("--check", *args)) == seen(sdp("--check", "--no-cache", *args))
    assert b'"status": "unchanged"' in sdp("--check", *args).stdout


def test_in_project_mode_a_converted_file_is_not_remembered(tmp_path):
    """Files with Python neighbours are a project: a file's key holds a digest of them and of
    itself, and its facts follow from their contents, which writing it changes. The run over the
    converted file converts it again (and reports what a run without the cache reports)."""
    script = write(tmp_path / "proj" / "train.py", TRAIN)
    write(tmp_path / "proj" / "notes.py", NOT_TRAINING)
    assert sdp(str(script)).returncode == 0
    assert len(entries()) == 1
    assert _check_in_process(str(script)) == ("0", True)
    assert seen(sdp("--check", str(script))) == seen(sdp("--check", "--no-cache", str(script)))


# -- the key --------------------------------------------------------------------------------


def _other_value(field: dataclasses.Field, value: object) -> object:
    """A value of the field's type different from ``value``."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, str):
        hint = typing.get_type_hints(Options, localns={"ModuleFacts": object})[field.name]
        choices = [c for c in typing.get_args(hint) if c != value]
        return choices[0] if choices else value + "x"
    if isinstance(value, int):
        return value + 1
    if isinstance(value, frozenset):
        return value | {"wrap_model_ddp"}
    raise AssertionError(f"Options.{field.name}: teach this test a value of its type")


def test_every_option_field_is_in_the_key():
    cache = Cache("unused")
    base = Options()
    key = cache.key(b"x = 1\n", "a.py", base)
    for field in dataclasses.fields(Options):
        if not field.metadata.get("cache_key", True):
            # Facts derived from other files (project mode): the runner keys on those files.
            assert field.name == "project" and field.name not in options_key(base)
            continue
        other = dataclasses.replace(base, **{field.name: _other_value(
            field, getattr(base, field.name))})
        assert field.name in options_key(other)
        assert cache.key(b"x = 1\n", "a.py", other) != key, field.name


def test_content_name_and_dependency_digests_are_in_the_key():
    cache = Cache("unused")
    key = cache.key(b"x = 1\n", "a.py", Options())
    assert cache.key(b"x = 2\n", "a.py", Options()) != key
    assert cache.key(b"x = 1\n", "a.ipynb", Options()) != key
    assert cache.key(b"x = 1\n", "b.py", Options()) == key  # content, not path
    with_dep = cache.key(b"x = 1\n", "a.py", Options(), deps=["digest-of-data.py"])
    assert with_dep != key
    assert cache.key(b"x = 1\n", "a.py", Options(), deps=["digest-of-data.py-edited"]) != with_dep


def test_a_changed_converter_file_changes_the_code_identity(tmp_path):
    package = tmp_path / "sdp_convert"
    write(package / "transforms" / "wrap_model_ddp.py", "A = 1\n")
    write(package / "engine.py", "B = 2\n")
    first = code_identity(str(package))
    code_identity.cache_clear()
    assert code_identity(str(package)) == first  # stable while nothing changes
    code_identity.cache_clear()
    transform = package / "transforms" / "wrap_model_ddp.py"
    transform.write_text("A = 3\n")  # same size
    os.utime(transform, ns=(time.time_ns(), time.time_ns() + 1_000_000_000))
    assert code_identity(str(package)) != first
    code_identity.cache_clear()
    assert code_identity() != first  # the real package: another set of files


def test_an_edited_transform_is_not_answered_from_the_cache(tmp_path):
    """An editable install whose code changes between runs (same version string)."""
    import sdp_convert

    package = tmp_path / "pkg"
    shutil.copytree(Path(sdp_convert.__file__).parent, package / "sdp_convert",
                    ignore=shutil.ignore_patterns("__pycache__"))
    script = write(tmp_path / "train.py", TRAIN)
    env = {**os.environ, "PYTHONPATH": str(package)}
    run = [sys.executable, "-m", "sdp_convert", "--check", str(script)]
    first = subprocess.run(run, capture_output=True, text=True, timeout=120, env=env)
    assert first.returncode == 1 and "[wrap_model_ddp]" in first.stderr
    transform = package / "sdp_convert" / "transforms" / "wrap_model_ddp.py"
    text = transform.read_text()
    assert 'FRAMEWORKS = frozenset({"torch"})' in text
    transform.write_text(text.replace('FRAMEWORKS = frozenset({"torch"})',
                                      "FRAMEWORKS = frozenset()"))
    second = subprocess.run(run, capture_output=True, text=True, timeout=120, env=env)
    assert second.returncode == 1 and "[wrap_model_ddp]" not in second.stderr, second.stderr


def test_the_cache_is_bounded(tmp_path):
    cache = Cache(tmp_path / "c", max_entries=20, max_bytes=10_000)
    entry = Entry(False, b"", "torch", "", (Change(1, 1, "t", "m"),))
    keys = [cache.key(f"x = {i}\n".encode(), "a.py", Options()) for i in range(30)]
    for i, key in enumerate(keys):
        assert cache.put(key, entry)
        stamp = 1_000_000_000 + i
        os.utime(cache.dir / key[:2] / key, (stamp, stamp))
    assert cache.prune() == 14  # down to 80% of the bound, oldest first
    kept = {p.name for p in (tmp_path / "c").rglob("*") if p.is_file()}
    assert kept == set(keys[14:])
    assert cache.get(keys[-1], b"x = 29\n") == dataclasses.replace(entry, output=b"x = 29\n")
    assert cache.get(keys[0], b"x = 0\n") is None
    big = Cache(tmp_path / "c", max_entries=1000, max_bytes=200)
    assert big.prune() > 0
    assert sum(p.stat().st_size for p in (tmp_path / "c").rglob("*") if p.is_file()) <= 160


PROJECT = Path(__file__).resolve().parents[1] / "fixtures" / "projects" / "torch_main_data_model"


def test_a_project_file_is_not_answered_from_the_cache_after_a_module_it_reads_changed(tmp_path):
    """main.py given alone reads data.py (project mode): data.py's loader is not sharded in this
    run, so main.py's rate stays with a note. Once data.py has its sampler (converted), main.py
    alone is converted fully: main.py's bytes did not change, the cache must still not answer."""
    src = tmp_path / "proj"
    shutil.copytree(PROJECT / "input", src)
    before = sdp("--diff", "main.py", cwd=src)
    assert b"lr=args.lr * sdp.size()" not in before.stdout and b"(manual)" in before.stderr
    assert seen(sdp("--diff", "main.py", cwd=src)) == seen(before)  # warm: the same answer
    assert entries()
    shutil.copy(PROJECT / "expected" / "data.py", src / "data.py")
    after = sdp("--diff", "main.py", cwd=src)
    assert seen(after) == seen(sdp("--diff", "--no-cache", "main.py", cwd=src))
    assert b"sdp.size()" in after.stdout and seen(after) != seen(before)


def test_a_failure_converting_the_output_does_not_fail_the_file(tmp_path, monkeypatch):
    """Remembering the output is an optimisation: if converting the output raised, the file's
    own outcome stands and nothing is remembered for the output."""
    from sdp_convert import runner

    script = write(tmp_path / "train.py", TRAIN)
    real, calls = runner.convert_bytes, []

    def second_call_raises(data, name, options):
        calls.append(data)
        if len(calls) == 2:
            raise RecursionError("deep")
        return real(data, name, options)

    monkeypatch.setattr(runner, "convert_bytes", second_call_raises)
    config = runner.Config(Options(), "check", cache_dir=str(cache_dir()))
    outcome = runner.process(runner.Job(script, "train.py", script), config)
    assert outcome is not None and outcome.status == "converted", outcome
    assert len(calls) == 2 and calls[1] != calls[0]
    assert len(entries()) == 1


# -- trust: what the cache says is never written into a user's file ----------------------------

EVIL = b"import os\nos.system('echo owned')\n"


def _plant(entry: Path, output: bytes) -> None:
    """Replace a ``changed`` entry's output by ``output``, with a digest that matches: what
    someone who can compute the key (it is public: the file's bytes, the options, the
    installed package) would write."""
    meta = meta_of(entry)
    meta["size"] = len(output)
    body = json.dumps(meta).encode() + b"\n" + output
    entry.write_bytes(hashlib.sha256(body).hexdigest().encode() + b"\n" + body)


def test_a_planted_entry_never_reaches_the_users_file(tmp_path):
    script = write(tmp_path / "train.py", TRAIN)
    expected = tmp_path / "expected.py"
    write(expected, TRAIN)
    assert sdp("--no-cache", str(expected)).returncode == 0
    assert sdp("--check", str(script)).returncode == 1  # fills the cache, writes nothing
    (entry,) = [e for e in entries() if meta_of(e)["changed"]]
    _plant(entry, EVIL)
    # --check and --diff may answer from the cache (they write nothing) ...
    assert b"os.system" in sdp("--diff", str(script)).stdout
    # ... but writing converts again: the file gets the real conversion.
    out = sdp(str(script))
    assert out.returncode == 0, out.stderr
    assert script.read_bytes() == expected.read_bytes()
    assert b"os.system" not in script.read_bytes()
    # stdin to stdout (an editor's buffer) too.
    piped = sdp("-", stdin=TRAIN.encode())
    assert piped.stdout == expected.read_bytes()


def test_a_flipped_byte_is_a_miss(tmp_path):
    script = write(tmp_path / "train.py", TRAIN)
    cold = seen(sdp("--check", "--diff", str(script)))
    (entry,) = [e for e in entries() if meta_of(e)["changed"]]
    raw = bytearray(entry.read_bytes())
    at = raw.index(b"scheduler.step()") if b"scheduler.step()" in raw else len(raw) - 3
    raw[at] ^= 0x20  # one bit: "scheduleR.step()" would still parse
    entry.write_bytes(bytes(raw))
    assert seen(sdp("--check", "--diff", str(script))) == cold
    raw = bytearray(entry.read_bytes())
    raw[70] ^= 0x01  # in the metadata this time
    entry.write_bytes(bytes(raw))
    assert seen(sdp("--check", "--diff", str(script))) == cold
    out = sdp(str(script))
    assert out.returncode == 0
    assert seen(sdp("--no-cache", "--check", str(script)))[0] == 0


def test_the_cache_is_private_and_untrusted_entries_are_ignored(tmp_path):
    root = tmp_path / "private-cache"
    script = write(tmp_path / "train.py", TRAIN)
    cold = seen(sdp("--check", "--diff", "--cache-dir", str(root), str(script)))
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    for path in root.rglob("*"):
        want = 0o700 if path.is_dir() else 0o600
        assert stat.S_IMODE(path.stat().st_mode) == want, path
    assert not stored(), "--cache-dir wins over $SDP_CONVERT_CACHE_DIR"
    (entry,) = [e for e in root.rglob("*")
                if e.is_file() and is_conversion(e) and meta_of(e)["changed"]]
    _plant(entry, b"import torch\nEVIL = 1\n")
    # A group-writable entry, or one in a group-writable shard directory, is not read: the
    # run answers what a fresh conversion answers, not the planted text.
    entry.chmod(0o664)
    assert seen(sdp("--check", "--diff", "--cache-dir", str(root), str(script))) == cold
    entry.chmod(0o600)
    entry.parent.chmod(0o770)
    assert seen(sdp("--check", "--diff", "--cache-dir", str(root), str(script))) == cold
    entry.parent.chmod(0o700)
    root.chmod(0o777)
    assert seen(sdp("--check", "--diff", "--cache-dir", str(root), str(script))) == cold
    root.chmod(0o700)
    if os.getuid() == 0:  # another user's entry, where we may give one away
        _plant(entry, b"import torch\nEVIL = 1\n")
        os.chown(entry, 65534, 65534)
        assert seen(sdp("--check", "--diff", "--cache-dir", str(root), str(script))) == cold
        entry.unlink()
        sdp("--check", "--cache-dir", str(root), str(script))
    _plant(entry, b"import torch\nEVIL = 1\n")  # the run with a private entry rewrote it
    assert b"EVIL" in sdp("--check", "--diff", "--cache-dir", str(root), str(script)).stdout, (
        "the planted entry is read once its directories are private again: the checks above "
        "are what kept it out"
    )


def test_an_entry_owned_by_another_user_is_ignored(tmp_path, monkeypatch):
    cache = Cache(tmp_path / "c")
    key = cache.key(b"x = 1\n", "a.py", Options())
    assert cache.put(key, Entry(True, b"x = 2\n", "torch", "", ()))
    assert cache.get(key, b"x = 1\n") is not None
    real = os.getuid()
    with monkeypatch.context() as patch:
        patch.setattr(os, "getuid", lambda: real + 1)  # the files now belong to "someone else"
        assert cache.get(key, b"x = 1\n") is None
        assert not cache.put(key, Entry(True, b"x = 3\n", "torch", "", ()))
    assert cache.get(key, b"x = 1\n") is not None
