"""Tiny Qwen3.5 (dense hybrid: 3 GDN layers, 1 full-attention layer) on stock launch_server on the CPU platform,
its GDN layers through the torch ops: greedy tokens and log-probabilities equal transformers' own float32
implementation of the same checkpoint.

Flags and why: float32 weights; the conv state kept in float32 (SGLANG_MAMBA_CONV_DTYPE: SGLang's default bf16
conv state rounds the last three GDN inputs between decode steps, which measured up to 8e-2 in decode
log-probabilities against transformers); `--mamba-radix-cache-strategy no_buffer --disable-overlap-schedule`
(the CPU platform does not declare SGLang's Mamba state snapshots, which its default strategy needs); a 16-slot
Mamba pool (sized from RAM otherwise: 5 GB of recurrent state for this model)."""

import concurrent.futures

import pytest
import requests
import torch
from server import ServerProcess

from sglang_ext.models.tiny import prepare_tiny

PROMPT_LENGTHS = (6, 64, 71, 151)  # within the first 64-token chunk, at, past, and over two chunk boundaries
NEW_TOKENS = 16
# float32 on both sides with different summation orders: the largest gap measured over these prompts and 16
# decode steps was 2e-5 (dense and MoE); 1e-4 leaves 5x.
LOGPROB_TOL = 1e-4


@pytest.fixture(scope="module")
def checkpoint(model_dir):  # model_dir: the built-in tokenizer the tiny model copies
    return str(prepare_tiny("qwen3_5"))


@pytest.fixture(scope="module")
def server(checkpoint):
    proc = ServerProcess(checkpoint, [
        "--dtype", "float32", "--max-total-tokens", "2000", "--enable-cache-report",
        "--mamba-radix-cache-strategy", "no_buffer", "--disable-overlap-schedule", "--max-mamba-cache-size", "16",
    ], env={"SGLANG_MAMBA_CONV_DTYPE": "float32"}, name="tiny-qwen3_5").start()
    yield proc
    proc.stop()


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [[1] + torch.randint(3, 49000, (n - 1,), generator=gen).tolist() for n in PROMPT_LENGTHS]


def test_greedy_equals_transformers(server, checkpoint):
    from transformers import AutoModelForCausalLM

    prompts = _prompts()

    def ask(ids):
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0.0},
                "return_logprob": True, "top_logprobs_num": 3}
        reply = requests.post(f"{server.url}/generate", json=body, timeout=600)
        reply.raise_for_status()
        return reply.json()

    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:  # one batch: varlen extend, batched decode
        served = list(pool.map(ask, prompts))
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    for ids, reply in zip(prompts, served):
        tokens = reply["output_ids"]
        with torch.no_grad():
            expected = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)
            logprobs = torch.log_softmax(model(torch.tensor([ids + tokens])).logits[0].double(), -1)
        assert tokens == expected[0, len(ids):].tolist(), f"prompt of {len(ids)} tokens"
        tops = reply["meta_info"]["output_top_logprobs"]
        gap = max(abs(value - logprobs[len(ids) - 1 + step, token].item())
                  for step in range(NEW_TOKENS) for value, token, _ in tops[step])
        assert gap < LOGPROB_TOL, f"prompt of {len(ids)} tokens: log-probabilities differ by {gap:.2e}"
