"""Same prompt, same output over a lossy KV format whatever the chunking or the batch, under SGLang's
`--enable-deterministic-inference` (what SGLang itself promises batch invariance for).

In that mode on the CPU platform every linear layer and every attention query of a prefill, decode or verify
step is computed alone, through the decode routine, over exactly the keys it sees (platform/batch_invariant.py),
so a token's K/V codes and logits are bitwise the same however its prompt was chunked or batched. One server
with prefill chunks of 64 tokens: four prompts of 70-150 tokens, each alone, then all four at once (they share
prefill chunks, so each prompt is cut at other places than alone, and decode runs at batch 4). Output tokens and
every per-token logprob must be equal, not close. Without the mode (SGLang's default), batched prefill rows
round differently and the same comparison parts (measured in the note of the commit that added this test).

Across servers with different `--chunked-prefill-size` the same holds by the same construction (each row is
computed alone, so the chunk a row is in cannot matter); one server keeps the CI cost to one start.
"""

from __future__ import annotations

import concurrent.futures

import pytest
import requests
from text_fixtures import long_text

KV_FORMAT = "octave_k3v3"  # the coarsest code: the first to flip on a last-bit difference
PROMPTS = [long_text(n)[: 6 * n] + " Next:" for n in (50, 70, 95, 120)]  # about 70-150 tokens each
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def server(server_pool):
    srv = server_pool.get(
        "--dtype", "float32", "--kv-cache-dtype", KV_FORMAT, "--chunked-prefill-size", "64",
        "--enable-deterministic-inference", "--max-total-tokens", "4000", "--random-seed", "0",
        name="same-output-deterministic")  # fmt: skip
    yield srv
    srv.stop()


def generate(server, text: str) -> dict:
    body = {"text": text, "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0.0},
            "return_logprob": True, "logprob_start_len": 0}
    r = requests.post(f"{server.url}/generate", json=body, timeout=1200)
    r.raise_for_status()
    return r.json()


def trace(out: dict) -> tuple[list[int], list[float], list[float]]:
    meta = out["meta_info"]
    output = meta["output_token_logprobs"]
    prompt = [lp for lp, _tok, _txt in meta["input_token_logprobs"] if lp is not None]
    return [tok for _lp, tok, _txt in output], [lp for lp, _tok, _txt in output], prompt


def test_chunking_and_batching_do_not_change_a_single_bit(server):
    alone = [trace(generate(server, p)) for p in PROMPTS]
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = [trace(out) for out in pool.map(lambda p: generate(server, p), PROMPTS)]
    for i, (a, b) in enumerate(zip(alone, together)):
        assert a[0] == b[0], f"prompt {i}: output tokens differ alone vs batched: {a[0]} != {b[0]}"
        assert a[1] == b[1], f"prompt {i}: output logprobs differ: {max(abs(x - y) for x, y in zip(a[1], b[1])):.2e}"
        assert a[2] == b[2], f"prompt {i}: prompt logprobs differ: {max(abs(x - y) for x, y in zip(a[2], b[2])):.2e}"
