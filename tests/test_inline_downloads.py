"""A dataset downloaded inside the ``DataLoader(...)`` call that reads it (issue 30, item 1).

shard_dataloader moves such a dataset into a statement of its own (``train_dataset = ...``) for
the sampler; order_downloads must run *that* statement on local rank 0 first, in the same pass,
or the conversion is not a fixed point and the whole file is refused. Checked for every download
spelling inline, and for every golden script whose download is inlined into its loader.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from sdp_convert.changes import Change
from sdp_convert.engine import _unstable as unstable_note
from sdp_convert.engine import convert

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"

SCRIPT = """\
import torch
import torch.nn as nn
import torchvision
from torchvision import datasets, transforms
from torchvision.datasets import FashionMNIST, CIFAR10
from torchvision.datasets.utils import download_and_extract_archive


def main():
    t = transforms.ToTensor()
    model = nn.Linear(784, 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader({dataset}, batch_size=64, shuffle=True)
    for epoch in range(2):
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x.flatten(1)), y).backward()
            optimizer.step()


if __name__ == "__main__":
    main()
"""

SPELLINGS = {
    "positional": 'datasets.MNIST("../data", train=True, download=True, transform=t)',
    "full_name": 'torchvision.datasets.MNIST(root="../data", download=True, transform=t)',
    "from_import": 'FashionMNIST("../data", train=True, download=True, transform=t)',
    "multi_line": 'CIFAR10(\n        "../data",\n        download=True,\n        transform=t,\n'
                  '    )',
    "nested_subset": 'torch.utils.data.Subset(datasets.MNIST("d", download=True), range(1000))',
    "keyword_dataset": 'dataset=datasets.KMNIST("../data", download=True, transform=t)',
    "hugging_face": '__import__("datasets").load_dataset("imdb", split="train")',
}


def _unstable(result) -> list[str]:
    return [c.message for c in result.changes if "converting the result again" in c.message]


@pytest.mark.parametrize("spelling", SPELLINGS.values(), ids=SPELLINGS.keys())
def test_a_download_inline_in_the_loader_converts_in_one_pass(spelling: str):
    source = SCRIPT.format(dataset=spelling)
    result = convert(source)
    assert not _unstable(result), _unstable(result)
    out = result.output.decode()
    assert "sampler=loader_sampler" in out
    compile(out, "converted.py", "exec")
    if "download=True" in spelling:
        # The download runs in the statement it was moved into, first on local rank 0.
        lines = out.splitlines()
        at = next(i for i, line in enumerate(lines) if line.lstrip().startswith("loader_dataset ="))
        assert lines[at - 1].strip() == "with sdp.rank0_first():", out
        assert any(c.transform == "order_downloads" and not c.manual for c in result.changes)
    # And converting the output again changes nothing.
    assert convert(result.output).output == result.output


def _inlined(source: str) -> str | None:
    """``source`` with its first downloaded dataset that one ``DataLoader(name, ...)`` reads
    written inline in that call (``DataLoader(MNIST(..., download=True), ...)``), or None."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    for body in (n.body for n in ast.walk(tree) if hasattr(n, "body") and isinstance(n.body, list)):
        for stmt in body:
            if not (
                isinstance(stmt, ast.Assign)
                and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)
                and isinstance(stmt.value, ast.Call)
                and any(k.arg == "download" for k in stmt.value.keywords)
            ):
                continue
            name = stmt.targets[0].id
            uses = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == name]
            loader_args = [
                call.args[0]
                for call in ast.walk(tree)
                if isinstance(call, ast.Call)
                and ast.unparse(call.func).endswith("DataLoader")
                and call.args and isinstance(call.args[0], ast.Name) and call.args[0].id == name
            ]
            if len(uses) != 2 or len(loader_args) != 1:
                continue
            use = loader_args[0]
            if use.lineno <= stmt.end_lineno:
                continue
            value = ast.get_source_segment(source, stmt.value)
            line = lines[use.lineno - 1]
            lines[use.lineno - 1] = line[: use.col_offset] + value + line[use.end_col_offset :]
            del lines[stmt.lineno - 1 : stmt.end_lineno]
            return "".join(lines)
    return None


GOLDENS = sorted(
    p for p in FIXTURES.glob("torch/*/input.py")
    if "download=True" in p.read_text() and _inlined(p.read_text()) is not None
)


def test_some_goldens_download_inside_their_loader_once_inlined():
    assert len(GOLDENS) >= 2, GOLDENS


@pytest.mark.parametrize(
    "path", GOLDENS, ids=[f"{p.parent.parent.name}/{p.parent.name}" for p in GOLDENS]
)
def test_every_golden_with_its_download_inlined_converts_in_one_pass(path: Path):
    source = _inlined(path.read_text())
    assert source is not None
    original = convert(path.read_bytes())
    result = convert(source)
    assert not _unstable(result), _unstable(result)
    # It converts as the golden does: the same transforms report, the download is ordered.
    assert {c.transform for c in result.changes} == {c.transform for c in original.changes}
    assert "rank0_first()" in result.output.decode()
    compile(result.output, str(path), "exec")
    assert convert(result.output).output == result.output


def test_the_refusal_names_what_a_second_pass_would_still_do():
    again = [Change(24, 9, "order_downloads", "datasets.MNIST(...) downloads ...")]
    note = unstable_note(b"import torch\n", again)
    assert note.manual and note.line == 1
    assert "a second pass would still change it (order_downloads)" in note.message
    assert "unusual import or alias" not in note.message
    star = unstable_note(b"from helpers import *\n", again)
    assert "star import" in star.message
