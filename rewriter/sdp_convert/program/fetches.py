"""Downloads and extractions that write files every time they run, and reads of a URL.

``file_fetches`` finds the calls that put files on disk each time they run, whatever is there
already (the names are ``program.vocab``'s): ``urlretrieve``/``gdown.download``/``wget.download``
to a path, an archive unpacked (``zipfile.ZipFile(p).extractall(d)``, ``tarfile.open(p)``'s
``extractall``, ``shutil.unpack_archive``), and a network read (``requests.get``,
``urlopen``) whose content the script writes to a file (``with open(p, "wb") as f:
f.write(r.content)``). Run on every rank, these write the same files at once: torn files, and a
rank reading a file another is still writing. ``sdp.rank0_first()`` is no answer for them: the
other ranks would run them again after local rank 0, rewriting the files that rank 0 already reads.

``fetch_unit`` says what to run on rank 0 alone, with the barrier after it that makes every other
rank wait for the files: the statement (with the file-system test around it, ``if not
os.path.exists(p): urlretrieve(url, p)``, as ``program.deletions`` does for deletions), or, for a
network read, the statements from the read to the last that writes what it returned.

``url_reads`` finds the reads of a URL into memory (``pd.read_csv(URL)``,
``requests.get(url).json()``): correct on every rank, but each rank downloads it.
``url_cache_reads`` finds ``np.loadtxt(URL)``/``np.genfromtxt(URL)``: numpy downloads the URL into
``./<host>/<path>`` first, on every call, so every rank writes that file at once (the run-time
audit saw it), and its value is needed on every rank: a manual note.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from .deletions import deletion_unit
from .guards import why_not_guardable
from .scopes import assigned_values, binding_of, node_order, referents, uses
from .syntax import arg_named, findall, target_names
from .vocab import (
    ARCHIVES,
    EXTRACT_METHODS,
    EXTRACTIONS,
    FILE_DOWNLOADS,
    RESPONSES,
    URL_CACHING_READERS,
    URL_READERS,
    URL_SCHEMES,
)
from .writes import OPENERS, WRITES, open_mode, writes_in

if TYPE_CHECKING:
    from .model import FileModel


@dataclass
class FetchUnit:
    """What runs on rank 0 alone for a fetch: ``statements`` (consecutive, of one block) and
    whether every rank can wait for it right after (``barrier``); or why not (``problem``)."""

    statements: list[cst.BaseStatement]
    barrier: bool = True
    problem: str | None = None


def file_fetches(fm: FileModel) -> list[cst.Call]:
    """The calls that download or unpack into files every time they run (module docstring)."""
    found = [c for c in fm.calls_to(*FILE_DOWNLOADS, *EXTRACTIONS) if not _to_own_temp_file(fm, c)]
    for method in EXTRACT_METHODS:
        found += [c for c in fm.method_calls(method) if _on_archive(fm, c)]
    found += [c for c in fm.calls_to(*RESPONSES) if _written_statements(fm, c)]
    order = node_order(fm)
    return sorted(found, key=lambda c: order.get(id(c), -1))  # as they run: the download first


def _to_own_temp_file(fm: FileModel, call: cst.Call) -> bool:
    """``urlretrieve(url)`` without a file name: a temporary file of this process."""
    return fm.refers_to(call.func, "urllib.request.urlretrieve") and arg_named(
        call, "filename", 1) is None


def is_response(fm: FileModel, call: cst.Call) -> bool:
    return fm.refers_to(call.func, *RESPONSES)


def fetch_unit(fm: FileModel, call: cst.Call) -> FetchUnit:
    stmt = fm.enclosing_statement(call)
    if stmt is None:
        return FetchUnit([], problem="it is not in a statement")
    if is_response(fm, call):
        statements = _written_statements(fm, call)
        if statements is None:
            return FetchUnit([], problem="what it returns is used outside the statements that "
                                         "write it")
    else:
        statements = [_opened_for(fm, stmt)]
    # ``if not os.path.exists(p): <download>; <extract>; <delete>``: the whole ``if`` (which
    # binds no name read outside it) is the unit, so a name one step assigns for the next
    # (``file_path``) stays inside what rank 0 runs.
    unit, barrier = deletion_unit(fm, statements[0])
    for s in statements:
        problem = why_not_guardable(fm, call if s is stmt else s, s)
        if problem is not None and not (
            problem.startswith("it assigns a name used later") and (
                _confined(fm, s, statements)
                or (unit is not statements[0] and _confined(fm, s, [unit]))
            )
        ):
            return FetchUnit([], problem=problem)
    if unit is not statements[0]:
        # ``if not os.path.exists(p): urlretrieve(url, p)``, whole: another rank would test it
        # while rank 0 writes, skip the barrier, and leave the others waiting there.
        statements = [unit]
    return FetchUnit(statements, barrier)


def fetch_statements(fm: FileModel, call: cst.Call) -> list[cst.BaseStatement]:
    """The statements a file fetch (of ``file_fetches``) writes its files with: its unit, or,
    where the unit cannot go to rank 0 (``problem``), the statements that write what a network
    read returned (``with open(p, "wb") as f: f.write(r.read())``). A write among them is part
    of the fetch: guarding it alone would leave the read, the extraction and the deletion around
    it on every rank (half a guard)."""
    unit = fetch_unit(fm, call)
    if unit.statements:
        return unit.statements
    if is_response(fm, call):
        return _written_statements(fm, call) or []
    stmt = fm.enclosing_statement(call)
    return [stmt] if stmt is not None else []


def _opened_for(fm: FileModel, stmt: cst.BaseStatement) -> cst.BaseStatement:
    """The ``with tarfile.open(p) as tar:`` whose one statement ``stmt`` is, else ``stmt``."""
    block = fm.parent(stmt)
    owner = fm.parent(block) if isinstance(block, cst.IndentedBlock) else None
    if isinstance(owner, cst.With) and len(block.body) == 1 and all(  # type: ignore[union-attr]
        isinstance(i.item, cst.Call) and fm.refers_to(i.item.func, *ARCHIVES) for i in owner.items
    ):
        return owner
    return stmt


def _confined(fm: FileModel, stmt: cst.BaseStatement, statements: list[cst.BaseStatement]) -> bool:
    """Every name ``stmt`` assigns is read only inside ``statements``."""
    for assign in findall(stmt, m.Assign() | m.AnnAssign()):
        targets = (
            [a.target for a in assign.targets] if isinstance(assign, cst.Assign)
            else [assign.target]  # type: ignore[attr-defined]
        )
        for target in targets:
            if not isinstance(target, (cst.Name, cst.Tuple, cst.List)):
                return False
            for name in target_names(target):
                binding = binding_of(fm, name)
                if binding is None or not all(
                    any(p in statements for p in fm.ancestors(u)) for u in uses(fm, binding)
                ):
                    return False
    return True


def _written_statements(fm: FileModel, call: cst.Call) -> list[cst.BaseStatement] | None:
    """For a network read: its statement through the last one of its block that uses what it
    returned, when one of those writes a file; None when it writes nothing, or is used elsewhere.
    """
    stmt = fm.enclosing_statement(call)
    block = fm.parent(stmt) if stmt is not None else None
    body = getattr(block, "body", None)
    if stmt is None or not isinstance(body, (list, tuple)):
        return None
    names = _received(fm, call, stmt)
    if names is None:
        return None
    start = next(i for i, s in enumerate(body) if s is stmt)
    last = start
    for name in names:
        binding = binding_of(fm, name)
        if binding is None:
            return None
        for use in uses(fm, binding):
            if any(p is stmt for p in fm.ancestors(use)):
                continue
            index = next((i for i, s in enumerate(body)
                          if any(p is s for p in fm.ancestors(use))), None)
            if index is None or index < start:
                return None
            last = max(last, index)
    statements = list(body[start:last + 1])
    return statements if any(_writes_file(fm, s) for s in statements) else None


def _received(fm: FileModel, call: cst.Call, stmt: cst.BaseStatement) -> list[cst.Name] | None:
    """The names the network read's result goes to: ``r = requests.get(u)``, ``data =
    urlopen(u).read()``, ``with urlopen(u) as r``; [] when it is used where it is."""
    for parent in fm.ancestors(call):
        if isinstance(parent, cst.WithItem):
            return [parent.asname.name] if parent.asname is not None and isinstance(
                parent.asname.name, cst.Name) else []
        if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
            return target_names(parent.targets[0].target) or None
        if parent is stmt:
            return []
    return []


def _writes_file(fm: FileModel, stmt: cst.CSTNode) -> bool:
    for node in findall(stmt, m.Call()):
        assert isinstance(node, cst.Call)
        names = fm.qualified_names(node.func)
        opener = next((n for n in names if n in OPENERS), None)
        if opener is not None:
            mode = open_mode(node, *OPENERS[opener])
            if mode is not None and writes_in(mode):
                return True
        if any(n in WRITES or n == "shutil.copyfileobj" for n in names):
            return True
        if isinstance(node.func, cst.Attribute) and node.func.attr.value in (
            "write_bytes", "write_text"
        ):
            return True
    return False


def _on_archive(fm: FileModel, call: cst.Call) -> bool:
    """``<archive>.extractall(...)`` of ``zipfile.ZipFile(p)``/``tarfile.open(p)``, directly, or
    through a name it was assigned to or opened as (``with tarfile.open(p) as tar:``)."""
    func = call.func
    receiver = func.value if isinstance(func, cst.Attribute) else None
    values: list[cst.BaseExpression] = []
    if isinstance(receiver, cst.Call):
        values = [receiver]
    elif isinstance(receiver, cst.Name):
        values = [b.value for b in referents(fm, receiver)
                  if b.kind in ("assign", "with") and not b.unpacked and b.value is not None]
    return bool(values) and all(
        isinstance(v, cst.Call) and fm.refers_to(v.func, *ARCHIVES) for v in values
    )


def url_reads(fm: FileModel) -> list[cst.Call]:
    """Reads of a URL into memory: a ``URL_READERS`` call given a URL (a literal, or a name
    bound to one), and network reads whose result is not written to a file."""
    found = [c for c in fm.calls_to(*URL_READERS) if _given_url(fm, c)]
    found += [c for c in fm.calls_to(*RESPONSES) if _written_statements(fm, c) is None]
    return found


def url_cache_reads(fm: FileModel) -> list[cst.Call]:
    """``np.loadtxt(URL)``-style reads, which download into the working directory first."""
    return [c for c in fm.calls_to(*URL_CACHING_READERS) if _given_url(fm, c)]


def _given_url(fm: FileModel, call: cst.Call) -> bool:
    return bool(call.args) and call.args[0].keyword is None and is_url(fm, call.args[0].value, 0)


def is_url(fm: FileModel, expr: cst.BaseExpression, depth: int) -> bool:
    """``expr`` is a URL: a string starting with a scheme of ``URL_SCHEMES``, an f-string or a
    sum whose first part is one, or a name only ever assigned one."""
    if depth > 3:
        return False
    if isinstance(expr, cst.SimpleString):
        value = expr.evaluated_value
        return isinstance(value, str) and value.startswith(URL_SCHEMES)
    if isinstance(expr, cst.FormattedString):
        first = expr.parts[0] if expr.parts else None
        if isinstance(first, cst.FormattedStringExpression):  # f"{BASE}/a.csv"
            return is_url(fm, first.expression, depth + 1)
        return isinstance(first, cst.FormattedStringText) and first.value.startswith(URL_SCHEMES)
    if isinstance(expr, cst.ConcatenatedString):
        return is_url(fm, expr.left, depth + 1)  # type: ignore[arg-type]
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Add):
        return is_url(fm, expr.left, depth + 1)
    if isinstance(expr, cst.Name):
        values = assigned_values(fm, expr)
        return bool(values) and all(is_url(fm, v, depth + 1) for v in values)
    return False
