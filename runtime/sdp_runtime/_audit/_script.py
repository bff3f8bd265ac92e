"""What the ranks' records say about the script's own objects, for the report's messages.

Each rank records, at an optimizer's first step, the script's names (``names`` records: the
expression that reaches each parameter's module, the optimizer, its DDP wrappers and where the
user's code made each), the steps in which a wrapper's forward was bypassed (``bypassed`` in
``grads`` records) and, per DataLoader, one ``loader`` record. ``read`` gathers them; where the
ranks differ, the lowest rank's word is kept (the same code names the same objects).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Script:
    shown: dict[str, str] = field(default_factory=dict)  # parameter key -> `model.body.weight`
    owners: dict[str, str] = field(default_factory=dict)  # parameter key -> `model`
    wrapped: dict[str, int] = field(default_factory=dict)  # parameter key -> DDP index
    optimizers: dict[str, dict[str, Any]] = field(default_factory=dict)
    ddps: dict[int, dict[str, Any]] = field(default_factory=dict)  # name, where
    bypass: dict[int, dict[str, Any]] = field(default_factory=dict)  # steps, site
    loaders: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # rank -> records

    def module(self, key: str) -> str:
        """The module holding parameter ``key``, in the script's terms when known."""
        name = self.shown.get(key, key)
        sep = "/" if "/" in name else "."
        head, _, _ = name.rpartition(sep)
        return head or name

    def modules(self, keys: Iterable[str], most: int = 3) -> str:
        """```model.body`, `model.head``` (up to ``most``, then how many more)."""
        found = list(dict.fromkeys(self.module(k) for k in keys))
        shown = ", ".join(f"`{m}`" for m in found[:most])
        return shown + (f" and {len(found) - most} more" if len(found) > most else "")

    def names(self, keys: Iterable[str], most: int = 3) -> str:
        """```model.scale`, `model.bn.mask``` (up to ``most``, then how many more)."""
        found = list(dict.fromkeys(self.shown.get(k, k) for k in keys))
        shown = ", ".join(f"`{m}`" for m in found[:most])
        return shown + (f" and {len(found) - most} more" if len(found) > most else "")

    def owner(self, keys: Iterable[str]) -> str:
        """The models holding ``keys`` (```trainer.model```), or "the model"."""
        found = list(dict.fromkeys(self.owners[k] for k in keys if k in self.owners))
        return " and ".join(f"`{o}`" for o in found[:2]) if found else "the model"

    def optimizer(self, opt: str) -> str:
        """```optimizer `opt` (made at train.py:30)```, or "the optimizer"."""
        info = self.optimizers.get(opt) or {}
        name = info.get("name")
        what = f"optimizer `{name}`" if name else f"the {info.get('class', '')} optimizer".replace(
            "the  ", "the ")
        where = info.get("where")
        return what + (f" (made at {where})" if where and where != "?" else "")

    def wrapper(self, j: int) -> str:
        """```model` (DistributedDataParallel made at train.py:31)``."""
        info = self.ddps.get(j) or {}
        name = f"`{info['name']}`" if info.get("name") else "the model"
        where = info.get("where")
        return name + (f" (DistributedDataParallel made at {where})" if where and where != "?"
                       else " (DistributedDataParallel)")


def read(by_rank: Mapping[int, list[dict[str, Any]]]) -> Script:
    """The script's objects as the ranks' records name them."""
    script = Script()
    for rank in sorted(by_rank):
        for x in by_rank[rank]:
            kind = x.get("kind")
            if kind == "names":
                _names(script, x)
            elif kind == "grads" and x.get("bypassed"):
                for j, site in x["bypassed"].items():
                    seen = script.bypass.setdefault(int(j), {"steps": set(), "site": None})
                    seen["steps"].add(int(x["step"]))
                    if site and not seen["site"]:
                        seen["site"] = site
            elif kind == "loader":
                script.loaders.setdefault(rank, []).append(x)
    return script


def _names(script: Script, x: dict[str, Any]) -> None:
    for key, shown in (x.get("params") or {}).items():
        script.shown.setdefault(key, shown)
    for key, owner in (x.get("owners") or {}).items():
        script.owners.setdefault(key, owner)
    for key, j in (x.get("wrapped") or {}).items():
        script.wrapped.setdefault(key, int(j))
    script.optimizers.setdefault(str(x.get("opt")), x.get("optimizer") or {})
    for j, info in (x.get("ddps") or {}).items():
        script.ddps.setdefault(int(j), info)


def loader_text(rec: Mapping[str, Any]) -> str:
    """```loader `train_loader` (made at train.py:12, RandomSampler)```."""
    name = rec.get("name")
    what = f"loader `{name}`" if name else "a DataLoader"
    parts = []
    if rec.get("where") and rec["where"] != "?":
        parts.append(f"made at {rec['where']}")
    if rec.get("sampler"):
        parts.append(str(rec["sampler"]) + ("" if rec.get("split") else ", not split by rank"))
    return what + (f" ({', '.join(parts)})" if parts else "")

