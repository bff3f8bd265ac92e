"""What the CLI tells the user: per-file outcomes, and the report in text, JSON or GitHub form."""

from __future__ import annotations

import json
import shlex
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from .changes import Change

Status = Literal["converted", "unchanged", "skipped", "failed"]
ReportFormat = Literal["text", "json", "github"]

#: Version of the JSON report schema (docs/cli.md, "Reports").
JSON_SCHEMA_VERSION = 1


@dataclass
class FileOutcome:
    """What happened to one input file. ``message`` explains a skip or failure."""

    path: str
    status: Status
    kind: str = ""
    #: Why the file was judged a training script (or what distributes it already).
    reason: str = ""
    changes: list[Change] = field(default_factory=list)
    message: str = ""
    diff: str = ""
    #: The result was written (in place or under ``-o``).
    written: bool = False
    #: The engine converted the file in this run (not answered by the cache).
    computed: bool = False
    #: What the conversion gives (written or not), for the whole-program contract; not reported.
    output: bytes | None = field(default=None, repr=False)
    #: What was read, where the conversion changed it (lines of notes on ``output`` map back).
    source: bytes | None = field(default=None, repr=False)
    #: The contract of the program this file is the entry point of (``contract.EntryResult``'s
    #: JSON form); None when it is none.
    contract: dict[str, object] | None = None
    #: The program this file is the entry point of does not hold its contract (a part missing
    #: or unknown), wherever the notes saying so landed: the file needs attention.
    program_attention: bool = False

    @property
    def manual_count(self) -> int:
        return sum(1 for c in self.changes if c.manual)

    @property
    def needs_attention(self) -> bool:
        """A converted or unchanged file with a manual item, or the entry point of a program
        whose contract does not hold: not done until a person looks."""
        return self.status in ("converted", "unchanged") and (
            self.manual_count > 0 or self.program_attention)


def summary_counts(outcomes: Sequence[FileOutcome]) -> Counter[str]:
    """Files by outcome, each counted once: ``attention`` (converted or unchanged, with manual
    items), ``converted`` and ``unchanged`` (clean), ``skipped``, ``failed``."""
    return Counter("attention" if o.needs_attention else o.status for o in outcomes)


def summary_line(outcomes: Sequence[FileOutcome], check: bool = False) -> str:
    counts = summary_counts(outcomes)
    manual = sum(o.manual_count for o in outcomes)
    verb = "would be converted" if check else "converted"
    return (
        f"{counts['converted']} {verb}, {counts['attention']} need attention, "
        f"{counts['unchanged']} unchanged, {counts['skipped']} skipped, {counts['failed']} failed; "
        f"{manual} manual items"
    )


def first_run_hint(outcomes: Sequence[FileOutcome], written_to: dict[str, str]) -> str | None:
    """The line that says how to check the first run of what this run converted and wrote, naming
    the file (an entry point first: the program's, in project mode); None when nothing was.

    ``written_to`` maps a file's path in the outcomes to where it was written (``-o``).

    Example:
        >>> first_run_hint([FileOutcome("train.py", "converted", written=True)], {})
        'sdp-convert: first run of a converted script: sdp-run --audit -n 2 train.py checks ...'
    """
    converted = [o for o in outcomes if o.written and o.status == "converted"]
    if not converted:
        return None
    entry = next((o for o in converted if o.contract is not None), converted[0])
    path = written_to.get(entry.path, entry.path)
    command = f"sdp-run --audit -n 2 {shlex.quote(path)}"
    if path.endswith(".ipynb"):
        from .notebook import run_hint

        return run_hint(command)
    return (f"sdp-convert: first run of a converted script: {command} checks that its ranks "
            "train one model on split data")


def render(outcomes: Sequence[FileOutcome], fmt: ReportFormat, check: bool = False) -> str:
    if fmt == "json":
        return _json(outcomes, check)
    if fmt == "github":
        return _github(outcomes)
    return _text(outcomes, check)


def _text(outcomes: Sequence[FileOutcome], check: bool) -> str:
    lines: list[str] = []
    for o in outcomes:
        if o.status == "failed":
            lines.append(o.message)
        lines.extend(c.format(o.path) for c in o.changes)
    lines.append(summary_line(outcomes, check))
    return "\n".join(lines) + "\n"


def _json(outcomes: Sequence[FileOutcome], check: bool) -> str:
    counts = summary_counts(outcomes)
    doc = {
        "version": JSON_SCHEMA_VERSION,
        "changes": [
            {
                "path": o.path,
                "line": c.line,
                "column": c.col,
                "transform": c.transform,
                "message": c.message,
                "manual": c.manual,
            }
            for o in outcomes
            for c in o.changes
        ],
        "files": [
            {"path": o.path, "status": o.status, "attention": o.needs_attention, "kind": o.kind,
             "reason": o.reason, "message": o.message,
             **({"contract": o.contract} if o.contract is not None else {})}
            for o in outcomes
        ],
        "summary": {
            "converted": counts["converted"],
            "attention": counts["attention"],
            "unchanged": counts["unchanged"],
            "skipped": counts["skipped"],
            "failed": counts["failed"],
            "manual": sum(o.manual_count for o in outcomes),
            "check": check,
        },
    }
    return json.dumps(doc, indent=2) + "\n"


def _escape(text: str) -> str:
    # GitHub workflow commands: data needs %, CR, LF escaped; properties also , and :.
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _prop(text: str) -> str:
    return _escape(text).replace(":", "%3A").replace(",", "%2C")


def _github(outcomes: Sequence[FileOutcome]) -> str:
    lines = []
    for o in outcomes:
        if o.status == "failed":
            lines.append(f"::error file={_prop(o.path)},title=sdp-convert::{_escape(o.message)}")
        for c in o.changes:
            level = "warning" if c.manual else "notice"
            title = _prop(f"sdp-convert [{c.transform}]")
            lines.append(
                f"::{level} file={_prop(o.path)},line={c.line},col={c.col},title={title}::"
                f"{_escape(c.message)}"
            )
    return "\n".join(lines) + ("\n" if lines else "")
