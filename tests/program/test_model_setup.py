"""program.model_setup: models that get no gradient, helpers that only set weights up."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m
from sdp_convert.program.index import file_index
from sdp_convert.program.model_setup import not_trained, sets_weights

from .helpers import find, probe

HEAD = "import torch\nfrom torch import nn\n"


def _why(source: str, name: str = "encoder") -> str | None:
    t = probe(HEAD + source)
    binding = file_index(t).bindings_of(name, None)[0]
    found = not_trained(t, name, None, binding.stmt)
    return found[1] if found is not None else None


def test_a_model_frozen_whole_at_its_level_gets_no_gradient():
    assert "frozen" in _why("encoder = nn.Linear(2, 2)\nencoder.requires_grad_(False)\n")
    assert "frozen" in _why(
        "encoder = nn.Linear(2, 2)\nfor p in encoder.parameters():\n    p.requires_grad = False\n"
    )
    assert "frozen" in _why(
        "encoder = nn.Linear(2, 2)\n"
        "for name, p in encoder.named_parameters():\n    p.requires_grad_(False)\n"
    )


def test_a_partial_conditional_or_undone_freeze_is_not_enough():
    # Only some parameters.
    assert _why(
        "encoder = nn.Linear(2, 2)\nfor name, p in encoder.named_parameters():\n"
        "    if 'bias' in name:\n        p.requires_grad = False\n"
    ) is None
    # Under a condition: not every run.
    assert _why(
        "encoder = nn.Linear(2, 2)\nif freeze:\n    encoder.requires_grad_(False)\n"
    ) is None
    # Unfrozen later (gradual unfreezing).
    assert _why(
        "encoder = nn.Linear(2, 2)\nencoder.requires_grad_(False)\n"
        "for epoch in range(3):\n    if epoch == 2:\n        encoder.requires_grad_(True)\n"
    ) is None


def test_a_model_only_run_under_no_grad_is_a_fixed_feature_extractor():
    assert "no_grad" in _why(
        "encoder = nn.Linear(2, 2)\nencoder.eval()\nwith torch.no_grad():\n    h = encoder(x)\n"
    )
    assert "no_grad" in _why(
        "encoder = nn.Linear(2, 2)\n@torch.inference_mode()\ndef embed(x):\n"
        "    return encoder(x)\n"
    )
    # Called once with gradients, or handed to code the converter does not follow: may train.
    assert _why(
        "encoder = nn.Linear(2, 2)\nwith torch.no_grad():\n    h = encoder(x)\ny = encoder(x)\n"
    ) is None
    assert _why(
        "encoder = nn.Linear(2, 2)\nwith torch.no_grad():\n    h = encoder(x)\ntrain(encoder)\n"
    ) is None


def _sets(source: str) -> bool:
    t = probe(HEAD + source)
    call = find(t, m.Call(func=m.Name("setup")))
    assert isinstance(call, cst.Call)
    return sets_weights(t, call)


def test_helpers_that_only_set_weights_in_place():
    assert _sets(
        "def setup(model):\n    for layer in model.modules():\n"
        "        nn.init.normal_(layer.weight)\nsetup(net)\n"
    )
    assert _sets("def setup(model):\n    model.load_state_dict(torch.load('w.pt'))\nsetup(net)\n")
    # Runs the model, trains it, or does nothing to its weights: not a setup step.
    assert not _sets("def setup(model):\n    model(torch.ones(1))\nsetup(net)\n")
    assert not _sets(
        "def setup(model):\n    model.weight.data.zero_()\n    opt.step()\nsetup(net)\n"
    )
    assert not _sets("def setup(model):\n    print(model)\nsetup(net)\n")


def test_reads_in_functions_count():
    # A global model run with gradients inside a function is trained, whatever the module does.
    assert _why(
        "encoder = nn.Linear(2, 2)\nwith torch.no_grad():\n    h = encoder(x)\n"
        "def step(x):\n    return encoder(x).sum()\n"
    ) is None
