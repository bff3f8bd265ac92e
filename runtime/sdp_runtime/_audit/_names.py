"""Names in the script's own terms: the expression of the user's code that reaches an object.

``find(targets)`` looks, once, from the frames of the user's code that are running now (the
outermost first: the script's globals, then the locals of the functions it is in) through
attributes, list items and dict entries, breadth first, for the objects whose ids are in
``targets``, and names each by the shortest such path: ``trainer.model``, ``model.body``,
``nets['disc']``, ``layers[0]``. The walk is bounded (depth and objects visited): an object
reached only deeper keeps no name, and the audit falls back to what it knew before.

Example:
    >>> find({id(model)})  # in a script where ``trainer = Trainer(); trainer.model = model``
    {140231...: 'trainer.model'}
"""

from __future__ import annotations

import sys
import types
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

#: Attribute hops followed from a variable (``trainer.model.body`` is 3).
DEPTH = 5
#: Objects looked at, at most, in one search.
BUDGET = 20000
#: Items looked at in one list, tuple or dict.
ITEMS = 64

_PLAIN = (int, float, complex, str, bytes, bytearray, bool, type(None), range, slice,
          types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType,
          types.MethodType, types.CodeType, types.FrameType)


def key(parent: str, name: Any) -> str:
    """``parent.name`` for an identifier, ``parent[0]`` for a number, else ``parent['k']``
    (a torch module's submodules: ``Sequential`` and ``ModuleDict`` take all three).

    Example:
        >>> key("model", "0"), key("model", "body"), key("", "model")
        ('model[0]', 'model.body', 'model')
    """
    text = str(name)
    if text.isidentifier():
        return f"{parent}.{text}" if parent else text
    if text.isdigit():
        return f"{parent}[{text}]"
    return f"{parent}[{text!r}]"


def user_frames(is_user: Callable[[str], bool], start: Any = None) -> list[Any]:
    """The frames of the user's code on this thread's stack, outermost first."""
    frame = start if start is not None else sys._getframe(1)
    found = []
    while frame is not None:
        if is_user(frame.f_code.co_filename):
            found.append(frame)
        frame = frame.f_back
    found.reverse()
    return found


def find(targets: set[int], frames: Iterable[Any], skip: Callable[[Any], bool] = lambda o: False,
         children: Callable[[Any], Iterable[tuple[str, Any]] | None] = lambda o: None
         ) -> dict[int, str]:
    """The shortest path from a variable of ``frames`` to each object of ``targets`` found.

    Arguments:
        targets: ids of the objects to name.
        frames: the frames whose variables start the walk (outermost first: on a tie in
            length, the first frame's name is kept).
        skip: objects not to look into (tensors, say); they can still be targets.
        children: the named parts of an object, when the framework knows them better than
            its ``__dict__`` (a torch module's submodules); None: its attributes.

    Example:
        >>> find({id(model)}, user_frames(is_user))
    """
    names: dict[int, str] = {}
    if not targets:
        return names
    seen: set[int] = set()
    queue: deque[tuple[Any, str, int]] = deque()
    for frame in frames:
        scopes = [frame.f_locals]
        if frame.f_globals is not frame.f_locals:
            scopes.append(frame.f_globals)
        for scope in scopes:
            for name, value in list(scope.items()):
                if not (name.startswith("__") and name.endswith("__")):
                    queue.append((value, name, 1))
    budget = BUDGET
    while queue and budget and len(names) < len(targets):
        obj, path, depth = queue.popleft()
        ident = id(obj)
        if ident in seen:
            continue
        seen.add(ident)
        budget -= 1
        if ident in targets:
            names.setdefault(ident, path)
        if depth >= DEPTH or isinstance(obj, _PLAIN) or skip(obj):
            continue
        try:
            parts = _parts(obj, children)
        except Exception:
            continue
        for suffix, value in parts:
            if id(value) not in seen:
                queue.append((value, path + suffix, depth + 1))
    return names


def _parts(obj: Any, children: Callable[[Any], Iterable[tuple[str, Any]] | None]
           ) -> list[tuple[str, Any]]:
    """``(suffix, value)``: ``.name`` for an attribute, ``[0]`` / ``['k']`` for an item."""
    own = children(obj)
    if own is not None:
        return [(key("_", name)[1:], value) for name, value in own]
    if isinstance(obj, (list, tuple)):
        return [(f"[{i}]", v) for i, v in enumerate(obj[:ITEMS])]
    if isinstance(obj, dict):
        return [(f"[{k!r}]", v) for k, v in list(obj.items())[:ITEMS]
                if isinstance(k, (str, int))]
    attrs = getattr(obj, "__dict__", None)
    if not isinstance(attrs, dict):
        return []
    return [(f".{k}", v) for k, v in list(attrs.items())
            if isinstance(k, str) and k.isidentifier() and not k.startswith("__")]
