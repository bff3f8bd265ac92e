"""Ecosystem check: sdp-convert over a pinned list of public training projects, as ruff's ecosystem
check and mypy_primer do for theirs.

``benchmarks/ecosystem.toml`` pins each project (repository, 40-hex commit, the paths given to the
converter, the entry points, a one-line description). For each one this script exports that
commit's tree from a local git mirror into a scratch directory, runs the real command line
(``sdp-convert PATHS --report R.json --report-format json --no-cache -j 1``, in place, in the
scratch copy) and records, per program: each file's status, the contract of each entry point
(its parts and their states), the manual items (transform, message, file:line), counts (changes,
notes, manual notes, contract parts missing / unknown, duplicates) and what automatic checks find
wrong in the report itself:

* ``holds-vs-note``: a contract part that holds while a manual note of the same conversion, in a
  module the entry runs, says the thing that part relies on was not found or not done;
* ``note-vs-note``: two lines that contradict each other (a "not split" note and a sharding edit
  at one place; "no DataLoader feeding this training loop was found" in a module while another
  line names the loader that feeds the training there);
* ``edit-vs-note``: an edit and a line of the same file that say opposite things of one object
  (a model wrapped, a tape or optimizer made to average, and "not averaged" or "not wrapped" of
  that model; a write kept to rank 0 and "run it on rank 0 only" at its line);
* ``status-vs-contract``: an entry counted converted (or unchanged) without attention while its
  program's contract fails;
* ``duplicates``: the same note twice at one place (reported apart, not as contradictions).

Results: ``benchmarks/results/ecosystem.json`` (per program, machine-readable) and
``benchmarks/results/ecosystem.md`` (a table, with the reviewed verdicts of
``benchmarks/ecosystem_verdicts.toml`` merged in and totalled). A verdict names the digest of the
output it was given for; when a later run's output differs, the table shows the verdict as stale
(to be reviewed again) and leaves it out of the totals.

Nothing fetched is kept in this repository: the trees, their converted copies, the diffs and the
raw reports stay in the scratch directory (``--workdir``, default ``$TMPDIR/sdp-ecosystem``),
where a reviewer reads them (``NAME/diff.patch``, ``NAME/report.json``, ``NAME/stderr.txt``).

Usage::

    .venv/bin/python benchmarks/ecosystem.py run [--out F.json] [--only NAME ...] [--jobs N]
    .venv/bin/python benchmarks/ecosystem.py report F.json [--md F.md]
    .venv/bin/python benchmarks/ecosystem.py compare OLD.json NEW.json

The mirrors are bare git directories ``<mirror>/<owner>+<name>/repo`` (what the project's
``fetch`` tool brings in; ``--mirror DIR``, default ``$SDP_ECOSYSTEM_MIRROR`` or
``/work/.mirror``); ``--clone`` clones a missing one from GitHub instead. One program is
converted at a time, by one converter process, unless ``--jobs`` says otherwise.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import difflib
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = None  # type: ignore[assignment]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LIST = HERE / "ecosystem.toml"
VERDICTS = HERE / "ecosystem_verdicts.toml"
RESULTS = HERE / "results"
SDP_CONVERT = str(Path(sys.executable).with_name("sdp-convert"))
MIRROR = Path(os.environ.get("SDP_ECOSYSTEM_MIRROR", "/work/.mirror"))

PARTS = ("init", "averaging", "data", "state", "writes")
VERDICT_KINDS = ("right", "flagged", "wrong-silent", "false-report")
#: How a contract state shows in the table.
STATE_MARK = {"holds": "+", "noted": "n", "missing": "-", "unknown": "?", "n/a": "."}
PART_LETTER = {"init": "I", "averaging": "A", "data": "D", "state": "S", "writes": "W"}


# -- the list -------------------------------------------------------------------------------------


@dataclass
class Project:
    name: str
    repository: str  # owner/name
    commit: str
    paths: list[str]
    entries: list[str]
    description: str
    kind: str = ""
    #: Paths of the tree to export (default: all of it).
    export: list[str] = field(default_factory=list)
    #: Further sdp-convert arguments.
    args: list[str] = field(default_factory=list)


def _read_toml(path: Path) -> dict[str, Any]:
    if tomllib is None:
        raise SystemExit("ecosystem.py needs Python 3.11 or later (tomllib)")
    with path.open("rb") as f:
        return tomllib.load(f)


def load_projects(path: Path = LIST) -> list[Project]:
    """The pinned list; each entry is checked for the fields it must have."""
    projects = []
    for raw in _read_toml(path).get("project", []):
        missing = [k for k in ("name", "repository", "commit", "paths", "entries", "description")
                   if k not in raw]
        if missing:
            raise SystemExit(f"{path}: project {raw.get('name', '?')} lacks {', '.join(missing)}")
        if not re.fullmatch(r"[0-9a-f]{40}", raw["commit"]):
            raise SystemExit(f"{path}: {raw['name']}: commit must be 40 hex digits")
        projects.append(Project(**raw))
    names = [p.name for p in projects]
    dup = [n for n, c in Counter(names).items() if c > 1]
    if dup:
        raise SystemExit(f"{path}: names used twice: {', '.join(dup)}")
    return projects


# -- bringing a project in ----------------------------------------------------------------------


def git_dir(repository: str, mirror: Path) -> Path | None:
    """The local mirror of ``owner/name``, or None."""
    base = mirror / repository.replace("/", "+")
    for candidate in (base / "repo", base / "repo" / ".git", base):
        if (candidate / "HEAD").is_file() and (candidate / "objects").is_dir():
            return candidate
    return None


def clone(repository: str, mirror: Path) -> Path:
    dest = mirror / repository.replace("/", "+") / "repo"
    dest.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "clone", "--bare", "--quiet", f"https://github.com/{repository}",
                    str(dest)], check=True, timeout=1800)
    return dest


def export_tree(gitdir: Path, commit: str, dest: Path, paths: list[str] = ()) -> list[str]:
    """Write the tree of ``commit`` (under ``paths``, default all of it) into ``dest``, as
    ``git archive`` would; blobs the mirror lacks (snapshots leave out files of 4 MiB and more)
    are skipped and returned."""
    listing = subprocess.run(["git", "--git-dir", str(gitdir), "ls-tree", "-r", "-z", commit,
                              "--", *paths], capture_output=True, timeout=600)
    if listing.returncode != 0:
        raise RuntimeError(f"git ls-tree {commit}: {listing.stderr.decode(errors='replace')}")
    items = []
    for rec in listing.stdout.split(b"\0"):
        if not rec:
            continue
        meta, name = rec.split(b"\t", 1)
        mode, kind, sha = meta.decode().split()
        if kind == "blob":
            items.append((mode, sha, name.decode(errors="surrogateescape")))
    batch = subprocess.run(["git", "--git-dir", str(gitdir), "cat-file", "--batch"],
                           input="".join(f"{sha}\n" for _, sha, _ in items).encode(),
                           capture_output=True, timeout=1800)
    data, pos, missing = batch.stdout, 0, []
    dest.mkdir(parents=True, exist_ok=True)
    for mode, _sha, name in items:
        end = data.index(b"\n", pos)
        header = data[pos:end].decode().split()
        pos = end + 1
        if len(header) < 3 or header[1] != "blob":
            missing.append(name)
            continue
        size = int(header[2])
        content = data[pos:pos + size]
        pos += size + 1
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if mode == "120000":
            target.symlink_to(content.decode(errors="surrogateescape"))
        else:
            target.write_bytes(content)
            if mode == "100755":
                target.chmod(0o755)
    return missing


# -- running the converter ----------------------------------------------------------------------


def _run(cmd: list[str], cwd: Path, timeout: float) -> tuple[int, str, str, bool]:
    """Run ``cmd`` in its own process group; on timeout kill the whole group."""
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"), False
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return -9, out.decode(errors="replace"), err.decode(errors="replace"), True


def converter_identity(exe: str) -> dict[str, Any]:
    """The converter's version and, where it runs from a git checkout, its commit."""
    ident: dict[str, Any] = {"executable": exe}
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        ident["version"] = subprocess.run([exe, "--version"], capture_output=True, text=True,
                                          timeout=120).stdout.strip()
    source = Path(exe).resolve().parent.parent.parent  # <checkout>/.venv/bin/sdp-convert
    if (source / ".git").exists():
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            head = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"],
                                  capture_output=True, text=True, timeout=60).stdout.strip()
            dirty = subprocess.run(["git", "-C", str(source), "status", "--porcelain",
                                    "--untracked-files=no", "rewriter"],
                                   capture_output=True, text=True, timeout=60).stdout.strip()
            ident.update(commit=head, dirty=bool(dirty))
    return ident


def _source_files(root: Path) -> dict[str, Path]:
    return {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*"))
            if p.is_file() and p.suffix in (".py", ".ipynb")}


def tree_diff(before: Path, after: Path) -> tuple[str, dict[str, tuple[int, int]]]:
    """A unified diff of the Python files and notebooks, and (added, removed) lines per file."""
    old, new = _source_files(before), _source_files(after)
    chunks, stats = [], {}
    for rel in sorted(set(old) | set(new)):
        a = old[rel].read_text(errors="replace").splitlines(True) if rel in old else []
        b = new[rel].read_text(errors="replace").splitlines(True) if rel in new else []
        if a == b:
            continue
        lines = list(difflib.unified_diff(a, b, f"a/{rel}", f"b/{rel}"))
        chunks.append("".join(ln if ln.endswith("\n") else ln + "\n" for ln in lines))
        added = sum(1 for ln in lines if ln.startswith("+") and not ln.startswith("+++"))
        removed = sum(1 for ln in lines if ln.startswith("-") and not ln.startswith("---"))
        stats[rel] = (added, removed)
    return "".join(chunks), stats


def convert_project(project: Project, exe: str, mirror: Path, workdir: Path, *,
                    jobs: int = 1, timeout: float = 900, allow_clone: bool = False
                    ) -> dict[str, Any]:
    """Export, convert in place, analyse; the raw material stays in ``workdir/NAME``."""
    place = workdir / project.name
    if place.exists():
        shutil.rmtree(place)
    orig, conv = place / "original", place / "converted"
    record: dict[str, Any] = {
        "name": project.name, "repository": project.repository, "commit": project.commit,
        "paths": project.paths, "entries": project.entries, "kind": project.kind,
        "description": project.description,
    }
    gitdir = git_dir(project.repository, mirror)
    if gitdir is None and allow_clone:
        gitdir = clone(project.repository, mirror)
    if gitdir is None:
        record["error"] = (f"no mirror of {project.repository} under {mirror} "
                           f"(fetch github:{project.repository}, or pass --clone)")
        return record
    try:
        missing = export_tree(gitdir, project.commit, orig, project.export)
    except (RuntimeError, subprocess.SubprocessError) as e:
        record["error"] = str(e)
        return record
    if missing:
        # Large files (weights, data) are left out of mirrors; source files must not be.
        record["missing_files"] = missing
        dirs = [p if (orig / p).is_dir() else str(Path(p).parent) for p in project.paths]
        lost = [m for m in missing if m.endswith((".py", ".ipynb")) and any(
            d in (".", "") or m == d or m.startswith(d.rstrip("/") + "/") for d in dirs)]
        if lost:
            record["error"] = f"the mirror lacks source files: {', '.join(lost[:5])}"
            return record
    shutil.copytree(orig, conv, symlinks=True)
    report = place / "report.json"
    cmd = [exe, *project.paths, "--report", str(report), "--report-format", "json",
           "--no-cache", "-j", str(jobs), *project.args]
    start = time.perf_counter()
    rc, out, err, timed_out = _run(cmd, conv, timeout)
    record["seconds"] = round(time.perf_counter() - start, 1)
    record["exit_code"] = rc
    (place / "stderr.txt").write_text(err)
    if timed_out:
        record["error"] = f"timed out after {timeout:.0f} s"
        return record
    if not report.is_file():
        tail = err.strip().splitlines()[-1:] or ["no output"]
        record["error"] = f"no report (exit {rc}): {tail[0]}"
        return record
    doc = json.loads(report.read_text())
    diff, stats = tree_diff(orig, conv)
    (place / "diff.patch").write_text(diff)
    record.update(analyse(doc, conv, project.entries, project.paths, stats, diff))
    return record


# -- what a program is made of --------------------------------------------------------------------


def _notebook_source(text: str) -> str:
    try:
        cells = json.loads(text).get("cells", [])
    except (ValueError, AttributeError):
        return ""
    lines = []
    for cell in cells:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else str(source)
        if source.lstrip().startswith("%%"):
            continue
        lines += [ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!"))]
    return "\n".join(lines)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(level, dotted name) of every import of a module (``from a import b`` gives ``a`` and
    ``a.b``)."""
    text = path.read_text(errors="replace")
    if path.suffix == ".ipynb":
        text = _notebook_source(text)
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(0, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            found.append((node.level, base))
            found += [(node.level, f"{base}.{a.name}" if base else a.name) for a in node.names
                      if a.name != "*"]
    return found


def program_reach(root: Path, entry: str, paths: list[str]) -> list[str]:
    """The modules (relative paths) an entry point runs: itself and what it imports, followed
    through absolute imports (from the tree's top, the entry's folder, each path given and a
    ``src/`` folder) and relative ones."""
    root = root.resolve()
    search = [root, (root / entry).parent, root / "src"]
    search += [(root / p) if (root / p).is_dir() else (root / p).parent for p in paths]
    seen: dict[str, None] = {}
    todo = [(root / entry).resolve()]
    while todo:
        path = todo.pop()
        rel = path.relative_to(root).as_posix()
        if rel in seen or not path.is_file():
            continue
        seen[rel] = None
        for level, name in _imports(path):
            parts = [p for p in name.split(".") if p]
            if level:
                base = path.parent
                for _ in range(level - 1):
                    base = base.parent
                bases = [base]
            else:
                bases = search
            for b in bases:
                target = b.joinpath(*parts) if parts else b
                for cand in (target.with_suffix(".py") if parts else None,
                             target / "__init__.py"):
                    if cand is not None and cand.is_file() and root in cand.resolve().parents:
                        todo.append(cand.resolve())
                        break
    return list(seen)


# -- what the notes say ---------------------------------------------------------------------------

#: Manual notes that say what a contract part relies on was not found or not done.
NEGATIVE = {
    "data": re.compile(
        r"no DataLoader feeding|not followed back to a DataLoader|training data not sharded|"
        r"not split between|has no DistributedSampler|every (rank|worker) reads all|"
        r"full-batch training|no sharded training data was found|every rank (sees|collects) the "
        r"same|no split of the training data|data is not split|reads all of (its|the) data|"
        r"is not sharded|not sharded:",
        re.I),
    "averaging": re.compile(
        r"could not tell (where|which model)|no sdp\.DistributedDataParallel wraps|"
        r"gradients are not averaged|applies unaveraged|updated by hand|graph-mode code|"
        r"train its own copy|bypass|wrapped only in the branch", re.I),
    "state": re.compile(r"own random weights|nothing broadcasts|not broadcast", re.I),
    "writes": re.compile(r"(writes|downloads|unpacks)( the same files)? on every rank|"
                         r"run it on rank 0 only", re.I),
    "init": re.compile(r"no sdp\.init\(\)|sdp\.init\(\) is not called|before sdp\.init\(\)|"
                       r"NotInitializedError", re.I),
}
_ALL_PARTS = re.compile(r"is not converted: nothing of it runs data-parallel|^not converted", re.I)
_TAG = re.compile(r"\[(init|averaging|data|state|writes)\]\s*$")
#: Edits that split the data.
_SHARDING = {"shard_dataloader", "shard_tf_dataset", "wrap_keras_fit"}
_SHARD_WORDS = re.compile(r"shard|DistributedSampler|split", re.I)
_NO_LOADER = re.compile(r"no DataLoader feeding this training loop|not followed back to a "
                        r"DataLoader", re.I)
_FEEDS = re.compile(r"feeds the training in (?P<file>[^\s:]+):\d+")
#: An edit and a note this many lines apart speak of one statement (a call over several lines).
_NEAR = 3
#: Edits that average gradients; ``name``: the model a DDP wrap names.
_AVERAGES = re.compile(r"^wrap (?P<name>[\w.]+) in \w+\.DistributedDataParallel|"
                       r"= \w+\.DistributedGradientTape\(|"
                       r"wrapped in \w+\.keras\.DistributedOptimizer")
#: Lines (notes or edits) that say gradients are not averaged, or a model is not wrapped.
_NOT_AVERAGED = re.compile(r"not averaged|unaveraged|not wrapped|no \w+\.DistributedData"
                           r"Parallel wraps|could not tell (where|which model)", re.I)
#: ... which are true of a wrapped model too (a call that goes around the wrapper, an optimizer
#: left alone because the step's tape averages already).
_AROUND_THE_WRAP = re.compile(r"bypass|wrapped only in the branch|runs the wrapped module|"
                              r"averages its gradients .* already", re.I)
#: Edits that keep a write (or download) to rank 0.
_GUARDS = {"guard_rank0_writes", "order_downloads"}
_GUARDED = re.compile(r"on rank 0 only|rank0_first", re.I)


def _names(name: str, message: str) -> bool:
    """Whether ``message`` names the model ``name`` where the converter's lines name one."""
    n = re.escape(name)
    return re.search(rf"`{n}`|\({n}\)|where {n} is created|^{n}(:| is part of )|wraps {n}\b|"
                     rf"parameter of {n} is", message) is not None


def _edits_against_notes(changes: list[dict[str, Any]]) -> list[tuple[str, dict, dict]]:
    """An edit and a line of one file that say opposite things of one object: a model wrapped
    (or a tape, an optimizer) and "not averaged" / "not wrapped" of the same model (named, or at
    the same statement); a write kept to rank 0 and "run it on rank 0 only" at its line.
    ``(part, edit, line)`` each."""
    found = []
    for e in changes:
        if e.get("manual"):
            continue
        averages = _AVERAGES.search(e["message"])
        guards = e["transform"] in _GUARDS and _GUARDED.search(e["message"])
        if not (averages or guards):
            continue
        for c in changes:
            if c is e or c["path"] != e["path"]:
                continue
            if averages and _NOT_AVERAGED.search(c["message"]) and not _AROUND_THE_WRAP.search(
                    c["message"]) and (_names(averages["name"], c["message"]) if
                                       averages["name"] else abs(c["line"] - e["line"]) <= _NEAR):
                found.append(("averaging", e, c))
            if guards and c.get("manual") and c["line"] == e["line"] and \
                    "writes" in note_parts(c["message"]):
                found.append(("writes", e, c))
    return found


def note_parts(message: str) -> set[str]:
    """The contract parts a manual note says are not there."""
    tag = _TAG.search(message)
    if tag:
        return {tag[1]}
    if _ALL_PARTS.search(message):
        return set(PARTS)
    return {part for part, rx in NEGATIVE.items() if rx.search(message)}


def _where(change: dict[str, Any]) -> str:
    return f"{change['path']}:{change['line']}"


def find_duplicates(changes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same note twice (or more) at one place."""
    seen = Counter((c["path"], c["line"], c["message"]) for c in changes)
    return [{"where": f"{p}:{ln}", "message": m, "times": n}
            for (p, ln, m), n in sorted(seen.items()) if n > 1]


def _failing(contract: dict[str, Any] | None) -> list[str]:
    if not contract:
        return []
    return [p for p, v in contract.get("parts", {}).items()
            if v.get("state") not in ("holds", "noted", "n/a")]


def find_contradictions(doc: dict[str, Any], reach: dict[str, list[str]]
                        ) -> list[dict[str, Any]]:
    """What the report says against itself. ``doc`` is sdp-convert's JSON report; ``reach``
    maps each entry point (a path of the report) to the modules it runs."""
    found: list[dict[str, Any]] = []
    changes = doc.get("changes", [])
    manual = [c for c in changes if c.get("manual")]
    files = {f["path"]: f for f in doc.get("files", [])}
    for entry, modules in reach.items():
        info = files.get(entry, {})
        contract = info.get("contract")
        inside = set(modules)
        if contract:
            # (a) a part that holds against a note that says it is not there
            for part, value in contract.get("parts", {}).items():
                if value.get("state") != "holds":
                    continue
                for c in manual:
                    if c["path"] not in inside or part not in note_parts(c["message"]):
                        continue
                    if part == "init" and c["path"] != entry and c["transform"] != "contract":
                        continue  # "no init() here" in an imported module: true where the
                        # entry calls it
                    found.append({"kind": "holds-vs-note", "entry": entry, "part": part,
                                  "where": _where(c), "transform": c["transform"],
                                  "detail": f"{part} holds, but: {c['message']}"})
            # (c) counted done while the contract fails
            failing = _failing(contract)
            if failing and not info.get("attention") and info.get("status") in (
                    "converted", "unchanged"):
                found.append({"kind": "status-vs-contract", "entry": entry, "part":
                              ",".join(failing), "where": entry, "transform": "",
                              "detail": f"counted {info['status']} without attention while the "
                              f"contract's {', '.join(failing)} is "
                              f"{contract['parts'][failing[0]]['state']}"})
        # (b) two lines against each other, within the program
        notes = [c for c in manual if c["path"] in inside]
        edits = [c for c in changes if not c.get("manual") and c["path"] in inside]
        for c in notes:
            if "data" not in note_parts(c["message"]):
                continue
            for e in edits:
                if e["path"] == c["path"] and abs(e["line"] - c["line"]) <= _NEAR and \
                        e["transform"] in _SHARDING and _SHARD_WORDS.search(e["message"]):
                    found.append({"kind": "note-vs-note", "entry": entry, "part": "data",
                                  "where": _where(c), "transform": c["transform"],
                                  "detail": f"'{c['message']}' next to the edit at "
                                  f"{_where(e)}: '{e['message']}'"})
            if _NO_LOADER.search(c["message"]):
                for other in notes:
                    if _FEEDS.search(other["message"]):
                        found.append({"kind": "note-vs-note", "entry": entry, "part": "data",
                                      "where": _where(c), "transform": c["transform"],
                                      "detail": f"'{c['message']}' while {_where(other)} says "
                                      f"'{other['message']}'"})
        # (d) an edit and a line of the same file against each other
        for part, e, c in _edits_against_notes([c for c in changes if c["path"] in inside]):
            found.append({"kind": "edit-vs-note", "entry": entry, "part": part,
                          "where": _where(c), "transform": c["transform"],
                          "detail": f"'{c['message']}' against the edit at {_where(e)}: "
                          f"'{e['message']}'"})
    # one finding once, even where several entries run the same module
    unique: dict[tuple[str, str, str], dict[str, Any]] = {}
    for f in found:
        unique.setdefault((f["kind"], f["where"], f["detail"]), f)
    return list(unique.values())


def find_policy(doc: dict[str, Any], reach: dict[str, list[str]]) -> list[dict[str, Any]]:
    """Learning rates scaled or data sharded in a program whose averaging the contract does
    not show (each rank would train its own model at N times the rate on its part)."""
    found = []
    files = {f["path"]: f for f in doc.get("files", [])}
    for entry, modules in reach.items():
        contract = files.get(entry, {}).get("contract")
        if not contract:
            continue
        state = contract.get("parts", {}).get("averaging", {}).get("state")
        if state in (None, "holds", "n/a"):
            continue
        inside = set(modules)
        for c in doc.get("changes", []):
            if c.get("manual") or c["path"] not in inside:
                continue
            if c["transform"].startswith("scale_") or (
                    c["transform"] in _SHARDING and _SHARD_WORDS.search(c["message"])):
                found.append({"entry": entry, "where": _where(c), "transform": c["transform"],
                              "detail": f"{c['message']} (averaging: {state})"})
    return found


# -- one program's record -------------------------------------------------------------------------


def analyse(doc: dict[str, Any], root: Path, entries: list[str], paths: list[str],
            diff_stats: dict[str, tuple[int, int]], diff: str = "") -> dict[str, Any]:
    """The per-program record from sdp-convert's JSON report and the converted tree."""
    changes = doc.get("changes", [])
    files = {f["path"]: f for f in doc.get("files", [])}
    reach = {e: program_reach(root, e, paths) for e in entries}
    record_entries = {}
    for e in entries:
        info = files.get(e)
        record_entries[e] = {
            "status": info["status"] if info else "not in the run",
            "attention": bool(info and info.get("attention")),
            "kind": info.get("kind", "") if info else "",
            "contract": info.get("contract") if info else None,
            "modules": len(reach[e]),
        }
    others = {p: f["contract"] for p, f in files.items() if f.get("contract") and p not in entries}
    manual = [{"where": _where(c), "transform": c["transform"], "message": c["message"]}
              for c in changes if c.get("manual")]
    contradictions = find_contradictions(doc, reach)
    duplicates = find_duplicates(changes)
    policy = find_policy(doc, reach)
    states = Counter(v.get("state") for e in record_entries.values() if e["contract"]
                     for v in e["contract"].get("parts", {}).values())
    summary = doc.get("summary", {})
    counts = {
        "files": len(files),
        "converted": summary.get("converted", 0), "attention": summary.get("attention", 0),
        "unchanged": summary.get("unchanged", 0), "skipped": summary.get("skipped", 0),
        "failed": summary.get("failed", 0),
        "notes": len(changes),
        "changes": sum(1 for c in changes if not c.get("manual")),
        "manual": len(manual),
        "contract_entries": sum(1 for e in record_entries.values() if e["contract"]),
        "no_contract": sum(1 for e in record_entries.values() if not e["contract"]),
        **{f"parts_{s.replace('/', '')}": states.get(s, 0)
           for s in ("holds", "noted", "missing", "unknown", "n/a")},
        "contradictions": len(contradictions),
        "duplicates": sum(d["times"] - 1 for d in duplicates),
        "scaled_unaveraged": len(policy),
    }
    shown = {p: {"status": f["status"], "attention": f.get("attention", False),
                 "kind": f.get("kind", ""),
                 **({"message": f["message"]} if f.get("message") else {}),
                 **({"added": diff_stats[p][0], "removed": diff_stats[p][1]}
                    if p in diff_stats else {})}
             for p, f in files.items()
             if f["status"] != "unchanged" or f.get("attention")
             or not f.get("kind", "").startswith("not a training script")}
    return {
        "counts": counts, "entries": record_entries, "other_contracts": others,
        "files": shown, "manual": manual, "contradictions": contradictions,
        "duplicates": duplicates, "scaled_unaveraged": policy,
        "digest": output_digest(doc, diff),
    }


def output_digest(doc: dict[str, Any], diff: str) -> str:
    """What a reviewer judged: the report's lines, statuses and contracts, and the diff."""
    lines = sorted(json.dumps([c["path"], c["line"], c["transform"], c["message"],
                               bool(c.get("manual"))]) for c in doc.get("changes", []))
    files = sorted(json.dumps([f["path"], f["status"], f.get("attention"), f.get("contract")],
                              sort_keys=True) for f in doc.get("files", []))
    h = hashlib.sha256("\n".join([*lines, *files, diff]).encode())
    return h.hexdigest()[:16]


# -- verdicts and the table -----------------------------------------------------------------------


def load_verdicts(path: Path = VERDICTS) -> dict[str, dict[str, Any]]:
    if not path.is_file():
        return {}
    verdicts = _read_toml(path)
    for name, v in verdicts.items():
        if v.get("verdict") not in VERDICT_KINDS:
            raise SystemExit(f"{path}: {name}: verdict must be one of {', '.join(VERDICT_KINDS)}")
    return verdicts


def _contract_cell(record: dict[str, Any]) -> str:
    cells = []
    for entry, e in record.get("entries", {}).items():
        name = Path(entry).name
        c = e.get("contract")
        if not c:
            cells.append(f"{name}: none ({e['status']})")
            continue
        parts = c.get("parts", {})
        order = [p for p in PARTS if p in parts] + [p for p in parts if p not in PARTS]
        marks = " ".join(f"{PART_LETTER.get(p, p)}{STATE_MARK.get(parts[p].get('state'), '?')}"
                         for p in order)
        cells.append(f"{name}: {marks}")
    return "<br>".join(cells) or "-"


def _md_escape(text: str) -> str:
    """One table cell or list item: no line breaks, no column breaks, and no ``[a][b]`` read as a
    Markdown reference link (brackets escaped outside backtick spans)."""
    parts = text.replace("\n", " ").replace("|", "\\|").split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: no code spans
        parts = ["'".join(parts)]
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("[", "\\[").replace("]", "\\]")
    return "`".join(parts)


def totals(records: list[dict[str, Any]], verdicts: dict[str, dict[str, Any]]
           ) -> dict[str, Any]:
    out: dict[str, Any] = Counter()
    for r in records:
        for k, v in r.get("counts", {}).items():
            out[k] += v
        if r.get("error"):
            out["errors"] += 1
        v = verdicts.get(r["name"])
        if v and v.get("digest") == r.get("digest"):
            out[f"verdict_{v['verdict']}"] += 1
        elif v:
            out["verdict_stale"] += 1
        else:
            out["verdict_none"] += 1
    out["programs"] = len(records)
    return dict(out)


def render_md(doc: dict[str, Any], verdicts: dict[str, dict[str, Any]]) -> str:
    records = doc["programs"]
    t = totals(records, verdicts)
    conv = doc.get("converter", {})
    which = conv.get("commit", "")[:10] + (" (with local edits)" if conv.get("dirty") else "")
    lines = [
        "# Ecosystem check: sdp-convert on public training projects",
        "",
        f"Run {doc.get('date', '?')} by `benchmarks/ecosystem.py run` with "
        f"{conv.get('version', 'sdp-convert ?')} (commit {which}) on {doc.get('machine', '?')}: "
        f"{len(records)} programs of `benchmarks/ecosystem.toml`, each exported from its pinned "
        "commit and converted in place with `sdp-convert PATHS --report R.json --report-format "
        f"json --no-cache -j 1` ({doc.get('seconds', 0):.0f} s in all). Verdicts are by review "
        "(`benchmarks/ecosystem_verdicts.toml`): a verdict given for other output than this "
        "run's is shown as *stale* and not counted.",
        "",
        "## Totals",
        "",
        "| verdict | programs |",
        "| --- | ---: |",
        *[f"| {k} | {t.get('verdict_' + k, 0)} |" for k in VERDICT_KINDS],
        f"| stale (output changed since the review) | {t.get('verdict_stale', 0)} |",
        f"| not reviewed | {t.get('verdict_none', 0)} |",
        "",
        "| count | all programs |",
        "| --- | ---: |",
        f"| files in the runs (converted / need attention / unchanged / failed) | "
        f"{t.get('files', 0)} ({t.get('converted', 0)} / {t.get('attention', 0)} / "
        f"{t.get('unchanged', 0)} / {t.get('failed', 0)}) |",
        f"| report lines (notes) | {t.get('notes', 0)} |",
        f"| edits (changes) | {t.get('changes', 0)} |",
        f"| manual notes | {t.get('manual', 0)} |",
        f"| entry points with a contract / without one | {t.get('contract_entries', 0)} / "
        f"{t.get('no_contract', 0)} |",
        f"| contract parts holding / noted / missing / unknown | {t.get('parts_holds', 0)} / "
        f"{t.get('parts_noted', 0)} / {t.get('parts_missing', 0)} / "
        f"{t.get('parts_unknown', 0)} |",
        f"| contradictions (found by the script) | {t.get('contradictions', 0)} |",
        f"| duplicate notes (the same note again at one place) | {t.get('duplicates', 0)} |",
        f"| learning rate scaled or data sharded where averaging does not hold | "
        f"{t.get('scaled_unaveraged', 0)} |",
        f"| programs the converter could not be run on | {t.get('errors', 0)} |",
        "",
        "## Programs",
        "",
        "Contract, per entry point: **I**nit, **A**veraging, **D**ata, **S**tate, **W**rites; "
        "`+` holds, `n` noted, `-` missing, `?` unknown, `.` n/a; `none`: no contract "
        "(with the entry's status). Files: converted / need attention / unchanged / failed.",
        "",
        "| program | kind | files | edits | manual | contract | contradictions | dup | "
        "verdict | reason |",
        "| --- | --- | --- | ---: | ---: | --- | ---: | ---: | --- | --- |",
    ]
    for r in records:
        c = r.get("counts", {})
        v = verdicts.get(r["name"])
        if v is None:
            verdict, reason = "not reviewed", ""
        else:
            verdict = v["verdict"] if v.get("digest") == r.get("digest") else \
                f"stale ({v['verdict']})"
            reason = v.get("reason", "")
            if v.get("ran"):
                reason += f" Ran: {v['ran']}"
        if r.get("error"):
            lines.append(f"| {r['name']} | {r.get('kind', '')} | error | | | "
                         f"{_md_escape(r['error'])} | | | {verdict} | {_md_escape(reason)} |")
            continue
        files = (f"{c.get('converted', 0)}/{c.get('attention', 0)}/{c.get('unchanged', 0)}/"
                 f"{c.get('failed', 0)}")
        lines.append(
            f"| {r['name']} | {r.get('kind', '')} | {files} | {c.get('changes', 0)} | "
            f"{c.get('manual', 0)} | {_contract_cell(r)} | {c.get('contradictions', 0)} | "
            f"{c.get('duplicates', 0)} | {verdict} | {_md_escape(reason)} |")
    found = [(r["name"], f) for r in records for f in r.get("contradictions", [])]
    lines += ["", "## Contradictions found by the script", ""]
    lines += [f"- {n}: `{f['where']}` ({f['kind']}, {f['part']}): {_md_escape(f['detail'])}"
              for n, f in found] or ["(none)"]
    dups = [(r["name"], d) for r in records for d in r.get("duplicates", [])]
    lines += ["", "## Duplicate notes", ""]
    lines += [f"- {n}: `{d['where']}` {d['times']} times: {_md_escape(d['message'])}"
              for n, d in dups] or ["(none)"]
    pol = [(r["name"], p) for r in records for p in r.get("scaled_unaveraged", [])]
    lines += ["", "## Scaled or sharded where averaging does not hold", ""]
    lines += [f"- {n}: `{p['where']}` [{p['transform']}] {_md_escape(p['detail'])}"
              for n, p in pol] or ["(none)"]
    lines += ["", "## The programs", ""]
    lines += [f"- **{r['name']}**: [{r['repository']}](https://github.com/{r['repository']}/tree/"
              f"{r['commit']}) at `{r['commit'][:10]}`, `sdp-convert "
              f"{' '.join(r['paths'])}`, entry {', '.join(f'`{e}`' for e in r['entries'])}: "
              f"{_md_escape(r['description'])}" for r in records]
    return "\n".join(lines) + "\n"


# -- compare --------------------------------------------------------------------------------------


def _manual_keys(r: dict[str, Any]) -> Counter[str]:
    # Without the line: an edit above a note moves it, and that is no change of substance.
    return Counter(f"{m['where'].rsplit(':', 1)[0]} [{m['transform']}] {m['message']}"
                   for m in r.get("manual", []))


def _states(r: dict[str, Any]) -> dict[str, str]:
    out = {}
    for entry, e in r.get("entries", {}).items():
        c = e.get("contract")
        if not c:
            out[entry] = f"none ({e.get('status')})"
            continue
        for part, v in c.get("parts", {}).items():
            out[f"{entry} {part}"] = v.get("state", "?")
    return out


def compare(old: dict[str, Any], new: dict[str, Any]) -> str:
    """What changed, program by program (as mypy_primer prints it)."""
    olds = {r["name"]: r for r in old["programs"]}
    news = {r["name"]: r for r in new["programs"]}
    out = []
    same = 0
    for name in [*olds, *(n for n in news if n not in olds)]:
        a, b = olds.get(name), news.get(name)
        if a is None or b is None:
            out.append(f"{name}: {'added' if a is None else 'removed'}")
            continue
        lines = []
        if a.get("error") != b.get("error"):
            lines.append(f"  error: {a.get('error')!r} -> {b.get('error')!r}")
        sa, sb = _states(a), _states(b)
        for k in [*sa, *(k for k in sb if k not in sa)]:
            if sa.get(k) != sb.get(k):
                lines.append(f"  contract {k}: {sa.get(k, '-')} -> {sb.get(k, '-')}")
        for k in ("converted", "attention", "unchanged", "failed", "changes", "manual",
                  "contradictions", "duplicates", "scaled_unaveraged"):
            x, y = a.get("counts", {}).get(k, 0), b.get("counts", {}).get(k, 0)
            if x != y:
                lines.append(f"  {k}: {x} -> {y}")
        ma, mb = _manual_keys(a), _manual_keys(b)
        lines += [f"  - {k}" for k in sorted((ma - mb).elements())]
        lines += [f"  + {k}" for k in sorted((mb - ma).elements())]
        ca = {(f["kind"], f["where"], f["detail"]) for f in a.get("contradictions", [])}
        cb = {(f["kind"], f["where"], f["detail"]) for f in b.get("contradictions", [])}
        lines += [f"  contradiction gone: {w} ({k}) {d}" for k, w, d in sorted(ca - cb)]
        lines += [f"  contradiction new: {w} ({k}) {d}" for k, w, d in sorted(cb - ca)]
        if a.get("digest") != b.get("digest") and not lines:
            lines.append("  output changed (edits only; see the diffs)")
        if lines:
            out.append(f"{name}:")
            out += lines
        else:
            same += 1
    ta, tb = totals(old["programs"], {}), totals(new["programs"], {})
    out.append("")
    out.append(f"{same} programs unchanged, {len(news) - same} changed or added.")
    for k in ("notes", "changes", "manual", "parts_holds", "parts_missing", "parts_unknown",
              "no_contract", "contradictions", "duplicates", "scaled_unaveraged"):
        out.append(f"  {k}: {ta.get(k, 0)} -> {tb.get(k, 0)}")
    return "\n".join(out)


# -- the command line ---------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    projects = load_projects(Path(args.list))
    if args.only:
        wanted = {n for item in args.only for n in item.split(",")}
        unknown = wanted - {p.name for p in projects}
        if unknown:
            raise SystemExit(f"unknown project(s): {', '.join(sorted(unknown))}")
        projects = [p for p in projects if p.name in wanted]
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()

    def one(p: Project) -> dict[str, Any]:
        r = convert_project(p, args.sdp_convert, Path(args.mirror), workdir, jobs=1,
                            timeout=args.timeout, allow_clone=args.clone)
        c = r.get("counts", {})
        print(f"{p.name}: " + (r["error"] if r.get("error") else
              f"{c['converted']} converted, {c['attention']} need attention, "
              f"{c['manual']} manual, {c['contradictions']} contradictions "
              f"({r['seconds']} s)"), flush=True)
        return r

    if args.jobs > 1:
        with ThreadPoolExecutor(args.jobs) as pool:
            records = list(pool.map(one, projects))
    else:
        records = [one(p) for p in projects]
    doc = {
        "version": 1, "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
                   f"{platform.python_version()}",
        "converter": converter_identity(args.sdp_convert),
        "seconds": round(time.perf_counter() - start, 1),
        "programs": records,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    md = Path(args.md) if args.md else out.with_suffix(".md")
    md.write_text(render_md(doc, load_verdicts(Path(args.verdicts))))
    print(f"wrote {out} and {md}; the diffs and reports are in {workdir}/NAME/")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    doc = json.loads(Path(args.json).read_text())
    text = render_md(doc, load_verdicts(Path(args.verdicts)))
    if args.md == "-":
        sys.stdout.write(text)
    else:
        md = Path(args.md) if args.md else Path(args.json).with_suffix(".md")
        md.write_text(text)
        print(f"wrote {md}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    old = json.loads(Path(args.old).read_text())
    new = json.loads(Path(args.new).read_text())
    print(compare(old, new))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ecosystem.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="convert every listed project and record the outcome")
    run.add_argument("--list", default=str(LIST))
    run.add_argument("--out", default=str(RESULTS / "ecosystem.json"))
    run.add_argument("--md", default=None, help="default: --out with .md")
    run.add_argument("--verdicts", default=str(VERDICTS))
    run.add_argument("--only", action="append", default=[], metavar="NAME",
                     help="only these projects (repeat, or comma-separate)")
    run.add_argument("--sdp-convert", default=SDP_CONVERT, help="the executable to check")
    run.add_argument("--mirror", default=str(MIRROR))
    run.add_argument("--clone", action="store_true", help="clone missing mirrors from GitHub")
    run.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "sdp-ecosystem"))
    run.add_argument("--jobs", type=int, default=1,
                     help="programs converted at once (default 1: the machine is shared)")
    run.add_argument("--timeout", type=float, default=900, help="seconds per program")
    run.set_defaults(func=cmd_run)
    rep = sub.add_parser("report", help="write the table of a recorded run")
    rep.add_argument("json")
    rep.add_argument("--md", default=None, help="default: the JSON's name with .md; - stdout")
    rep.add_argument("--verdicts", default=str(VERDICTS))
    rep.set_defaults(func=cmd_report)
    cmp = sub.add_parser("compare", help="what changed between two runs, program by program")
    cmp.add_argument("old")
    cmp.add_argument("new")
    cmp.set_defaults(func=cmd_compare)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--compare"]:  # ``--compare OLD NEW``, as mypy_primer spells it
        argv[0] = "compare"
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
