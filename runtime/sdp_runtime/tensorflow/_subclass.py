"""Subclasses made on the fly, the way Horovod wraps tapes and optimizers."""

from __future__ import annotations

_CACHE: dict[tuple[type, type], type] = {}


def mixed_class(mixin: type, base: type) -> type:
    """Return a subclass of ``base`` with ``mixin``'s overrides first, made once per pair.

    It carries ``base``'s name and module, so that reprs, error messages and Keras serialization
    name the user's class, not ours.
    """
    key = (mixin, base)
    if key not in _CACHE:
        _CACHE[key] = type(
            base.__name__,
            (mixin, base),
            {"__module__": base.__module__, "__qualname__": base.__qualname__},
        )
    return _CACHE[key]
