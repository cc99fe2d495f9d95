"""End-to-end: stock `python -m sglang.launch_server` with sglang-ext on the portable CPU platform."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from text_fixtures import long_text

HF_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea, there lived",
]
HF_NEW_TOKENS = 32


def test_chat_answers_paris(shared_server):
    reply = shared_server.chat("What is the capital of France?")
    content = reply["choices"][0]["message"]["content"]
    assert "Paris" in content, content


def test_platform_and_plugin_active(shared_server):
    log = shared_server.log_text()
    assert "[sglang-ext] " in log and "platform portable_cpu" in log, shared_server.log_tail()
    # Hooks checked where SGLang applied them: the launcher, and each child (scheduler, detokenizer) on its own.
    lines = [line for line in log.splitlines() if line.startswith("[sglang-ext] ") and "hooks verified: " in line]
    assert len(lines) >= 3 and " registered: " in lines[0], lines
    assert "Multiple AROUND hooks" not in log and "Failed to apply hooks" not in log
    info = shared_server.server_info()
    assert info.get("device") == "cpu", info.get("device")
    assert info.get("attention_backend") == "torch_native", info.get("attention_backend")


@pytest.fixture(scope="module")
def hf_greedy(model_dir):
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = {}
    for prompt in HF_PROMPTS:
        ids = tok(prompt, return_tensors="pt").input_ids
        out[prompt] = (ids[0].tolist(), _greedy(model, ids, HF_NEW_TOKENS))
    return out


@torch.no_grad()
def _greedy(model, ids, n):
    """Plain argmax decoding with the KV cache, no logits processors (generate() would mask EOS)."""
    out = model(ids, use_cache=True)
    tokens = []
    for _ in range(n):
        nxt = out.logits[0, -1].argmax().item()
        tokens.append(nxt)
        out = model(torch.tensor([[nxt]]), past_key_values=out.past_key_values, use_cache=True)
    return tokens


@pytest.mark.parametrize("prompt", HF_PROMPTS)
def test_greedy_matches_transformers_float32(shared_server, hf_greedy, prompt):
    input_ids, expected = hf_greedy[prompt]
    got = shared_server.generate(input_ids=input_ids, max_new_tokens=HF_NEW_TOKENS, ignore_eos=True)
    output_ids = got["output_ids"]
    assert len(output_ids) >= HF_NEW_TOKENS
    first_diff = next((i for i, (a, b) in enumerate(zip(output_ids, expected)) if a != b), None)
    assert first_diff is None, f"first difference at token {first_diff}: sglang {output_ids} vs hf {expected}"


def test_radix_prefix_reuse(shared_server):
    prefix = long_text(1000)
    p1 = prefix + "\nQuestion: what did the baker do? Answer:"
    p2 = prefix + "\nQuestion: who walked through the crowd? Answer:"
    shared_server.flush_cache()
    cold = shared_server.generate(p2, max_new_tokens=16)
    assert cold["meta_info"]["prompt_tokens"] >= 1050, cold["meta_info"]  # >= 1000 shared + the question
    shared_server.flush_cache()
    first = shared_server.generate(p1, max_new_tokens=16)
    assert first["meta_info"]["cached_tokens"] == 0, first["meta_info"]
    warm = shared_server.generate(p2, max_new_tokens=16)
    assert warm["meta_info"]["cached_tokens"] >= 1000, warm["meta_info"]
    assert warm["output_ids"] == cold["output_ids"], (warm["text"], cold["text"])
