"""print_on_rank0: progress bars (by default) and prints (--rank0-output all) on rank 0 only."""

from __future__ import annotations

import textwrap

import pytest
from sdp_convert import convert

from .helpers import messages, run

ONLY = "print_on_rank0"
SCRIPT = """\
import torch
from tqdm import tqdm, trange

model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in trange(3, desc="epochs"):
    for x, y in tqdm(loader, disable=quiet):
        optimizer.zero_grad()
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch}: {loss.item():.3f}")
    print("to a file", file=log)
    if sdp.rank() == 0:
        print("already rank 0 only")
"""


def test_progress_bars_by_default_prints_left():
    result = run(SCRIPT.replace("import torch\n", "import torch\nimport sdp_runtime.torch as sdp\n"),
                 ONLY)
    code = result.output.decode()
    assert 'for epoch in trange(3, desc="epochs", disable=sdp.rank() != 0):' in code
    assert "for x, y in tqdm(loader, disable=quiet or sdp.rank() != 0):" in code
    assert '    print(f"epoch {epoch}: {loss.item():.3f}")' in code
    assert messages(result, ONLY) == [
        "trange(...) shown on rank 0 only (disable= on the others)",
        "tqdm(...) shown on rank 0 only (disable= on the others)",
    ]


def test_all_turns_prints_into_rank0_print_but_not_to_files_or_rank0_code():
    result = run(SCRIPT.replace("import torch\n", "import torch\nimport sdp_runtime.torch as sdp\n"),
                 ONLY, rank0_output="all")
    code = result.output.decode()
    assert '    sdp.rank0_print(f"epoch {epoch}: {loss.item():.3f}")' in code
    assert 'print("to a file", file=log)' in code
    assert '        print("already rank 0 only")' in code
    assert "print(...) -> sdp.rank0_print(...): printed on rank 0 only" in messages(result, ONLY)


def test_none_changes_nothing_and_the_api_takes_the_option():
    source = textwrap.dedent(SCRIPT)
    none = convert(source, rank0_output="none")
    assert "disable=sdp" not in none.text and "rank0_print" not in none.text
    every = convert(source, rank0_output="all")
    assert "sdp.rank0_print(f\"epoch" in every.text
    assert convert(every.text, rank0_output="all").text == every.text  # a fixed point
    with pytest.raises(ValueError, match="rank0_output must be progress, all or none"):
        convert(source, rank0_output="some")
