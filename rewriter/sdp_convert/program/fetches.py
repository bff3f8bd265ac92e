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

import libcst as cst
import libcst.matchers as m

from ..base import Transform
from .deletions import deletion_unit
from .guards import why_not_guardable
from .scopes import assigned_values, binding_of, referents, uses
from .syntax import arg_named, target_names
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
from .writes import OPENERS, WRITES, open_mode


@dataclass
class FetchUnit:
    """What runs on rank 0 alone for a fetch: ``statements`` (consecutive, of one block) and
    whether every rank can wait for it right after (``barrier``); or why not (``problem``)."""

    statements: list[cst.BaseStatement]
    barrier: bool = True
    problem: str | None = None


def file_fetches(t: Transform) -> list[cst.Call]:
    """The calls that download or unpack into files every time they run (module docstring)."""
    found = [c for c in t.calls_to(*FILE_DOWNLOADS, *EXTRACTIONS) if not _to_own_temp_file(t, c)]
    for method in EXTRACT_METHODS:
        found += [c for c in t.method_calls(method) if _on_archive(t, c)]
    found += [c for c in t.calls_to(*RESPONSES) if _written_statements(t, c)]
    return found


def _to_own_temp_file(t: Transform, call: cst.Call) -> bool:
    """``urlretrieve(url)`` without a file name: a temporary file of this process."""
    return t.refers_to(call.func, "urllib.request.urlretrieve") and arg_named(
        call, "filename", 1) is None


def is_response(t: Transform, call: cst.Call) -> bool:
    return t.refers_to(call.func, *RESPONSES)


def fetch_unit(t: Transform, call: cst.Call) -> FetchUnit:
    stmt = t.enclosing_statement(call)
    if stmt is None:
        return FetchUnit([], problem="it is not in a statement")
    if is_response(t, call):
        statements = _written_statements(t, call)
        if statements is None:
            return FetchUnit([], problem="what it returns is used outside the statements that "
                                         "write it")
    else:
        statements = [_opened_for(t, stmt)]
    for s in statements:
        problem = why_not_guardable(t, call if s is stmt else s, s)
        if problem is not None and not (
            problem.startswith("it assigns a name used later") and _confined(t, s, statements)
        ):
            return FetchUnit([], problem=problem)
    unit, barrier = deletion_unit(t, statements[0])
    if unit is not statements[0]:
        # ``if not os.path.exists(p): urlretrieve(url, p)``, whole: another rank would test it
        # while rank 0 writes, skip the barrier, and leave the others waiting there.
        statements = [unit]
    return FetchUnit(statements, barrier)


def _opened_for(t: Transform, stmt: cst.BaseStatement) -> cst.BaseStatement:
    """The ``with tarfile.open(p) as tar:`` whose one statement ``stmt`` is, else ``stmt``."""
    block = t.parent(stmt)
    owner = t.parent(block) if isinstance(block, cst.IndentedBlock) else None
    if isinstance(owner, cst.With) and len(block.body) == 1 and all(  # type: ignore[union-attr]
        isinstance(i.item, cst.Call) and t.refers_to(i.item.func, *ARCHIVES) for i in owner.items
    ):
        return owner
    return stmt


def _confined(t: Transform, stmt: cst.BaseStatement, statements: list[cst.BaseStatement]) -> bool:
    """Every name ``stmt`` assigns is read only inside ``statements``."""
    for assign in m.findall(stmt, m.Assign() | m.AnnAssign()):
        targets = (
            [a.target for a in assign.targets] if isinstance(assign, cst.Assign)
            else [assign.target]  # type: ignore[attr-defined]
        )
        for target in targets:
            if not isinstance(target, (cst.Name, cst.Tuple, cst.List)):
                return False
            for name in target_names(target):
                binding = binding_of(t, name)
                if binding is None or not all(
                    any(p in statements for p in t.ancestors(u)) for u in uses(t, binding)
                ):
                    return False
    return True


def _written_statements(t: Transform, call: cst.Call) -> list[cst.BaseStatement] | None:
    """For a network read: its statement through the last one of its block that uses what it
    returned, when one of those writes a file; None when it writes nothing, or is used elsewhere.
    """
    stmt = t.enclosing_statement(call)
    block = t.parent(stmt) if stmt is not None else None
    body = getattr(block, "body", None)
    if stmt is None or not isinstance(body, (list, tuple)):
        return None
    names = _received(t, call, stmt)
    if names is None:
        return None
    start = next(i for i, s in enumerate(body) if s is stmt)
    last = start
    for name in names:
        binding = binding_of(t, name)
        if binding is None:
            return None
        for use in uses(t, binding):
            if any(p is stmt for p in t.ancestors(use)):
                continue
            index = next((i for i, s in enumerate(body)
                          if any(p is s for p in t.ancestors(use))), None)
            if index is None or index < start:
                return None
            last = max(last, index)
    statements = list(body[start:last + 1])
    return statements if any(_writes_file(t, s) for s in statements) else None


def _received(t: Transform, call: cst.Call, stmt: cst.BaseStatement) -> list[cst.Name] | None:
    """The names the network read's result goes to: ``r = requests.get(u)``, ``data =
    urlopen(u).read()``, ``with urlopen(u) as r``; [] when it is used where it is."""
    for parent in t.ancestors(call):
        if isinstance(parent, cst.WithItem):
            return [parent.asname.name] if parent.asname is not None and isinstance(
                parent.asname.name, cst.Name) else []
        if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
            return target_names(parent.targets[0].target) or None
        if parent is stmt:
            return []
    return []


def _writes_file(t: Transform, stmt: cst.CSTNode) -> bool:
    for node in m.findall(stmt, m.Call()):
        assert isinstance(node, cst.Call)
        names = t.qualified_names(node.func)
        opener = next((n for n in names if n in OPENERS), None)
        if opener is not None:
            mode = open_mode(node, *OPENERS[opener])
            if mode is not None and any(c in mode for c in "wax+"):
                return True
        if any(n in WRITES or n == "shutil.copyfileobj" for n in names):
            return True
        if isinstance(node.func, cst.Attribute) and node.func.attr.value in (
            "write_bytes", "write_text"
        ):
            return True
    return False


def _on_archive(t: Transform, call: cst.Call) -> bool:
    """``<archive>.extractall(...)`` of ``zipfile.ZipFile(p)``/``tarfile.open(p)``, directly, or
    through a name it was assigned to or opened as (``with tarfile.open(p) as tar:``)."""
    func = call.func
    receiver = func.value if isinstance(func, cst.Attribute) else None
    values: list[cst.BaseExpression] = []
    if isinstance(receiver, cst.Call):
        values = [receiver]
    elif isinstance(receiver, cst.Name):
        values = [b.value for b in referents(t, receiver)
                  if b.kind in ("assign", "with") and not b.unpacked and b.value is not None]
    return bool(values) and all(
        isinstance(v, cst.Call) and t.refers_to(v.func, *ARCHIVES) for v in values
    )


def url_reads(t: Transform) -> list[cst.Call]:
    """Reads of a URL into memory: a ``URL_READERS`` call given a URL (a literal, or a name
    bound to one), and network reads whose result is not written to a file."""
    found = [c for c in t.calls_to(*URL_READERS) if _given_url(t, c)]
    found += [c for c in t.calls_to(*RESPONSES) if _written_statements(t, c) is None]
    return found


def url_cache_reads(t: Transform) -> list[cst.Call]:
    """``np.loadtxt(URL)``-style reads, which download into the working directory first."""
    return [c for c in t.calls_to(*URL_CACHING_READERS) if _given_url(t, c)]


def _given_url(t: Transform, call: cst.Call) -> bool:
    return bool(call.args) and call.args[0].keyword is None and is_url(t, call.args[0].value, 0)


def is_url(t: Transform, expr: cst.BaseExpression, depth: int) -> bool:
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
            return is_url(t, first.expression, depth + 1)
        return isinstance(first, cst.FormattedStringText) and first.value.startswith(URL_SCHEMES)
    if isinstance(expr, cst.ConcatenatedString):
        return is_url(t, expr.left, depth + 1)  # type: ignore[arg-type]
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Add):
        return is_url(t, expr.left, depth + 1)
    if isinstance(expr, cst.Name):
        values = assigned_values(t, expr)
        return bool(values) and all(is_url(t, v, depth + 1) for v in values)
    return False
