"""MkDocs hook: the pages that must not drift from the code, generated at every build.

* ``transforms/<name>.md``, one per transform of ``sdp_convert.pipeline.PIPELINE``, in pipeline
  order: its one-line description and frameworks, its module docstring (the spec: before/after
  and why), its tested before/after from ``conversion/examples.md``, the messages it reports in
  the golden fixtures, and every golden fixture it changes or notes, as the fixture's report
  lines and the ``input`` -> ``expected`` diff.
* ``messages.md``: every report line of every golden fixture, by transform (Troubleshooting).
* ``performance/<name>.md``, one per ``benchmarks/results/*.md``, which it includes (pymdownx
  snippets), not copies.

The pages are added to the navigation here too, so that a new transform, fixture or result file
shows without an edit to ``mkdocs.yml``. Nothing is written to ``docs/``.
"""

from __future__ import annotations

import difflib
import re
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures"
RESULTS = REPO / "benchmarks" / "results"
EXAMPLES = REPO / "docs" / "conversion" / "examples.md"

# A report line: ``input.py:12:1: [name] message`` or ``input.py:12:1: [name] (manual) message``.
REPORT_LINE = re.compile(
    r"^(?P<where>\S+?):(?P<line>\d+):(?P<col>\d+): \[(?P<name>\w+)\] (?P<msg>.*)$")


def _transforms() -> list[Any]:
    """The transform classes in pipeline order (the installed, editable package)."""
    sys.path.insert(0, str(REPO / "rewriter"))
    from sdp_convert.pipeline import PIPELINE

    return list(PIPELINE)


@dataclass
class Fixture:
    case: str  # kind/case
    report: list[str]
    diff: str
    project: bool
    lines_by_transform: dict[str, list[str]] = field(default_factory=dict)


def _read(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)


def _diff(before: Path, after: Path, name: str) -> str:
    if not after.exists():
        return ""
    lines = difflib.unified_diff(_read(before), _read(after), f"a/{name}", f"b/{name}")
    return "".join(ln if ln.endswith("\n") else ln + "\n" for ln in lines)


def _fixtures() -> list[Fixture]:
    out = []
    for report in sorted(FIXTURES.glob("*/*/report.txt")):
        case_dir = report.parent
        case = f"{case_dir.parent.name}/{case_dir.name}"
        lines = [ln for ln in report.read_text(encoding="utf-8").splitlines()
                 if ln and not ln.startswith("#")]
        project = (case_dir / "input").is_dir()
        if project:
            diff = "".join(
                _diff(src, case_dir / "expected" / src.relative_to(case_dir / "input"),
                      str(src.relative_to(case_dir / "input")))
                for src in sorted((case_dir / "input").rglob("*"))
                if src.is_file() and "__pycache__" not in src.parts)
        else:
            diff = _diff(case_dir / "input.py", case_dir / "expected.py", "input.py")
        fixture = Fixture(case, lines, diff, project)
        for ln in lines:
            m = REPORT_LINE.match(ln)
            if m:
                fixture.lines_by_transform.setdefault(m["name"], []).append(ln)
        out.append(fixture)
    return out


def docstring_to_markdown(doc: str) -> str:
    """reStructuredText as the transforms' docstrings write it -> Markdown: ``text::`` and the
    indented block after it become ``text:`` and a fenced Python block."""
    lines = textwrap.dedent(doc).strip("\n").splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.rstrip().endswith("::"):
            head = line.rstrip()[:-2].rstrip()
            if head:
                out.append(head + ":")
            i += 1
            block: list[str] = []
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith((" ", "\t"))):
                block.append(lines[i])
                i += 1
            while block and not block[-1].strip():
                block.pop()
            out += ["", "```python", *textwrap.dedent("\n".join(block)).strip("\n").split("\n"),
                    "```", ""]
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


def _examples() -> dict[str, str]:
    """The tested before/after of each transform: the ``## `name` `` sections of
    conversion/examples.md (tests/test_readme_examples.py converts each one)."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    in_code = False
    for line in EXAMPLES.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if not in_code and line.startswith("## "):
            current = sections.setdefault(line[3:].strip().strip("`"), [])
            continue
        if not in_code and line.startswith("# "):
            current = None
            continue
        if current is not None:
            current.append(line)
    return {name: _relink("\n".join(body).strip() + "\n") for name, body in sections.items()}


def _relink(text: str) -> str:
    """Links of a conversion/ page, for a page of transforms/ (both one folder down)."""
    def fix(m: re.Match[str]) -> str:
        target = m[2]
        if target.startswith(("http:", "https:", "../")):
            return m[0]
        if target.startswith("#"):
            target = "examples.md" + target
        return f"]({'../conversion/' + target})"

    return re.sub(r"\]\((\s*)([^)\s]+)\)", fix, text)


def _fence(text: str, lang: str) -> str:
    ticks = "````" if "```" in text else "```"
    return f"{ticks}{lang}\n{text.rstrip(chr(10))}\n{ticks}\n"


def _indent(text: str) -> str:
    return textwrap.indent(text, "    ", lambda _: True)


def _messages(lines: list[str]) -> list[str]:
    """Report lines without their position, each once."""
    seen: dict[str, None] = {}
    for ln in lines:
        m = REPORT_LINE.match(ln)
        if m:
            seen.setdefault(m["msg"])
    return sorted(seen, key=lambda msg: (not msg.startswith("(manual)"), msg))


def transform_page(cls: Any, fixtures: list[Fixture], example: str | None) -> str:
    name = cls.NAME
    module = sys.modules[cls.__module__]
    frameworks = ", ".join(sorted(cls.FRAMEWORKS)) or "none (it decides per file)"
    used = [f for f in fixtures if name in f.lines_by_transform]
    parts = [
        f"# `{name}`\n",
        "<!-- Generated by docs/_hooks/generate.py from "
        f"rewriter/sdp_convert/transforms/{name}.py and fixtures/: do not edit. -->\n",
        f"**{' '.join(cls.DESCRIPTION.split())}**\n",
        f"Frameworks: {frameworks}. Source: `rewriter/sdp_convert/transforms/{name}.py`; unit "
        f"tests: `tests/transforms/test_{name}.py`. Run it alone with "
        f"`sdp-convert --only {name}`, leave it out with `--skip {name}`, read this spec with "
        f"`sdp-convert --explain {name}`.\n",
        "## What it does\n",
        docstring_to_markdown(module.__doc__ or "(no docstring)") + "\n",
    ]
    if example:
        parts += [
            "## Example\n",
            "What `sdp-convert --only " + name + "` makes of a small script (converted by "
            "`tests/test_readme_examples.py` on every test run; all examples: "
            f"[Before and after](../conversion/examples.md#{name})).\n",
            example,
        ]
    messages = _messages([ln for f in used for ln in f.lines_by_transform[name]])
    parts.append("## Messages it reports in the golden fixtures\n")
    if messages:
        parts.append(
            "Each once, without its position; `(manual)` ones first: they name what a person "
            "must do. (Other scripts give other names and values in the same messages.)\n")
        parts.append(_fence("\n".join(messages), "text"))
    else:
        parts.append("None of the golden fixtures has a report line of this transform.\n")
    parts.append(f"## Golden fixtures ({len(used)})\n")
    if used:
        parts.append(
            "Each golden fixture whose report names this transform (`fixtures/<kind>/<case>/`): "
            "its report lines of this transform, and the whole conversion of the fixture as a "
            "diff of `input` against `expected` (every transform's changes; no diff: the "
            "fixture stays byte for byte as it is). `tests/test_golden.py` checks both on every "
            "test run.\n")
    for f in used:
        title = f.case + (" (project)" if f.project else "")
        body = _fence("\n".join(f.lines_by_transform[name]), "text")
        body += "\n" + (_fence(f.diff, "diff") if f.diff else "Unchanged: no `expected`.\n")
        parts.append(f'??? example "{title}"\n\n{_indent(body)}\n')
    return "\n".join(parts)


# Report names that are not transforms.
OTHERS = {
    "contract": "`contract`, the check of the converted program "
                "([the whole-program contract](conversion/index.md"
                "#what-converted-means-the-whole-program-contract))",
    "sdp_convert": "`sdp_convert`, the converter itself: files it would not convert "
                   "([Troubleshooting](troubleshooting.md#the-converters-report))",
    "manual_marker": "`manual_marker`, a manual note still in the file "
                     "([Manual notes stay in the file](cli.md#manual-notes-stay-in-the-file))",
}


def messages_page(classes: list[Any], fixtures: list[Fixture]) -> str:
    parts = [
        "# Report messages, by transform\n",
        "<!-- Generated by docs/_hooks/generate.py from fixtures/*/*/report.txt: "
        "do not edit. -->\n",
        "Every message the golden fixtures' reports hold (`fixtures/*/*/report.txt`, checked by "
        "`tests/test_golden.py`), without its position, by the transform that reports it, "
        "`(manual)` ones first. The page of each transform says what it does and why; "
        "[Troubleshooting](troubleshooting.md) says what to do about the common ones.\n",
    ]
    names = [c.NAME for c in classes]
    others = sorted({n for f in fixtures for n in f.lines_by_transform} - set(names))
    for name in names + others:
        msgs = _messages([ln for f in fixtures for ln in f.lines_by_transform.get(name, [])])
        if not msgs:
            continue
        link = (f"[`{name}`](transforms/{name}.md)" if name in names
                else OTHERS.get(name, f"`{name}`"))
        parts.append(f"## {name}\n\n{link}: {len(msgs)} messages.\n")
        parts.append(_fence("\n".join(msgs), "text"))
    return "\n".join(parts)


def _results() -> list[tuple[str, str]]:
    """(page path, title) of each recorded benchmark result."""
    out = []
    for path in sorted(RESULTS.glob("*.md")):
        first = path.read_text(encoding="utf-8").lstrip().splitlines()[0]
        title = first.lstrip("# ").strip() if first.startswith("#") else path.stem
        out.append((f"performance/{path.name}", title))
    return out


def on_config(config: Any) -> Any:
    names = [cls.NAME for cls in _transforms()]
    for item in config["nav"]:
        if not isinstance(item, dict):
            continue
        (title, children), = item.items()
        if title == "What the conversion does":
            children.append({"Transforms": [{name: f"transforms/{name}.md"} for name in names]})
        elif title == "Performance":
            children.append({"Recorded results": [{t: p} for p, t in _results()]})
        elif title == "Troubleshooting":
            item[title] = [children, {"Report messages": "messages.md"}]
    return config


def on_files(files: Files, config: Any) -> Files:
    classes = _transforms()
    fixtures = _fixtures()
    examples = _examples()
    for cls in classes:
        files.append(File.generated(config, f"transforms/{cls.NAME}.md",
                                    content=transform_page(cls, fixtures, examples.get(cls.NAME))))
    files.append(File.generated(config, "messages.md", content=messages_page(classes, fixtures)))
    for page, _ in _results():
        source = f"benchmarks/results/{Path(page).name}"
        files.append(File.generated(
            config, page,
            content=f"<!-- {source}, included at build time: edit that file. -->\n\n"
                    f'--8<-- "{source}"\n'))
    return files
