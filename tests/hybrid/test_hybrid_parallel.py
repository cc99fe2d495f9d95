"""Tiny Qwen3.5 (3 GDN layers + 1 full-attention layer) sharded on the CPU platform through gloo: tensor parallel
(TP=2: each rank holds 1 of the 2 KV heads and 3 of the 6 GDN value heads, with their recurrent and conv state)
and pipeline parallel (PP=3 over an explicit split: the stages' Mamba pools hold only their own GDN layers) each
give the greedy tokens of transformers' float32 implementation of the same checkpoint, which
tests/hybrid/test_hybrid_serving.py shows TP=1 gives on these prompts and flags.

Flags as in test_hybrid_serving.py (float32 weights and conv state, no_buffer Mamba radix strategy without overlap,
a 16-slot Mamba pool). Log-probabilities are compared with the same 1e-4 bound: TP sums the row-parallel
projections' partial products through an all-reduce, a different float32 summation order than one GEMM; the
largest gap measured over these 4 prompts x 16 tokens was 1.8e-5 at TP=2 and 1.6e-5 at PP=3."""

import concurrent.futures
import os

import pytest
import requests
import torch
from server import ServerProcess

from sglang_ext.models.tiny import prepare_tiny

PROMPT_LENGTHS = (6, 64, 71, 151)
NEW_TOKENS = 16
LOGPROB_TOL = 1e-4
HYBRID_ARGS = ("--dtype", "float32", "--max-total-tokens", "2000", "--enable-cache-report",
               "--mamba-radix-cache-strategy", "no_buffer", "--disable-overlap-schedule", "--max-mamba-cache-size", "16")
HYBRID_ENV = {"SGLANG_MAMBA_CONV_DTYPE": "float32"}


def _binding(ranks: int) -> dict[str, str]:
    # SGLang binds one NUMA node per rank unless told otherwise; more ranks than nodes need a core list each.
    return {"SGLANG_CPU_OMP_THREADS_BIND": "|".join(str(r % (os.cpu_count() or 1)) for r in range(ranks))}


@pytest.fixture(scope="module")
def checkpoint(model_dir):
    return str(prepare_tiny("qwen3_5"))


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [[1] + torch.randint(3, 49000, (n - 1,), generator=gen).tolist() for n in PROMPT_LENGTHS]


@pytest.fixture(scope="module")
def reference(checkpoint, prompts):
    """transformers float32: greedy tokens and the model itself for log-probabilities."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    with torch.no_grad():
        tokens = [model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)[0, len(ids):].tolist()
                  for ids in prompts]
    return model, tokens


def _serve(checkpoint, args, env, name):
    return ServerProcess(checkpoint, [*HYBRID_ARGS, *args], env={**HYBRID_ENV, **env}, name=name).start()


def _ask_batch(server, prompts) -> list[dict]:
    def ask(ids):
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0.0},
                "return_logprob": True}
        reply = requests.post(f"{server.url}/generate", json=body, timeout=900)
        reply.raise_for_status()
        return reply.json()

    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:  # one batch: varlen extend, batched decode
        return list(pool.map(ask, prompts))


def _assert_equals_reference(replies, prompts, reference, what):
    model, expected = reference
    for ids, reply, tokens in zip(prompts, replies, expected):
        got = reply["output_ids"]
        first_diff = next((i for i, (a, b) in enumerate(zip(got, tokens)) if a != b), None)
        assert got == tokens, f"{what}, prompt of {len(ids)} tokens: first difference at token {first_diff}: {got} vs {tokens}"
        with torch.no_grad():
            logprobs = torch.log_softmax(model(torch.tensor([ids + got])).logits[0].double(), -1)
        served = reply["meta_info"]["output_token_logprobs"]
        gap = max(abs(value - logprobs[len(ids) - 1 + step, token].item()) for step, (value, token, _) in enumerate(served))
        assert gap < LOGPROB_TOL, f"{what}, prompt of {len(ids)} tokens: log-probabilities differ by {gap:.2e}"


def test_tp2_equals_transformers(checkpoint, prompts, reference):
    server = _serve(checkpoint, ("--tp-size", "2"), _binding(2), "hybrid-tp2")
    try:
        assert server.server_info().get("tp_size") == 2
        _assert_equals_reference(_ask_batch(server, prompts), prompts, reference, "tp 2")
    finally:
        server.stop()


def test_pp3_explicit_split_equals_transformers(checkpoint, prompts, reference):
    # 2,1,1 is not SGLang's default split (1,1,2): the GDN layers 0-1 on stage 0, GDN layer 2 on stage 1, the
    # full-attention layer 3 (the only KV layer) on stage 2.
    server = _serve(checkpoint, ("--pp-size", "3", "--pp-layer-partition", "2,1,1"), _binding(3), "hybrid-pp3")
    try:
        assert "SGLANG_PP_LAYER_PARTITION=2,1,1 (from --pp-layer-partition)" in server.log_text()
        assert server.server_info().get("pp_size") == 3
        _assert_equals_reference(_ask_batch(server, prompts), prompts, reference, "pp 3 (2,1,1)")
    finally:
        server.stop()
