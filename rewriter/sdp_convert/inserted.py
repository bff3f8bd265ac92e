"""Checks of the code a conversion inserts, made before anything is written (like the
fixed-point check): it must not break the program it goes into.

* **Names**: a module-level statement must not use a name that is bound only later, or nowhere
  (``tf.config...`` pinned in a notebook's first cell that imports only ``keras``: NameError).
* **Collectives where the ranks do not all go**: ``barrier``, ``broadcast*``, ``allreduce*``,
  ``allgather*`` and ``rank0_first`` are entered by every rank or by none; under a condition that
  can differ between ranks (the rank itself, a value computed from it, a file-system test such as
  ``os.path.exists``) some ranks wait for others that never come: a deadlock.

Each check compares the output with the input: what the user wrote is theirs; only what the
conversion added is held against it.
"""

from __future__ import annotations

import ast
import builtins
import re
from collections import Counter

_BUILTINS = frozenset(dir(builtins)) | {"__file__", "__name__", "__doc__", "__spec__",
                                        "__builtins__", "__path__", "__package__", "__loader__",
                                        "get_ipython", "display"}
_COLLECTIVE = re.compile(
    r"^(barrier|broadcast\w*|allreduce\w*|allgather\w*|alltoall\w*|rank0_first)$"
)
_RANK = re.compile(r"^(get_)?(local_)?rank$")
_FILE_TESTS = frozenset({"exists", "isfile", "isdir", "is_file", "is_dir", "glob", "listdir",
                         "iglob", "scandir"})


def problems(
    original: bytes, output: bytes, noted: set[str] | frozenset[str] = frozenset()
) -> list[tuple[int, str]]:
    """``(line, what is wrong)`` of the output's inserted code; empty when all is well.
    ``noted``: names the conversion's manual notes name (unbound on purpose, and said)."""
    try:
        before, after = ast.parse(original), ast.parse(output)
    except (SyntaxError, ValueError):
        return []  # the fixed-point check reports output that does not parse
    found: list[tuple[int, str]] = []
    # A name the user's own code already reads unbound is theirs (a snippet, a name a star
    # import or an exec brings): only a name the input never read so is held against us.
    known = {name for name, _ in _unbound_at_module_level(before)} | _never_bound(before)
    for name, line in _unbound_at_module_level(after):
        if name in known or name in noted:
            continue
        known.add(name)
        found.append((line, f"the inserted code uses `{name}` at module level before anything "
                            "binds it (NameError)"))
    known_collectives = Counter(key for key, _ in _divergent_collectives(before))
    for key, line in _divergent_collectives(after):
        if known_collectives[key]:
            known_collectives[key] -= 1
            continue
        call, test = key
        found.append((line, f"the inserted {call}() runs only where `{test}` holds, a condition "
                            "that can differ between ranks: the ranks that skip it would leave "
                            "the others waiting (deadlock)"))
    return found


# -- names ---------------------------------------------------------------------------------------


def _unbound_at_module_level(tree: ast.Module) -> list[tuple[str, int]]:
    """Names module-level code reads before any module-level statement binds them."""
    bound: set[str] = set(_hoisted(tree))
    found: list[tuple[str, int]] = []
    for stmt in tree.body:
        for name, line in _reads(stmt):
            if name not in bound and name not in _BUILTINS:
                found.append((name, line))
        bound |= _binds(stmt)
    return found


def _never_bound(tree: ast.Module) -> set[str]:
    """Names the module reads and binds nowhere: they come from outside what the converter can
    see (a star import, ``exec``, a snippet's context), and are the user's."""
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and
            isinstance(n.ctx, ast.Load)}
    bound = _binds(tree) | {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments)
                            for a in [*n.posonlyargs, *n.args, *n.kwonlyargs,
                                      *([n.vararg] if n.vararg else []),
                                      *([n.kwarg] if n.kwarg else [])]}
    return read - bound


def _hoisted(tree: ast.Module) -> set[str]:
    """``global`` names of functions: bound when those run, which a static order cannot tell."""
    return {n for node in ast.walk(tree) if isinstance(node, ast.Global) for n in node.names}


def _reads(stmt: ast.stmt) -> list[tuple[str, int]]:
    """Names read when ``stmt`` runs at module level (not inside the functions, classes and
    lambdas it defines, which run later), minus those it binds first itself."""
    reads: list[tuple[str, int]] = []
    local: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for expr in [*node.decorator_list, *node.args.defaults, *node.args.kw_defaults]:
                if expr is not None:
                    visit(expr)
            return
        if isinstance(node, ast.ClassDef):
            for expr in [*node.decorator_list, *node.bases]:
                visit(expr)
            return
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
                             ast.GeneratorExp)):
            return  # own scopes; what they read is rarely an inserted name
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load) and node.id not in local:
                reads.append((node.id, node.lineno))
            else:
                local.add(node.id)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            local.update(_binds(node))
            return
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.NamedExpr)):
            value = getattr(node, "value", None)
            if value is not None:
                visit(value)
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                visit(target)
            return
        if isinstance(node, (ast.For, ast.AsyncFor)):
            visit(node.iter)
            visit(node.target)
            for child in [*node.body, *node.orelse]:
                visit(child)
            return
        if isinstance(node, ast.Try):
            for child in node.body:
                visit(child)
            for handler in node.handlers:
                if handler.name:
                    local.add(handler.name)
                for child in handler.body:
                    visit(child)
            for child in [*node.orelse, *node.finalbody]:
                visit(child)
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(stmt)
    return reads


def _binds(stmt: ast.AST) -> set[str]:
    names: set[str] = set()
    if isinstance(stmt, ast.Import):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names}
    if isinstance(stmt, ast.ImportFrom):
        return {a.asname or a.name for a in stmt.names if a.name != "*"} | (
            {"*"} if any(a.name == "*" for a in stmt.names) else set())
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= _binds(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or (
            isinstance(node, ast.ExceptHandler) and node.name
        ):
            names.add(node.name)  # type: ignore[union-attr]
    return names


# -- collectives -----------------------------------------------------------------------------


def _divergent_collectives(tree: ast.Module) -> list[tuple[tuple[str, str], int]]:
    """``((collective, condition), line)`` of each collective call under a condition that can
    differ between ranks."""
    per_rank = _per_rank_names(tree)
    libraries = _distributed_aliases(tree)
    found: list[tuple[tuple[str, str], int]] = []

    def visit(node: ast.AST, conditions: tuple[str, ...]) -> None:
        if isinstance(node, ast.If | ast.While):
            divergent = _divergent(node.test, per_rank)
            visit(node.test, conditions)
            inner = (*conditions, ast.unparse(node.test)) if divergent else conditions
            for child in [*node.body, *node.orelse]:
                visit(child, inner)
            return
        if isinstance(node, ast.IfExp):
            divergent = _divergent(node.test, per_rank)
            inner = (*conditions, ast.unparse(node.test)) if divergent else conditions
            visit(node.test, conditions)
            visit(node.body, inner)
            visit(node.orelse, inner)
            return
        if isinstance(node, ast.Call) and conditions:
            name = _last(node.func)
            if _COLLECTIVE.match(name) and _root(node.func) in libraries:
                found.append(((name, conditions[-1]), node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child, conditions)

    visit(tree, ())
    return found


def _last(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


#: Libraries whose module-level functions are collectives.
_DISTRIBUTED = ("sdp_runtime", "torch.distributed", "horovod", "smdistributed")


def _distributed_aliases(tree: ast.Module) -> set[str]:
    """Local names of the distributed libraries' modules and functions (``sdp``, ``dist``,
    ``hvd``, ``barrier`` from ``from sdp_runtime.torch import barrier``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names
                      if a.name.startswith(_DISTRIBUTED)}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(_DISTRIBUTED):
            names |= {a.asname or a.name for a in node.names}
    return names


def _root(func: ast.expr) -> str:
    while isinstance(func, ast.Attribute):
        func = func.value
    return func.id if isinstance(func, ast.Name) else ""


def _per_rank_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for _ in range(2):  # ``rank = sdp.rank(); is_main = rank == 0``
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and _divergent(node.value, names, files=False):
                for target in node.targets:
                    names |= {ast.unparse(t) for t in ast.walk(target)
                              if isinstance(t, ast.Name | ast.Attribute)}
    return names


def _divergent(test: ast.expr, per_rank: set[str], files: bool = True) -> bool:
    for node in ast.walk(test):
        if isinstance(node, ast.Call):
            name = _last(node.func)
            if _RANK.match(name) or (files and name in _FILE_TESTS):
                return True
        if isinstance(node, ast.Name | ast.Attribute) and ast.unparse(node) in per_rank:
            return True
    return False
