"""Reading and building code: source text of a node, call arguments, ``x * sdp.size()``."""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

if TYPE_CHECKING:
    from .model import FileModel

#: How a spelling helper (``builders.torch_spelling``, ``keras.keras_spelling``) asks for an import
#: the file lacks: ``add_import(module, obj=None, asname=None)`` (a transform's ``add_import``).
#: The program layer only asks; scheduling the edit is the transform's.
AddImport = Callable[..., None]

_EQUAL = cst.AssignEqual(
    whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
)


_TIGHT_OPERATORS = (cst.Multiply, cst.Divide, cst.FloorDivide, cst.Modulo, cst.Power)


_ATOMS = (
    cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer, cst.Float,
    cst.SimpleString, cst.List, cst.Tuple, cst.Dict,
)


def _operand(expr: cst.BaseExpression) -> cst.BaseExpression:
    """``expr`` as the left operand of ``*`` or ``//``: parenthesised unless it binds tighter."""
    if expr.lpar or isinstance(expr, (*_ATOMS, cst.UnaryOperation)) or (
        isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, _TIGHT_OPERATORS)
    ):
        return expr
    return expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def size_factor(sdp: str, mode: str) -> str:
    return f"{sdp}.size()" if mode == "linear" else f"{sdp}.size() ** 0.5"


def times_size(expr: cst.BaseExpression, sdp: str, mode: str = "linear") -> cst.BaseExpression:
    """``expr * sdp.size()`` (``** 0.5`` for ``mode="sqrt"``)."""
    return cst.BinaryOperation(
        left=_operand(expr),
        operator=cst.Multiply(),
        right=cst.parse_expression(size_factor(sdp, mode)),
    )


def divided_by_size(expr: cst.BaseExpression, sdp: str) -> cst.BaseExpression:
    """``expr // sdp.size()``."""
    return cst.BinaryOperation(
        left=_operand(expr), operator=cst.FloorDivide(), right=cst.parse_expression(f"{sdp}.size()")
    )


def mentions(fm: FileModel, node: cst.CSTNode, *names: str) -> bool:
    """Whether ``node`` (original) contains a call to one of ``names`` (qualified)."""
    return any(
        fm.refers_to(call.func, *names)
        for call in findall(node, m.Call())
        if isinstance(call, cst.Call)
    )


def mentions_size(fm: FileModel, node: cst.CSTNode) -> bool:
    return mentions(fm, node, f"{fm.runtime_module}.size")


def code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def arg_named(call: cst.Call, keyword: str, position: int | None = None) -> cst.Arg | None:
    """The argument bound to parameter ``keyword`` (at ``position`` when passed positionally).

    Keywords are found wherever they are, after ``*args`` or ``**kwargs`` too; positions are not
    known past ``*args``. None may still mean that ``**kwargs`` holds it (see ``double_star``)."""
    positional = 0
    for arg in call.args:
        if arg.keyword is not None:
            if arg.keyword.value == keyword:
                return arg
        elif arg.star == "*":
            position = None
        elif not arg.star:
            if position is not None and positional == position:
                return arg
            positional += 1
    return None


def double_star(call: cst.Call) -> cst.Arg | None:
    """The call's first ``**kwargs`` argument, if any."""
    return next((arg for arg in call.args if arg.star == "**"), None)


def replace_arg(call: cst.Call, old: cst.Arg, value: cst.BaseExpression) -> cst.Call:
    """``call`` (updated) with the argument at ``old``'s index given ``value``."""
    index = _index_of(call, old)
    args = list(call.args)
    args[index] = args[index].with_changes(value=value)
    return call.with_changes(args=args)


def _index_of(call: cst.Call, arg: cst.Arg) -> int:
    for i, a in enumerate(call.args):
        if a is arg:
            return i
    raise ValueError("argument not in call")


def add_keyword(
    call: cst.Call, keyword: str, value: cst.BaseExpression, *, first: bool
) -> cst.Call:
    """``call`` with ``keyword=value`` added first (or last), keeping the call's layout."""
    new = cst.Arg(value, keyword=cst.Name(keyword), equal=_EQUAL)
    args = list(call.args)
    if not args:
        return call.with_changes(args=[new])
    if first:
        comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        return call.with_changes(args=[new.with_changes(comma=comma), *args])
    last = args[-1]
    if isinstance(last.comma, cst.Comma):  # one argument a line: the new one goes on its own line
        between = (
            args[-2].comma
            if len(args) > 1 and isinstance(args[-2].comma, cst.Comma)
            else cst.Comma(whitespace_after=call.whitespace_before_args)
        )
        args[-1] = last.with_changes(comma=between)
        return call.with_changes(args=[*args, new.with_changes(comma=last.comma)])
    args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return call.with_changes(args=[*args, new])


def insert_keyword(call: cst.Call, after: int, keyword: str, value: cst.BaseExpression) -> cst.Call:
    """``call`` with ``keyword=value`` right after argument ``after`` (-1: first), in the call's
    layout: one argument per line stays one per line, a trailing comma stays trailing."""
    equal = cst.AssignEqual(
        whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
    )
    new = cst.Arg(value, keyword=cst.Name(keyword), equal=equal)
    args = list(call.args)
    if not args:
        return call.with_changes(args=[new])
    if after < len(args) - 1:
        # the new argument takes the separator that follows ``after`` (it leads to the next one)
        sep = args[after].comma if after >= 0 else cst.Comma(
            whitespace_after=_line_break(call.whitespace_before_args) or cst.SimpleWhitespace(" ")
        )
        return call.with_changes(args=[*args[: after + 1], new.with_changes(comma=sep),
                                       *args[after + 1 :]])
    last = args[-1]
    if len(args) > 1 and isinstance(args[-2].comma, cst.Comma):
        between = args[-2].comma.whitespace_after
    else:
        between = _line_break(call.whitespace_before_args) or cst.SimpleWhitespace(" ")
    args[-1] = last.with_changes(
        comma=cst.Comma(whitespace_after=between), whitespace_after_arg=cst.SimpleWhitespace("")
    )
    return call.with_changes(
        args=[
            *args,
            new.with_changes(comma=last.comma, whitespace_after_arg=last.whitespace_after_arg),
        ]
    )


def _line_break(ws: cst.BaseParenthesizableWhitespace) -> cst.ParenthesizedWhitespace | None:
    """``ws`` without its comment when it breaks the line (``(\\n    arg``), else None."""
    if isinstance(ws, cst.ParenthesizedWhitespace):
        return ws.with_changes(first_line=cst.TrailingWhitespace())
    return None


def end_of_import_block(module: cst.Module) -> cst.BaseStatement | None:
    """The last statement of the file's first block of top-level imports.

    Usually the block that opens the file (after its docstring); in a file that starts with other
    statements (``CONFIG = {...}`` then ``import torch``), the first imports that come later, so
    that what goes after the block (``init()``, ``torch.cuda.set_device``) has torch imported.
    ``__future__`` imports alone do not make a block. Top-level environment settings among (or
    right after) the imports belong to the block (``import os``, ``os.environ["KERAS_BACKEND"] =
    ...``, ``import keras``): the framework and the runtime read them when they start, so what goes
    after the block must come after them.
    """
    last = None
    for stmt in module.body:
        is_import = m.matches(stmt, m.SimpleStatementLine([m.Import() | m.ImportFrom()]))
        future = m.matches(stmt, m.SimpleStatementLine([m.ImportFrom(module=m.Name("__future__"))]))
        if (is_import and not future) or (last is not None and is_environment_setting(stmt)):
            last = stmt
        elif last is not None:
            break
    return last


def first_import_block_end(module: cst.Module) -> cst.BaseStatement | None:
    """Where libcst's ``AddImportsVisitor`` adds imports: the last import of the imports that
    open the file (after a docstring), or None when the file does not open with imports."""
    body = list(module.body)
    docstring = m.SimpleStatementLine([m.Expr(m.SimpleString())])
    start = 1 if body and m.matches(body[0], docstring) else 0
    last = None
    for stmt in body[start:]:
        if not m.matches(stmt, m.SimpleStatementLine([m.Import() | m.ImportFrom()])):
            break
        last = stmt
    return last


_ENVIRON = m.Attribute(value=m.Name("os"), attr=m.Name("environ")) | m.Name("environ")


def is_environment_setting(stmt: cst.CSTNode) -> bool:
    """``os.environ["X"] = "1"``, ``os.environ.setdefault(...)``/``update(...)``,
    ``os.putenv(...)`` as a whole top-level statement line."""
    if not isinstance(stmt, cst.SimpleStatementLine) or not stmt.body:
        return False
    for small in stmt.body:
        if isinstance(small, cst.Assign) and all(
            m.matches(t.target, m.Subscript(value=_ENVIRON)) for t in small.targets
        ):
            continue
        if m.matches(
            small,
            m.Expr(
                m.Call(
                    func=m.Attribute(value=_ENVIRON, attr=m.Name("setdefault") | m.Name("update"))
                    | m.Attribute(value=m.Name("os"), attr=m.Name("putenv"))
                )
            ),
        ):
            continue
        return False
    return True


def is_none(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Name) and expr.value == "None"


def is_false(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Name) and expr.value in ("False", "None")


def is_empty_list(expr: cst.CSTNode) -> bool:
    """``[]`` or ``list()``: a list made empty, to be filled later (``params.append(p)``)."""
    return (isinstance(expr, cst.List) and not expr.elements) or (
        isinstance(expr, cst.Call) and not expr.args and isinstance(expr.func, cst.Name)
        and expr.func.value == "list"
    )


def is_simple_reference(expr: cst.BaseExpression) -> bool:
    """A name or a dotted name: cheap and the same each time it is read."""
    while isinstance(expr, cst.Attribute):
        expr = expr.value
    return isinstance(expr, cst.Name)


def is_movable(expr: cst.BaseExpression) -> bool:
    return is_simple_reference(expr) or isinstance(expr, (cst.Integer, cst.SimpleString))


def literal_keys(node: cst.Dict) -> list[str] | None:
    keys: list[str] = []
    for element in node.elements:
        if not isinstance(element, cst.DictElement) or not isinstance(
            element.key, cst.SimpleString
        ):
            return None
        value = element.key.evaluated_value
        keys.append(value if isinstance(value, str) else "")
    return keys


def append_arg(args: list[cst.Arg], new: cst.Arg, call: cst.Call) -> list[cst.Arg]:
    """``args`` with ``new`` last, keeping a trailing comma and one-argument-a-line layouts."""
    if not args:
        return [new]
    last = args[-1]
    if isinstance(last.comma, cst.Comma):
        # A trailing comma: the new argument goes after it, laid out as the others are.
        separator = (
            args[-2].comma.whitespace_after
            if len(args) > 1 and isinstance(args[-2].comma, cst.Comma)
            else call.whitespace_before_args
        )
        args[-1] = last.with_changes(comma=last.comma.with_changes(whitespace_after=separator))
        return [*args, new.with_changes(comma=last.comma)]
    args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return [*args, new]


def fix_last_comma(args: list[cst.Arg], original: Sequence[cst.Arg]) -> None:
    if args and len(original) > len(args):
        args[-1] = args[-1].with_changes(comma=original[-1].comma)


def target_names(target: cst.BaseExpression) -> list[cst.Name]:
    if isinstance(target, cst.Name):
        return [target]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for e in target.elements for n in target_names(e.value)]
    if isinstance(target, cst.StarredElement):
        return target_names(target.value)
    return []


def prepend_elements(value: cst.List, new: cst.List) -> cst.List:
    if not value.elements:
        return new
    # A list written one callback a line gets the new ones a line each, at the same indent.
    after = value.lbracket.whitespace_after
    between: cst.BaseParenthesizableWhitespace = cst.SimpleWhitespace(" ")
    if isinstance(after, cst.ParenthesizedWhitespace):  # (a comment after ``[`` stays there)
        between = cst.ParenthesizedWhitespace(indent=after.indent, last_line=after.last_line)
    elements = [e.with_changes(comma=cst.Comma(whitespace_after=between)) for e in new.elements]
    return value.with_changes(elements=[*elements, *value.elements])


def elements_list(elements: list[cst.BaseElement]) -> cst.List:
    return cst.List(elements=fix_commas(elements))


def fix_commas(elements: list[cst.BaseElement]) -> list[cst.BaseElement]:
    """Elements taken out of a list: single-line commas between them, none after the last."""
    fixed = [
        e.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        for e in elements[:-1]
    ]
    return [*fixed, elements[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)] if elements else []


def sum_operand(expr: cst.BaseExpression, *, ifexp: bool = False) -> cst.BaseExpression:
    """``expr`` parenthesised where ``+`` (or a conditional's branch) would bind it wrongly."""
    simple = (
        cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.List, cst.Integer, cst.SimpleString
    )
    if (
        expr.lpar
        or isinstance(expr, simple)
        or (ifexp and not isinstance(expr, (cst.IfExp, cst.Lambda)))
    ):
        return expr
    return expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def names_read(expr: cst.CSTNode) -> list[cst.Name]:
    """The names ``expr`` reads (not attribute names or keywords)."""
    skip = {id(a.attr) for a in findall(expr, m.Attribute()) if isinstance(a, cst.Attribute)}
    skip |= {
        id(a.keyword) for a in findall(expr, m.Arg()) if isinstance(a, cst.Arg) and a.keyword
    }
    return [n for n in findall(expr, m.Name()) if isinstance(n, cst.Name) and id(n) not in skip]


def counts_up(body: cst.CSTNode, counter: str) -> bool:
    """Whether ``body`` increases ``counter`` (``step += 1``, ``step = step + 1``)."""
    if findall(body, m.AugAssign(target=m.Name(counter), operator=m.AddAssign())):
        return True
    return bool(
        findall(
            body,
            m.Assign(
                targets=[m.AssignTarget(target=m.Name(counter))],
                value=m.BinaryOperation(left=m.Name(counter), operator=m.Add()),
            ),
        )
    )


def assigned_target(fm: FileModel, value: cst.CSTNode) -> cst.BaseExpression | None:
    """The target ``value`` is assigned to: ``model`` of ``model = Net()``, ``netD`` of
    ``netG, netD = Generator(), Discriminator()``; None for anything else."""
    parent = fm.parent(value)
    if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
        return parent.targets[0].target
    if not isinstance(parent, cst.Element):
        return None
    values = fm.parent(parent)
    assign = fm.parent(values) if values is not None else None
    if not (isinstance(values, cst.Tuple) and isinstance(assign, cst.Assign)
            and len(assign.targets) == 1 and assign.value is values):
        return None
    targets = assign.targets[0].target
    if not isinstance(targets, (cst.Tuple, cst.List)) or len(targets.elements) != len(
        values.elements
    ):
        return None
    position = next(i for i, e in enumerate(values.elements) if e is parent)
    return targets.elements[position].value


class _FieldOrder(cst.CSTVisitor):
    """Records the fields a node's ``_visit_and_replace_children`` visits, in its order, without
    going below them (where libcst's source cannot be read)."""

    def __init__(self) -> None:
        self.fields: list[str] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        return False

    def on_leave(self, original_node: cst.CSTNode) -> None:
        pass

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        self.fields.append(attribute)

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        pass


#: Per node class, the fields libcst's visit walks, in its (source) order. Read from the source
#: of the class's ``_visit_and_replace_children`` (``visit_required(self, "func", ...)`` ...):
#: static, where a node visits a field only when it is set (an f-string's ``format_spec``).
_FIELDS: dict[type[cst.CSTNode], tuple[str, ...]] = {}
_VISITED_FIELD = re.compile(r'visit_\w+\(\s*self,\s*"(\w+)"')


def _fields(node: cst.CSTNode) -> tuple[str, ...]:
    order = _FIELDS.get(type(node))
    if order is None:
        try:
            source = inspect.getsource(type(node)._visit_and_replace_children)
            names = _VISITED_FIELD.findall(source)
        except (OSError, TypeError):  # no source: the fields this node visits
            recorder = _FieldOrder()
            node._visit_and_replace_children(recorder)
            names = recorder.fields
        order = _FIELDS[type(node)] = tuple(dict.fromkeys(names))
    return order


def walk(node: cst.CSTNode, visitor: cst.CSTVisitor) -> None:
    """``node.visit(visitor)`` for a read-only visitor without per-attribute hooks
    (``analysis.Visitor``): the same ``on_visit``/``on_leave`` calls on the same nodes in the
    same order, without libcst rebuilding every node on the way back up (a CSTVisitor's walk
    builds a copy of the tree it then throws away), and one frame per level instead of three.
    ``tests/program/test_walk.py`` compares the two walks over the fixtures."""
    if visitor.on_visit(node):
        for name in _fields(node):
            child = getattr(node, name)
            kind = _KINDS.get(type(child)) or _kind(type(child))
            if kind is _NODE:
                walk(child, visitor)
            elif kind is _SEQUENCE:
                for item in child:
                    walk(item, visitor)
    visitor.on_leave(node)


#: The node classes that hold only a file's layout: whitespace, comments, newlines and
#: punctuation. Everything under one of them is of these classes too. About 60% of libcst's
#: nodes (30,927 nodes in a 1,000-line script, 19,000 of them these); the index, qualified names
#: and detection ask nothing of them (``walk_code``).
LAYOUT: frozenset[type[cst.CSTNode]] = frozenset({
    cst.SimpleWhitespace, cst.ParenthesizedWhitespace, cst.TrailingWhitespace, cst.EmptyLine,
    cst.Newline, cst.Comment, cst.Comma, cst.Dot, cst.Colon, cst.Semicolon, cst.AssignEqual,
    cst.LeftParen, cst.RightParen, cst.LeftSquareBracket, cst.RightSquareBracket,
    cst.LeftCurlyBrace, cst.RightCurlyBrace,
})
#: Fields that hold layout nodes only, whatever the node (``lpar``: a sequence of ``LeftParen``,
#: ``whitespace_*``: whitespace): ``walk_code`` does not read them.
_LAYOUT_FIELDS = frozenset({
    "lpar", "rpar", "comma", "semicolon", "leading_lines", "lines_after_decorators",
    "trailing_whitespace", "header", "footer",
})
#: Per node class, the fields ``walk_code`` reads: ``_fields`` less the layout ones.
_CODE_FIELDS: dict[type[cst.CSTNode], tuple[str, ...]] = {}


def _code_fields(node: cst.CSTNode) -> tuple[str, ...]:
    found = _CODE_FIELDS[type(node)] = tuple(
        name for name in _fields(node)
        if name not in _LAYOUT_FIELDS and not name.startswith("whitespace")
    )
    return found


def walk_code(node: cst.CSTNode, visitor: cst.CSTVisitor) -> None:
    """``walk`` without the layout nodes (``LAYOUT``) and what is under them: the other nodes,
    in ``walk``'s order, with the same parents. The binding index, the qualified names and
    detection ask nothing of whitespace and punctuation, and these are most of a tree's nodes:
    the per-node records of those walks (order, scope, parent) are the most memory a long
    file's conversion holds. ``tests/program/test_walk_code.py`` compares it with ``walk``."""
    if visitor.on_visit(node):
        fields = _CODE_FIELDS.get(type(node))
        if fields is None:
            fields = _code_fields(node)
        for name in fields:
            child = getattr(node, name)
            kind = _KINDS.get(type(child)) or _kind(type(child))
            if kind is _NODE:
                if type(child) not in LAYOUT:
                    walk_code(child, visitor)
            elif kind is _SEQUENCE:
                for item in child:
                    if type(item) not in LAYOUT:
                        walk_code(item, visitor)
    visitor.on_leave(node)


_NODE, _SEQUENCE, _OTHER = "node", "sequence", "other"
#: Per class of a field's value, ``_NODE``, ``_SEQUENCE`` or ``_OTHER``: ``isinstance`` of
#: libcst's abstract ``CSTNode`` goes through ``abc``'s check, about a fifth of a walk's time.
_KINDS: dict[type, str] = {}


def _kind(cls: type) -> str:
    kind = _KINDS[cls] = (
        _NODE if issubclass(cls, cst.CSTNode)
        else _SEQUENCE if issubclass(cls, (tuple, list)) else _OTHER
    )
    return kind


class _Finder(cst.CSTVisitor):
    def __init__(self, matcher: m.BaseMatcherNode | m.MatchIfTrue[cst.CSTNode]) -> None:
        self.matcher = matcher
        self.found: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if m.matches(node, self.matcher):
            self.found.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        pass


def findall(
    tree: cst.CSTNode | cst.MaybeSentinel | cst.RemovalSentinel | None,
    matcher: m.BaseMatcherNode | m.MatchIfTrue[cst.CSTNode],
) -> list[cst.CSTNode]:
    """``libcst.matchers.findall`` (without metadata) over ``walk``: the nodes under ``tree``
    (itself included) that ``matcher`` matches, in walk order."""
    if not isinstance(tree, cst.CSTNode):
        return []
    kind = _node_kind(matcher)
    if kind is None:  # OneOf, AllOf, MatchIfTrue...: libcst's own test on every node
        finder = _Finder(matcher)
        walk(tree, finder)
        return finder.found
    # A node matcher (``m.Call(func=...)``) matches only nodes of its class's name (libcst's
    # ``_node_matches`` tests that first): the others are passed over without asking it, and
    # a matcher that cares about no field (``m.Name()``) is that test alone.
    name, anything = kind
    return [
        node for node in _preorder(tree)
        if type(node).__name__ == name and (anything or m.matches(node, matcher))
    ]


def _node_kind(matcher: object) -> tuple[str, bool] | None:
    """For a matcher of one node class (``m.Call(...)``): its class's name, and whether it
    cares about no field; None for the others."""
    cls = type(matcher)
    if cls.__module__ != "libcst.matchers" or not isinstance(matcher, m.BaseMatcherNode):
        return None
    anything = all(
        isinstance(getattr(matcher, f.name), m.DoNotCareSentinel)
        for f in dataclasses.fields(matcher)  # type: ignore[arg-type]
        if f.name != "_metadata"
    )
    return cls.__name__, anything


def _preorder(tree: cst.CSTNode) -> list[cst.CSTNode]:
    """The nodes ``walk`` visits under ``tree``, in its order (parents first)."""
    found: list[cst.CSTNode] = []
    todo: list[cst.CSTNode] = [tree]
    while todo:
        node = todo.pop()
        found.append(node)
        children: list[cst.CSTNode] = []
        for name in _fields(node):
            child = getattr(node, name)
            kind = _KINDS.get(type(child)) or _kind(type(child))
            if kind is _NODE:
                children.append(child)
            elif kind is _SEQUENCE:
                children.extend(child)
        todo.extend(reversed(children))
    return found
