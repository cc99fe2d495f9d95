"""Fixtures of the paged-experts server tests: the tiny qwen3_5_moe checkpoint, its config, and transformers'
unpaged float32 reference for the prompts of paged_helpers."""

import json

import pytest
import torch
from paged_helpers import NEW_TOKENS, prompts

from sglang_ext.models.tiny import prepare_tiny


@pytest.fixture(scope="session")
def moe_checkpoint(model_dir):  # model_dir: the built-in tokenizer the tiny model copies
    return str(prepare_tiny("qwen3_5_moe"))


@pytest.fixture(scope="session")
def moe_config(moe_checkpoint):
    with open(f"{moe_checkpoint}/config.json") as f:
        return json.load(f)


@pytest.fixture(scope="session")
def moe_reference(moe_checkpoint):
    """transformers' float32 greedy tokens and log-probabilities of each prompt (no paging anywhere)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(moe_checkpoint, dtype=torch.float32)
    out = []
    for ids in prompts():
        with torch.no_grad():
            tokens = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)[0, len(ids):]
            logits = model(torch.tensor([ids + tokens.tolist()])).logits[0].double()
        out.append((tokens.tolist(), torch.log_softmax(logits, -1)))
    return out
