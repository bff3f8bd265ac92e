"""A tiny stand-in for Hugging Face ``transformers`` (not installed here) with the names SMP's GPT
examples use: ``GPT2Config``, ``AutoModelForCausalLM.from_config`` (a small causal language model
with GPT-2's attribute layout: ``transformer.wte/wpe/h/ln_f``, ``lm_head``; its forward takes
``input_ids``, ``attention_mask``, ``labels`` and returns a dict with ``loss`` and ``logits``),
``set_seed`` and ``default_data_collator``. Test plumbing for tests/e2e/test_smp_examples.py."""

from __future__ import annotations

import random

import numpy as np
import torch
from torch import nn

from . import modeling_utils, trainer_utils  # noqa: F401

__version__ = "0.0.0-sdp-test-stub"


class GPT2Config:
    model_type = "gpt2"

    def __init__(self, vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12,
                 resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, layer_norm_epsilon=1e-5,
                 initializer_range=0.02, **kwargs):
        self.vocab_size, self.n_positions, self.n_embd = vocab_size, n_positions, n_embd
        self.n_layer, self.n_head = n_layer, n_head
        self.resid_pdrop, self.embd_pdrop, self.attn_pdrop = resid_pdrop, embd_pdrop, attn_pdrop
        self.layer_norm_epsilon, self.initializer_range = layer_norm_epsilon, initializer_range
        for key, value in kwargs.items():
            setattr(self, key, value)


CONFIG_MAPPING = {"gpt2": GPT2Config}


class _Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        # No projection biases: the key bias's gradient is zero in theory (softmax ignores a
        # constant), so its float noise, which Adam scales up to the learning rate, would differ
        # between runs that sum the same batch in another order.
        self.attn = nn.MultiheadAttention(config.n_embd, config.n_head, dropout=config.attn_pdrop,
                                          bias=False, batch_first=True)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = nn.Sequential(nn.Linear(config.n_embd, 4 * config.n_embd), nn.GELU(),
                                 nn.Linear(4 * config.n_embd, config.n_embd),
                                 nn.Dropout(config.resid_pdrop))

    def forward(self, x, causal):
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, attn_mask=causal, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class _Transformer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.drop = nn.Dropout(config.embd_pdrop)
        self.h = nn.ModuleList(_Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)

    def forward(self, input_ids):
        length = input_ids.shape[1]
        positions = torch.arange(length, device=input_ids.device)
        x = self.drop(self.wte(input_ids) + self.wpe(positions))
        causal = torch.triu(torch.ones(length, length, dtype=torch.bool,
                                       device=input_ids.device), 1)
        for block in self.h:
            x = block(x, causal)
        return self.ln_f(x)


class GPT2LMHeadModel(modeling_utils.PreTrainedModel):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = _Transformer(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.init_weights()

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(0.0, self.config.initializer_range)
            if getattr(module, "bias", None) is not None:
                module.bias.data.zero_()

    def forward(self, input_ids=None, attention_mask=None, labels=None):
        logits = self.lm_head(self.transformer(input_ids))
        out = {"logits": logits}
        if labels is not None:
            shift_logits = logits[:, :-1].reshape(-1, logits.shape[-1])
            shift_labels = labels[:, 1:].reshape(-1)
            if attention_mask is not None:
                shift_labels = shift_labels.masked_fill(attention_mask[:, 1:].reshape(-1) == 0,
                                                        -100)
            out["loss"] = nn.functional.cross_entropy(shift_logits, shift_labels,
                                                      ignore_index=-100)
        return out


class AutoModelForCausalLM:
    @staticmethod
    def from_config(config):
        return GPT2LMHeadModel(config)


MODEL_FOR_CAUSAL_LM_MAPPING = {GPT2Config: GPT2LMHeadModel}


class AutoConfig:
    @staticmethod
    def for_model(model_type, **kwargs):
        return CONFIG_MAPPING[model_type](**kwargs)


class AutoTokenizer:
    @staticmethod
    def from_pretrained(*args, **kwargs):
        raise RuntimeError("the test stub of transformers has no tokenizer (no downloads here)")


def set_seed(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def default_data_collator(features):
    return {k: torch.stack([torch.as_tensor(f[k]) for f in features]) for k in features[0]}
