"""Compressed KV (`--kv-cache-dtype octave_k3v4`) on a hybrid GDN model together with NEXTN speculative decoding
from the model's MTP layer, and together with the HiCache host tier: tiny Qwen3.5 on stock launch_server on the
CPU platform, float32, torch_native attention.

- NEXTN chain (topk 1) and tree (topk 2) over octave_k3v4: greedy output token for token equal to plain decoding
  over octave_k3v4, and drafts accepted. The draft (SGLang's Qwen3_5ForCausalLMMTP) has its own
  HybridLinearKVPool whose full-attention sub-pool holds the format's planes; its attention must be our
  compressed backend (before the fix in spec/draft_backends.py the draft got SGLang's dense torch_native backend,
  which the compressed pool refuses: the scheduler died on the first prefill).
- HiCache host tier over octave_k3v4: an agent turn pushed out of the 600-token device pool by one long prompt
  comes back from host RAM (format planes + recurrent state; cached_tokens_details says host), and answers as the
  device hit and the cold request did.

Checkpoint and NEXTN settings as tests/hybrid/test_hybrid_mtp.py (the MTP layer made able to guess); the host
tier recipe as tests/hybrid/test_hybrid_sessions.py. Three servers: the plain one is the HiCache server (with the
cache flushed first its greedy output is plain decoding: row-invariant decode over compressed KV is the default,
docs/speculative-decoding.md), one per draft shape.
"""

import pytest
import requests
import torch
from server import ServerProcess
from test_hybrid_mtp import _guessing_mtp_checkpoint

from sglang_ext.models.tiny import prepare_tiny

KV_FORMAT = "octave_k3v4"
PROMPT_LENGTHS = (6, 20, 40, 71)
NEW_TOKENS = 32
DEVICE_TOKENS = 600
HOST_NEW_TOKENS = 16
HYBRID_ARGS = ("--dtype", "float32", "--kv-cache-dtype", KV_FORMAT, "--attention-backend", "torch_native",
               "--enable-cache-report", "--mamba-radix-cache-strategy", "no_buffer", "--disable-overlap-schedule",
               "--max-mamba-cache-size", "16", "--mem-fraction-static", "0.95")
HYBRID_ENV = {"SGLANG_MAMBA_CONV_DTYPE": "float32"}
# (name, --speculative-num-steps, --speculative-eagle-topk, --speculative-num-draft-tokens)
DRAFTS = (("chain", 3, 1, 4), ("tree", 3, 2, 6))


@pytest.fixture(scope="module")
def checkpoint(model_dir, tmp_path_factory):  # model_dir: the built-in tokenizer the tiny model copies
    return _guessing_mtp_checkpoint(prepare_tiny("qwen3_5"), tmp_path_factory.mktemp("hybrid-combos") / "qwen3_5")


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [[1] + torch.randint(3, 49000, (n - 1,), generator=gen).tolist() for n in PROMPT_LENGTHS]


def _generate(server, ids, new_tokens, logprobs=False) -> dict:
    body = {"input_ids": ids, "return_logprob": logprobs,
            "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0.0, "ignore_eos": True}}
    reply = requests.post(f"{server.url}/generate", json=body, timeout=900)
    reply.raise_for_status()
    return reply.json()


def _greedy(server) -> list[dict]:
    return [_generate(server, ids, NEW_TOKENS) for ids in _prompts()]  # batch 1: each verify is one request's


@pytest.fixture(scope="module")
def hicache_server(checkpoint):
    server = ServerProcess(checkpoint, [
        *HYBRID_ARGS, "--max-total-tokens", str(DEVICE_TOKENS), "--enable-hierarchical-cache",
        "--hicache-io-backend", "direct", "--hicache-mem-layout", "page_first_direct", "--hicache-ratio", "2",
    ], env=HYBRID_ENV, name=f"hybrid-{KV_FORMAT}-hicache").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def plain(hicache_server):
    hicache_server.flush_cache()
    outs = _greedy(hicache_server)
    assert all(o["meta_info"]["cached_tokens"] == 0 for o in outs)
    return outs


@pytest.mark.parametrize(("name", "steps", "topk", "draft_tokens"), DRAFTS, ids=[d[0] for d in DRAFTS])
def test_nextn_greedy_equals_plain(checkpoint, plain, name, steps, topk, draft_tokens, record_property):
    server = ServerProcess(checkpoint, [
        *HYBRID_ARGS, "--max-total-tokens", "2000", "--speculative-algorithm", "NEXTN",
        "--speculative-num-steps", str(steps), "--speculative-eagle-topk", str(topk),
        "--speculative-num-draft-tokens", str(draft_tokens),
    ], env=HYBRID_ENV, name=f"hybrid-{KV_FORMAT}-{name}").start()
    try:
        outs = _greedy(server)
    finally:
        server.stop()
    for ids, got, want in zip(_prompts(), outs, plain):
        first_diff = next((i for i, (a, b) in enumerate(zip(got["output_ids"], want["output_ids"])) if a != b), None)
        assert first_diff is None and len(got["output_ids"]) == NEW_TOKENS, (
            f"{KV_FORMAT} {name}, prompt of {len(ids)} tokens: NEXTN parts from plain at token {first_diff}")
    verifies = sum(o["meta_info"]["spec_verify_ct"] for o in outs)
    accept_length = NEW_TOKENS * len(outs) / verifies
    record_property("accept_length", accept_length)
    assert accept_length > 1.1, f"{name}: accept length {accept_length:.2f}: (almost) no MTP draft was accepted"


def test_host_tier_hit_equals_device_hit(hicache_server):
    server = hicache_server
    assert f"sglang-ext HiCache host pool: {KV_FORMAT}" in server.log_text(), "not the compressed host pool"
    gen = torch.Generator().manual_seed(40)

    def tokens(n):
        return torch.randint(3, 49000, (n,), generator=gen).tolist()

    def ask(ids, new_tokens=HOST_NEW_TOKENS):
        reply = _generate(server, ids, new_tokens, logprobs=True)
        meta = reply["meta_info"]
        return reply["output_ids"], meta, [lp[0] for lp in meta["output_token_logprobs"]]

    prompt = [1] + tokens(99)
    server.flush_cache()
    answer, _, _ = ask(prompt)
    turn2 = prompt + answer + tokens(30)
    server.flush_cache()
    cold, meta, _ = ask(turn2)
    assert meta["cached_tokens"] == 0
    server.flush_cache()
    ask(prompt)
    device, meta, device_lp = ask(turn2)
    reusable = len(prompt) + len(answer) - 1  # the last answer token's KV and state were never computed
    assert meta["cached_tokens"] == reusable and meta["cached_tokens_details"] == {"device": reusable, "host": 0}
    # One prompt that needs nearly the whole device pool pushes the turn's prefix out to the host tier.
    ask([1] + tokens(DEVICE_TOKENS - 41), new_tokens=2)
    host, meta, host_lp = ask(turn2)
    assert meta["cached_tokens"] == reusable and meta["cached_tokens_details"] == {"device": 0, "host": reusable}, (
        f"expected a host-tier hit: {meta['cached_tokens_details']}")
    assert device == cold and host == device
    # The host tier moves the format's bytes as they are: the same planes give the same log-probabilities.
    assert host_lp == device_lp
