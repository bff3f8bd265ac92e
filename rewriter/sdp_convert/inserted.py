"""Checks of the code a conversion inserts, made before anything is written (like the
fixed-point check): it must not break the program it goes into.

* **Names**: a module-level statement must not use a name that is bound only later, or nowhere
  (``tf.config...`` pinned in a notebook's first cell that imports only ``keras``: NameError);
  and a name the inserted code reads must be bound on every path to the read, in a function
  as at module level (``s2.set_epoch(epoch)`` in the epoch loop for a sampler made in one
  branch of an ``if``/``elif`` only: UnboundLocalError at the first epoch). Paths are followed
  through ``if``, loops (which may run no iteration; ``while True`` ends at its ``break``),
  ``try`` (a handler may run before anything of the body has), ``with``, ``match``, and end at
  ``return``, ``raise``, ``break``, ``continue``, ``sys.exit()`` and at a read of a name they
  do not bind (NameError there: past ``if __name__ == "__main__":`` that parses ``args``,
  ``for epoch in range(args.epochs):`` runs only on the path that took the block).
* **Collectives where the ranks do not all go**: ``barrier``, ``broadcast*``, ``allreduce*``,
  ``allgather*`` and ``rank0_first`` are entered by every rank or by none; under a condition that
  can differ between ranks (the rank itself, a value computed from it, a file-system test such as
  ``os.path.exists``) some ranks wait for others that never come: a deadlock. The same goes
  for what leads to one (``CollectiveReach``): a ``DistributedDataParallel``'s forward, or a
  function of the file that runs one (``dump_predictions(model, ...)`` moved under
  ``if sdp.rank() == 0:``).
* **Averaging, once per model**: a Keras model compiled with a ``DistributedOptimizer`` whose
  class (or a base class) wraps the tape of its ``train_step`` in a ``DistributedGradientTape``,
  a ``DistributedOptimizer`` over a ``DistributedDataParallel``'s parameters, a tape wrapped
  twice: the gradients would be averaged twice.

Each check compares the output with the input: what the user wrote is theirs; only what the
conversion added is held against it.
"""

from __future__ import annotations

import ast
import builtins
import re
import tokenize
from collections import Counter
from collections.abc import Callable, Iterable, Iterator

from .modules import (
    COLLECTIVE,
    CollectiveReach,
    call_name,
    distributed_aliases,
    module_nodes,
    root_name,
)

_BUILTINS = frozenset(dir(builtins)) | {"__file__", "__name__", "__doc__", "__spec__",
                                        "__builtins__", "__path__", "__package__", "__loader__",
                                        "get_ipython", "display"}
_RANK = re.compile(r"^(get_)?(local_)?rank$")
_FILE_TESTS = frozenset({"exists", "isfile", "isdir", "is_file", "is_dir", "glob", "listdir",
                         "iglob", "scandir"})


def problems(
    original: bytes, output: bytes, noted: set[str] | frozenset[str] = frozenset(),
    helpers: Iterable[tuple[str, tuple[str, ...], bool]] = (),
) -> list[tuple[int, str]]:
    """``(line, what is wrong)`` of the output's inserted code; empty when all is well.
    ``noted``: names the conversion's manual notes name (unbound on purpose, and said);
    ``helpers``: functions of other modules of the run that reach a collective
    (``ModuleFacts.collective_helpers``)."""
    helpers = tuple(helpers)
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
    # The same name read unbound on some path in the same scope of the input is the user's.
    # Only the scopes the conversion changed are followed (``_changed_functions``).
    only = _changed_functions(before, after, original, output)
    paths = {key for key, _ in _unbound_on_some_path(before, only)}
    paths |= {("<module>", name) for name in known}
    for (scope, name), line in _unbound_on_some_path(after, only):
        if (scope, name) in paths or name in noted:
            continue
        paths.add((scope, name))
        where, error = (("at module level", "NameError") if scope == "<module>" else
                        (f"in {scope}()", "UnboundLocalError"))
        found.append((line, f"the inserted code reads `{name}` {where} on a path that does "
                            f"not bind it ({error} when that path runs)"))
    known_collectives = Counter(key for key, _ in _divergent_collectives(before, helpers))
    for key, line in _divergent_collectives(after, helpers):
        if known_collectives[key]:
            known_collectives[key] -= 1
            continue
        call, test = key
        if ", which runs " in call:  # a helper or a wrapped model's forward, moved under a test
            first, rest = call.split(", which runs ", 1)
            found.append((line, f"the conversion runs {first} only where `{test}` holds, a "
                                f"condition that can differ between ranks, and it runs {rest}, "
                                "which every rank must run together: the ranks that skip it "
                                "would leave the others waiting (deadlock)"))
            continue
        found.append((line, f"the inserted {call} runs only where `{test}` holds, a condition "
                            "that can differ between ranks: the ranks that skip it would leave "
                            "the others waiting (deadlock)"))
    known_twice = Counter(key for key, _ in _averaged_twice(before))
    for key, line in _averaged_twice(after):
        if known_twice[key]:
            known_twice[key] -= 1
            continue
        found.append((line, f"the conversion averages the gradients of `{key[0]}` twice: "
                            f"{key[1]} (each average on top of the other)"))
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
    read = {n.id for n in module_nodes(tree) if isinstance(n, ast.Name) and
            isinstance(n.ctx, ast.Load)}
    bound = _binds(tree) | {a.arg for n in module_nodes(tree) if isinstance(n, ast.arguments)
                            for a in [*n.posonlyargs, *n.args, *n.kwonlyargs,
                                      *([n.vararg] if n.vararg else []),
                                      *([n.kwarg] if n.kwarg else [])]}
    return read - bound


def _hoisted(tree: ast.Module) -> set[str]:
    """``global`` names of functions: bound when those run, which a static order cannot tell."""
    return {n for node in module_nodes(tree) if isinstance(node, ast.Global) for n in node.names}


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
        for child in _children(node):
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
    for node in _subtree(stmt):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= _binds(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or (
            isinstance(node, ast.ExceptHandler) and node.name
        ):
            names.add(node.name)  # type: ignore[union-attr]
    return names


# -- names bound on every path -------------------------------------------------------------------

#: Statement calls after which nothing runs (``sys.exit()``): a path ends there.
_ENDS = frozenset({"sys.exit", "exit", "quit", "os._exit"})


def _unbound_on_some_path(
    tree: ast.Module, only: set[str] | None = None
) -> list[tuple[tuple[str, str], int]]:
    """``((scope, name), line)`` of each read of a local name (of a function, or of the module)
    that some path reaches before any statement binds it: ``UnboundLocalError`` (``NameError`` at
    module level) when that path runs. ``scope`` is the function's dotted name, ``<module>``.
    ``only``: the dotted names of the functions to follow (``None``: all); the module always."""
    found: list[tuple[tuple[str, str], int]] = []
    stars = any(isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names)
                for n in tree.body)
    if not stars:  # a star import binds names no one can list
        local = _scope_binds(tree) - _hoisted(tree)
        _Paths("<module>", local, found).block(tree.body, _Names([frozenset()]))
    for scope, function in _functions(tree, ""):
        if only is not None and scope not in only:
            continue
        args = function.args
        params = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs,
                                  *([args.vararg] if args.vararg else []),
                                  *([args.kwarg] if args.kwarg else [])]}
        declared = {n for s in _own_nodes(function) if isinstance(s, ast.Global | ast.Nonlocal)
                    for n in s.names}
        local = (_scope_binds(function) | params) - declared
        _Paths(scope, local, found).block(function.body, _Names([frozenset(params)]))
    return found


def _changed_functions(before: ast.Module, after: ast.Module, original: bytes,
                       output: bytes) -> set[str] | None:
    """The dotted names of the output's functions that are not, letter for letter, a function
    of the input of the same dotted name (``None``: all of them, when the two files' encodings
    differ). What ``_unbound_on_some_path`` finds in a function depends only on that function's
    own text (its decorators, parameters and body) and its dotted name, never on the rest of the
    module: an output function with a twin in the input finds exactly the twin's findings, all
    held to be the user's and left out. So the output's functions are followed only under the
    names returned here, and the input's under the same names (every function of the input
    that bears one: a twin under another such name would also excuse a finding); what
    ``problems`` reports is the same as when every function of both is followed
    (``tests/test_inserted_scopes.py``)."""
    if _encoding(original) != _encoding(output):
        return None
    old, new = original.splitlines(), output.splitlines()
    texts: dict[str, set[tuple[bytes, ...]]] = {}
    for scope, function in _functions(before, ""):
        texts.setdefault(scope, set()).add(_text(function, old))
    return {scope for scope, function in _functions(after, "")
            if _text(function, new) not in texts.get(scope, ())}


def _encoding(source: bytes) -> str:
    """The encoding Python reads ``source`` in (its BOM or its coding line, else UTF-8)."""
    lines = iter(source.splitlines(keepends=True)[:2])
    try:
        return tokenize.detect_encoding(lambda: next(lines, b""))[0]
    except SyntaxError:
        return ""


def _text(function: ast.FunctionDef | ast.AsyncFunctionDef,
          lines: list[bytes]) -> tuple[bytes, ...]:
    """The lines of ``function``, its decorators first: a function starts its own line, and no
    other statement shares its last line (what follows a body's ``;`` is of the body)."""
    first = min([function.lineno, *(d.lineno for d in function.decorator_list)])
    return tuple(lines[first - 1:function.end_lineno])


#: Fields that never hold a node of interest: names, numbers, flags, and ``ctx`` (the
#: ``Load``/``Store``/``Del`` marker of a name, which no check here looks at as a node).
_SCALAR_FIELDS = frozenset({"id", "attr", "name", "arg", "module", "level", "asname",
                            "type_comment", "kind", "is_async", "conversion", "ctx", "simple",
                            "tag", "rest"})
_NODE_FIELDS: dict[type, tuple[str, ...]] = {}  # node class -> its fields less the scalar ones


def _children(node: ast.AST) -> list[ast.AST]:
    """``list(ast.iter_child_nodes(node))``, in its order, less the expression contexts (a
    third of a tree's nodes, and none a check asks about), read from a per-class list of the
    fields that can hold nodes: no generator, no look at fields that hold a name or a number."""
    fields = _NODE_FIELDS.get(node.__class__)
    if fields is None:
        fields = _NODE_FIELDS[node.__class__] = tuple(
            f for f in node._fields if f not in _SCALAR_FIELDS)
    found: list[ast.AST] = []
    for field in fields:
        value = getattr(node, field, None)
        if isinstance(value, list):
            found += [item for item in value if isinstance(item, ast.AST)]
        elif isinstance(value, ast.AST):
            found.append(value)
    return found


def _subtree(node: ast.AST) -> Iterator[ast.AST]:
    """The nodes under ``node`` (itself included), depth first: ``ast.walk`` where the order
    does not matter."""
    todo = [node]
    while todo:
        current = todo.pop()
        yield current
        todo.extend(_children(current))


def _functions(node: ast.AST, prefix: str) -> list[tuple[str, ast.FunctionDef |
                                                       ast.AsyncFunctionDef]]:
    """Every function of ``node`` (methods and nested ones too), with its dotted name; the
    module's list is worked out once per tree (each check of both trees asks for it)."""
    if prefix or not isinstance(node, ast.Module):
        return _functions_of(node, prefix)
    found = getattr(node, "_sdp_functions", None)
    if found is None:
        found = node._sdp_functions = _functions_of(node, "")  # type: ignore[attr-defined]
    return found


def _functions_of(node: ast.AST, prefix: str) -> list[tuple[str, ast.FunctionDef |
                                                          ast.AsyncFunctionDef]]:
    found: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []
    for child in _children(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            name = prefix + child.name
            found.append((name, child))
            found += _functions_of(child, name + ".")
        elif isinstance(child, ast.ClassDef):
            found += _functions_of(child, prefix + child.name + ".")
        elif not isinstance(child, ast.Lambda):
            found += _functions_of(child, prefix)
    return found


def _own_nodes(function: ast.AST) -> list[ast.AST]:
    """The nodes of a function's body, not those of the functions and classes it defines;
    worked out once per node (the name checks and the averaging check both read them)."""
    found: list[ast.AST] | None = getattr(function, "_sdp_own", None)
    if found is not None:
        return found
    found = function._sdp_own = []  # type: ignore[attr-defined]
    todo = list(_children(function))
    while todo:
        node = todo.pop()
        found.append(node)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue  # its name is bound here; its body is its own scope
        if isinstance(node, ast.Lambda | ast.ListComp | ast.SetComp | ast.DictComp |
                      ast.GeneratorExp):
            continue  # their targets are their own (a walrus inside them is rare)
        todo.extend(_children(node))
    return found


def _scope_binds(function: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in _own_nodes(function):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= _binds(node) - {"*"}
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef |
                        ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names.add(node.rest)
    return names


_MOST_PATHS = 8  # more kinds of path than this are merged into what all of them bind


class _Names:
    """The names bound along each kind of path that reaches a point (``if __name__ ==
    "__main__":`` that binds ``args`` and the loaders, and the path past it that binds neither).
    A read of a name that some kinds lack ends those (NameError there): after ``for epoch in
    range(args.epochs):`` only the paths that bound ``args``, and with it the loaders, go on."""

    __slots__ = ("paths",)

    def __init__(self, paths: Iterable[frozenset[str]]) -> None:
        kinds = frozenset(paths)
        if len(kinds) > _MOST_PATHS:
            kinds = frozenset({frozenset.intersection(*kinds)})
        self.paths = kinds

    def __or__(self, names: Iterable[str]) -> _Names:
        names = frozenset(names)
        if all(names <= path for path in self.paths):
            return self  # bound on every path already (a module rebinding its loop names
            # thousands of times must not copy every path each time: the square of its length)
        return _Names(path | names for path in self.paths)

    def __sub__(self, names: Iterable[str]) -> _Names:
        names = frozenset(names)
        if all(names.isdisjoint(path) for path in self.paths):
            return self
        return _Names(path - names for path in self.paths)

    def __and__(self, other: _Names) -> _Names:
        """The join: a point reached from either."""
        return _Names(self.paths | other.paths)

    def __contains__(self, name: object) -> bool:
        """Bound on every path."""
        return all(name in path for path in self.paths)

    def common(self) -> frozenset[str]:
        return frozenset.intersection(*self.paths)

    def read(self, name: str) -> _Names:
        """After a read of ``name``: the paths that had it (the others raised), unless none had."""
        kept = [path for path in self.paths if name in path]
        return _Names(kept) if kept else self


Bound = _Names | None  # None: no path gets here (after a return, a raise, a break)


def _join(*states: Bound) -> Bound:
    """The names bound on the paths that reach a point from any of ``states``."""
    live = [s for s in states if s is not None]
    if not live:
        return None
    joined = live[0]
    for state in live[1:]:
        joined &= state
    return joined


class _Paths:
    """One scope's statements, followed along their paths, with the names each path has bound:
    a read of one of the scope's ``local`` names that some path reaches unbound is recorded."""

    def __init__(self, scope: str, local: set[str],
                 found: list[tuple[tuple[str, str], int]]) -> None:
        self.scope, self.local, self.found = scope, local, found
        self.loops: list[list[Bound]] = []  # the states at each ``break`` of the loops entered

    def block(self, body: list[ast.stmt], bound: Bound) -> Bound:
        for stmt in body:
            if bound is None:
                return None
            bound = self.stmt(stmt, bound)
        return bound

    def stmt(self, node: ast.stmt, bound: _Names) -> Bound:  # noqa: C901 - one per kind
        if isinstance(node, ast.If):
            bound = self.expr(node.test, bound)
            return _join(self.block(node.body, bound), self.block(node.orelse, bound))
        if isinstance(node, ast.While):
            bound = self.expr(node.test, bound)
            forever = isinstance(node.test, ast.Constant) and bool(node.test.value)
            return self.loop(node.body, node.orelse, bound, None if forever else bound)
        if isinstance(node, ast.For | ast.AsyncFor):
            bound = self.expr(node.iter, bound)
            return self.loop(node.body, node.orelse, self.target(node.target, bound), bound)
        if isinstance(node, ast.With | ast.AsyncWith):
            for item in node.items:
                bound = self.expr(item.context_expr, bound)
                if item.optional_vars is not None:
                    bound = self.target(item.optional_vars, bound)
            return self.block(node.body, bound)
        if isinstance(node, ast.Try | getattr(ast, "TryStar", ast.Try)):
            done = self.block(node.orelse, self.block(node.body, bound))
            # A handler may run after any statement of the body: only what was bound before.
            handled = [self.block(h.body, bound | ({h.name} if h.name else set()))
                       for h in node.handlers]
            after = _join(done, *handled)
            final = self.block(node.finalbody, bound)
            if after is None or final is None:
                return None
            return after | (final.common() - bound.common())
        if isinstance(node, ast.Match):
            bound = self.expr(node.subject, bound)
            cases = [self.block(c.body, self.expr(c.guard, bound | _captures(c.pattern))
                                if c.guard is not None else bound | _captures(c.pattern))
                     for c in node.cases]
            return _join(bound, *cases)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for expr in [*node.decorator_list, *node.args.defaults,
                         *(d for d in node.args.kw_defaults if d is not None)]:
                bound = self.expr(expr, bound)
            return bound | {node.name}
        if isinstance(node, ast.ClassDef):
            for expr in [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]:
                bound = self.expr(expr, bound)
            return bound | {node.name}
        if isinstance(node, ast.Import | ast.ImportFrom):
            return bound | (_binds(node) - {"*"})
        if isinstance(node, ast.Return | ast.Raise):
            for child in _children(node):
                bound = self.expr(child, bound)
            return None
        if isinstance(node, ast.Break):
            if self.loops:
                self.loops[-1].append(bound)
            return None
        if isinstance(node, ast.Continue):
            return None
        if isinstance(node, ast.Assign):
            bound = self.expr(node.value, bound)
            for target in node.targets:
                bound = self.target(target, bound)
            return bound
        if isinstance(node, ast.AnnAssign):
            if node.value is None:
                return bound
            return self.target(node.target, self.expr(node.value, bound))
        if isinstance(node, ast.AugAssign):
            bound = self.expr(node.value, bound)
            return self.expr(_as_read(node.target), bound)
        if isinstance(node, ast.Delete):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    bound = self.expr(_as_read(target), bound) - {target.id}
                else:
                    bound = self.expr(target, bound)
            return bound
        for child in _children(node):  # Expr, Assert, Global, Pass, ...
            bound = self.expr(child, bound)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and (
            ast.unparse(node.value.func) in _ENDS
        ):
            return None
        return bound

    def loop(self, body: list[ast.stmt], orelse: list[ast.stmt], inside: _Names,
             skipped: Bound) -> Bound:
        """A loop whose body starts with ``inside`` bound; ``skipped``: what is bound when the
        loop ends by its test (before any iteration too), None when it never does."""
        self.loops.append([])
        end = self.block(body, inside)
        breaks = self.loops.pop()
        normal = _join(skipped, end) if skipped is not None else None
        return _join(self.block(orelse, normal) if normal is not None else None, *breaks)

    def target(self, target: ast.expr, bound: _Names) -> _Names:
        for node in ast.walk(target):
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                bound = bound | {node.id}
            elif isinstance(node, ast.Subscript | ast.Attribute):
                bound = self.expr(node.value, bound)
                if isinstance(node, ast.Subscript):
                    bound = self.expr(node.slice, bound)
        return bound

    def expr(self, node: ast.AST | None, bound: _Names,
             hidden: frozenset[str] = frozenset()) -> _Names:
        """Record the reads of ``node`` (an expression) that some path reaches unbound; the
        names a walrus in it binds are bound after it."""
        if node is None:
            return bound
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                if node.id in self.local and node.id not in bound and node.id not in hidden:
                    self.found.append(((self.scope, node.id), node.lineno))
                    return bound.read(node.id)  # the paths without it raised here
                return bound
            return bound | {node.id}
        if isinstance(node, ast.NamedExpr):
            return self.expr(node.value, bound, hidden) | {node.target.id}
        if isinstance(node, ast.Lambda):
            for default in [*node.args.defaults, *(d for d in node.args.kw_defaults if d)]:
                bound = self.expr(default, bound, hidden)
            return bound  # its body runs later
        if isinstance(node, ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp):
            inner = hidden | {n.id for g in node.generators for n in ast.walk(g.target)
                              if isinstance(n, ast.Name)}
            first, *rest = node.generators
            bound = self.expr(first.iter, bound, hidden)
            parts: list[ast.AST] = [*first.ifs]
            for generator in rest:
                parts += [generator.iter, *generator.ifs]
            parts += [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            for part in parts:
                self.expr(part, bound, inner)
            return bound
        if isinstance(node, ast.BoolOp):
            # Only the first operand always runs: what a walrus binds in the others may not be.
            after = self.expr(node.values[0], bound, hidden)
            for value in node.values[1:]:
                self.expr(value, after, hidden)
            return after
        if isinstance(node, ast.IfExp):
            bound = self.expr(node.test, bound, hidden)
            return self.expr(node.body, bound, hidden) & self.expr(node.orelse, bound, hidden)
        for child in _children(node):
            bound = self.expr(child, bound, hidden)
        return bound


def _as_read(target: ast.expr) -> ast.expr:
    """``x`` of ``x += 1`` (or ``del x``) as the read it also is."""
    if isinstance(target, ast.Name):
        return ast.copy_location(ast.Name(target.id, ast.Load()), target)
    return target


def _captures(pattern: ast.pattern) -> frozenset[str]:
    return frozenset(
        name for node in ast.walk(pattern)
        for name in ([node.name] if isinstance(node, ast.MatchAs | ast.MatchStar) else
                     [node.rest] if isinstance(node, ast.MatchMapping) else [])
        if name
    )


# -- averaging, once per model -------------------------------------------------------------------


def _averaged_twice(tree: ast.Module) -> list[tuple[tuple[str, str], int]]:
    """``((model, how), line)`` of each model whose gradients the code averages twice: a
    ``DistributedOptimizer`` over the parameters of a ``DistributedDataParallel``, a tape
    wrapped twice (before a new tape is bound to its name), a Keras model compiled with a
    ``DistributedOptimizer`` whose class's ``train_step`` wraps its tape."""
    libraries = distributed_aliases(tree)

    def wrap(node: ast.AST | None, name: str) -> ast.Call | None:
        ok = isinstance(node, ast.Call) and call_name(node.func) == name and (
            root_name(node.func) in libraries)
        return node if ok else None  # type: ignore[return-value]

    found: list[tuple[tuple[str, str], int]] = []
    ddp: set[str] = set()
    steps: dict[str, int] = {}  # class -> line of its train_step's DistributedGradientTape
    for scope, function in [("<module>", tree), *_functions(tree, "")]:
        for node in _own_nodes(function):
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
                continue
            target = ast.unparse(node.targets[0])
            if wrap(node.value, "DistributedDataParallel") is not None:
                ddp.add(target)
            elif wrap(node.value, "DistributedGradientTape") is not None and scope.endswith(
                ".train_step"
            ):  # a method: its class is before the dot
                steps[scope.rsplit(".", 2)[-2]] = node.lineno
        # A tape wrapped again before a new tape is bound to its name.
        wrapped: dict[str, bool] = {}
        for line, name, wraps in sorted(_tape_events(function, wrap)):
            if wraps and wrapped.get(name):
                found.append(((f"{scope}: {name}", "the tape is wrapped in "
                               "DistributedGradientTape twice"), line))
            wrapped[name] = wraps
    for node in module_nodes(tree):
        if isinstance(node, ast.Call) and (optimizer := wrap(node, "DistributedOptimizer")):
            for inner in ast.walk(optimizer):
                if (isinstance(inner, ast.Call) and call_name(inner.func) == "parameters"
                        and isinstance(inner.func, ast.Attribute)
                        and ast.unparse(inner.func.value) in ddp):
                    found.append(((ast.unparse(inner.func.value), "its optimizer is a "
                                   "DistributedOptimizer and the model a DistributedDataParallel"),
                                  node.lineno))
                    break
    classes = _subclasses(tree, set(steps))
    for node in module_nodes(tree):
        if not (isinstance(node, ast.Call) and call_name(node.func) == "compile"
                and isinstance(node.func, ast.Attribute)):
            continue
        optimizer = next((k.value for k in node.keywords if k.arg == "optimizer"), None)
        if wrap(optimizer, "DistributedOptimizer") is None:
            continue
        model = ast.unparse(node.func.value)
        # The model the name holds there: its last assignment above the compile (a notebook
        # that reuses `model` for a plain Sequential after a subclass compiles each on its own).
        before = sorted((v for v in _assigned(tree, model) if v.lineno < node.lineno),
                        key=lambda v: v.lineno)
        values = before[-1:] if before else _assigned(tree, model)
        made = {call_name(v.func) for v in values if isinstance(v, ast.Call)}
        for cls in sorted(made & set(classes)):
            found.append(((model, f"its optimizer is a DistributedOptimizer and "
                                  f"{classes[cls]}.train_step wraps its tape in "
                                  f"DistributedGradientTape (line {steps[classes[cls]]})"),
                          node.lineno))
    return found


def _tape_events(function: ast.AST, wrap: Callable[[ast.AST | None, str], ast.Call | None]
                 ) -> list[tuple[int, str, bool]]:
    """``(line, name, wraps)``: a name bound to a new tape (``with tf.GradientTape() as t``,
    ``t = tf.GradientTape()``; False) or to its ``DistributedGradientTape`` (True)."""
    events: list[tuple[int, str, bool]] = []
    for node in _own_nodes(function):
        if isinstance(node, ast.withitem) and isinstance(node.optional_vars, ast.Name) and (
            isinstance(node.context_expr, ast.Call)
            and call_name(node.context_expr.func) == "GradientTape"
        ):
            events.append((node.context_expr.lineno, node.optional_vars.id, False))
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(
            node.targets[0], ast.Name
        ) and isinstance(node.value, ast.Call):
            if wrap(node.value, "DistributedGradientTape") is not None:
                events.append((node.lineno, node.targets[0].id, True))
            elif call_name(node.value.func) == "GradientTape":
                events.append((node.lineno, node.targets[0].id, False))
    return events


def _subclasses(tree: ast.Module, roots: set[str]) -> dict[str, str]:
    """Each class of the module that is one of ``roots`` or inherits from one (without its own
    ``train_step``) -> that root."""
    classes = {n.name: n for n in module_nodes(tree) if isinstance(n, ast.ClassDef)}
    found = {name: name for name in roots}
    changed = True
    while changed:
        changed = False
        for name, cls in classes.items():
            own = any(isinstance(s, ast.FunctionDef) and s.name == "train_step" for s in cls.body)
            base = next((found[b.id] for b in cls.bases if isinstance(b, ast.Name)
                         and b.id in found), None)
            if name not in found and base is not None and not own:
                found[name] = base
                changed = True
    return found


def _assigned(tree: ast.Module, target: str) -> list[ast.expr]:
    return [n.value for n in module_nodes(tree) if isinstance(n, ast.Assign)
            and any(ast.unparse(t) == target for t in n.targets)]


# -- collectives -----------------------------------------------------------------------------


def _divergent_collectives(
    tree: ast.Module, helpers: tuple[tuple[str, tuple[str, ...], bool], ...] = ()
) -> list[tuple[tuple[str, str], int]]:
    """``((what, condition), line)`` of each call under a condition that can differ between
    ranks that every rank must make together: a collective, or (``CollectiveReach``) a wrapped
    model's forward or a function of the file that leads to one. ``what``: the call and, for
    one that leads to a collective, the calls on the way (``dump(...), which runs model(...)``).
    """
    per_rank = _per_rank_names(tree)
    libraries = distributed_aliases(tree)
    reach = CollectiveReach(tree, helpers)
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
            name = call_name(node.func)
            if COLLECTIVE.match(name) and root_name(node.func) in libraries:
                found.append(((f"{name}()", conditions[-1]), node.lineno))
            elif (path := reach.call(node, reach.wrapped)) is not None:
                found.append(((", which runs ".join(path), conditions[-1]), node.lineno))
        for child in _children(node):
            visit(child, conditions)

    visit(tree, ())
    return found


def _per_rank_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for _ in range(2):  # ``rank = sdp.rank(); is_main = rank == 0``
        for node in module_nodes(tree):
            if isinstance(node, ast.Assign) and _divergent(node.value, names, files=False):
                for target in node.targets:
                    names |= {_dotted(t) for t in ast.walk(target)
                              if isinstance(t, ast.Name | ast.Attribute)}
    return names


#: Calls given the rank whose results are alike on every rank in what a test can ask of them:
#: a ``DistributedSampler`` has the same length on every rank (padded or cut to equal shares),
#: so ``len(loader)`` and the step counts made from it are the same everywhere.
_SAME_ON_EVERY_RANK = re.compile(r"(^|\.)DistributedSampler$")


def _divergent(test: ast.expr, per_rank: set[str], files: bool = True) -> bool:
    for node in _walk_except_samplers(test):
        if isinstance(node, ast.Call):
            name = call_name(node.func)
            if _RANK.match(name) or (files and name in _FILE_TESTS):
                return True
        if per_rank and isinstance(node, ast.Name | ast.Attribute) and _dotted(node) in per_rank:
            return True
    return False


def _dotted(node: ast.Name | ast.Attribute) -> str:
    """``ast.unparse(node)``, spelled out directly for a dotted name (``self.rank``)."""
    parts: list[str] = []
    current: ast.expr = node
    while isinstance(current, ast.Attribute):
        parts.append(current.attr)
        current = current.value
    if not isinstance(current, ast.Name):
        return ast.unparse(node)
    parts.append(current.id)
    return ".".join(reversed(parts))


def _walk_except_samplers(node: ast.AST) -> Iterator[ast.AST]:
    """``ast.walk`` without the insides of the calls ``_SAME_ON_EVERY_RANK`` names."""
    todo = [node]
    while todo:
        current = todo.pop()
        yield current
        if isinstance(current, ast.Call) and _SAME_ON_EVERY_RANK.search(call_name(current.func)):
            continue
        todo.extend(_children(current))
