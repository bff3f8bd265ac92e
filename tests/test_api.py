"""The documented Python API: ``from sdp_convert import convert`` and its ``ConvertResult``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import sdp_convert
from sdp_convert import Change, ConversionError, ConvertResult, convert

from .test_cli import NOT_TRAINING, TRAIN, UNSHARDED


def test_convert_a_string():
    result = convert(TRAIN)
    assert isinstance(result, ConvertResult)
    assert result.changed and result.kind == "torch"
    assert "sdp.init()" in result.text and result.output == result.text.encode()
    assert result.source == TRAIN.encode()
    first = result.changes[0]
    assert isinstance(first, Change)
    assert (first.line, first.col, first.transform) == (1, 1, "add_runtime_init")
    assert not result.manual  # a DataLoader to shard: nothing for a person
    assert convert(result.text).changed is False  # a fixed point
    unsharded = convert(UNSHARDED)
    assert all(c.manual for c in unsharded.manual) and unsharded.manual


def test_options_and_bytes_with_a_coding_cookie():
    source = "# -*- coding: latin-1 -*-\n# Modèle\n".encode("latin-1") + TRAIN.encode()
    result = convert(source, lr_scaling="sqrt", skip=["pin_gpu_device"])
    assert result.output.startswith(b"# -*- coding: latin-1 -*-\n# Mod\xe8le\n")
    assert "# Modèle" in result.text and "sdp.size() ** 0.5" in result.text
    assert "set_device" not in result.text
    only = convert(TRAIN, only=["add_runtime_init"])
    assert {c.transform for c in only.changes} == {"add_runtime_init"}


def test_not_a_training_script_and_errors():
    unchanged = convert(NOT_TRAINING)
    assert not unchanged.changed and unchanged.changes == ()
    assert unchanged.kind == "not a training script"
    with pytest.raises(ConversionError) as err:
        convert("import torch\ndef f(:\n")
    assert (err.value.line, err.value.col) == (2, 7) and "syntax error" in err.value.message
    with pytest.raises(ValueError, match="unknown transform nope"):
        convert(TRAIN, only=["nope"])
    with pytest.raises(ValueError, match="lr_scaling"):
        convert(TRAIN, lr_scaling="cubic")


def test_notebook():
    nb = {"cells": [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
                     "source": TRAIN}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    result = convert(json.dumps(nb), notebook=True)
    assert "sdp.init()" in "".join(json.loads(result.text)["cells"][0]["source"])


def test_importing_the_package_loads_no_converter():
    # The API is imported on first use: ``sdp-convert --version`` and ``import sdp_convert``
    # stay quick.
    probe = "import sys, sdp_convert; print('libcst' in sys.modules, sdp_convert.__version__)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.split() == ["False", sdp_convert.__version__]
    assert set(sdp_convert.__all__) >= {"convert", "ConvertResult", "Change", "ConversionError"}


def test_line_length_lays_out_the_changed_lines_at_that_width():
    from sdp_convert import convert

    source = (
        "import torch\n"
        "model = torch.nn.Linear(4, 1)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, "
        "weight_decay=5e-4)\n"
        "for x in torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4))):\n"
        "    model(x[0]).sum().backward()\n"
        "    optimizer.step()\n"
    )
    wide = convert(source, line_length=120).text
    narrow = convert(source, line_length=88).text
    assert "optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * sdp.size()," in wide
    assert "optimizer = torch.optim.SGD(\n    model.parameters()," in narrow
    with pytest.raises(ValueError, match="line_length"):
        convert(source, line_length=0)
