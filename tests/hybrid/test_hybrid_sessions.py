"""Prefix reuse, agent sessions, session retention and the HiCache host tier on a hybrid model: tiny Qwen3.5
(3 GDN layers, 1 full-attention layer) on stock launch_server on the CPU platform, one server for every check.

Its radix cache is SGLang's unified tree with a MAMBA component (`--mamba-radix-cache-strategy no_buffer`: the
recurrent state is kept where a request's prefill or the request ended), its host tier SGLang's hybrid cache
controller with the KV host pool and the Mamba host pool (the CPU platform's subclasses), and
`--session-retention-seconds` our retention cache over that tree. Every answer is greedy and compared token
for token: a radix hit, a second agent turn and a host-tier hit restore the recurrent state at the prefix
boundary, so they must give the cold request's tokens.

Flags: float32 weights and conv state (as tests/hybrid/test_hybrid_serving.py), a 600-token device pool and a
host tier of 2x that, so a few hundred tokens of other prompts push a session out of the device."""

import re

import pytest
import requests
import torch
from server import ServerProcess

from sglang_ext.models.tiny import prepare_tiny

DEVICE_TOKENS = 600
HOST_RATIO = 2
ONE_OFF_TOKENS = 120
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def server(model_dir):  # model_dir: the built-in tokenizer the tiny model copies
    proc = ServerProcess(str(prepare_tiny("qwen3_5")), [
        "--dtype", "float32", "--max-total-tokens", str(DEVICE_TOKENS), "--enable-cache-report",
        "--mamba-radix-cache-strategy", "no_buffer", "--disable-overlap-schedule", "--max-mamba-cache-size", "16",
        "--enable-hierarchical-cache", "--hicache-io-backend", "direct", "--hicache-mem-layout", "page_first_direct",
        "--hicache-ratio", str(HOST_RATIO), "--session-retention-seconds", "600",
    ], env={"SGLANG_MAMBA_CONV_DTYPE": "float32"}, name="tiny-qwen3_5-sessions").start()
    yield proc
    proc.stop()


_gen = torch.Generator().manual_seed(40)


def _tokens(n: int) -> list[int]:
    return torch.randint(3, 49000, (n,), generator=_gen).tolist()


def _ask(server, ids, new_tokens=NEW_TOKENS):
    """(output ids, cached tokens, {'device': d, 'host': h} or None) of one greedy request."""
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0.0}}
    reply = requests.post(f"{server.url}/generate", json=body, timeout=600)
    reply.raise_for_status()
    meta = reply.json()["meta_info"]
    return reply.json()["output_ids"], meta["cached_tokens"], meta.get("cached_tokens_details")


def _push_out(server, tokens: int) -> list[list[int]]:
    """One-off prompts of `tokens` tokens in all, each newer than everything before it."""
    prompts = [[1] + _tokens(ONE_OFF_TOKENS - 1) for _ in range(tokens // ONE_OFF_TOKENS)]
    for ids in prompts:
        _ask(server, ids, new_tokens=2)
    return prompts


def test_radix_hit_equals_cold(server):
    prefix, suffix = [1] + _tokens(99), _tokens(30)
    server.flush_cache()
    cold, cached, _ = _ask(server, prefix + suffix)
    assert cached == 0
    server.flush_cache()
    _ask(server, prefix)
    hit, cached, _ = _ask(server, prefix + suffix)
    assert cached == len(prefix), "the prefix's recurrent state was not found at its boundary"
    assert hit == cold


def test_second_turn_prefills_only_new_tokens(server):
    """An agent turn sends the previous prompt, the answer as returned and a new message: all of the previous
    turn but its last generated token (whose KV and state were never computed) comes from the cache."""
    server.flush_cache()
    prompt = [1] + _tokens(119)
    answer, _, _ = _ask(server, prompt)
    turn2 = prompt + answer + _tokens(25)
    second, cached, _ = _ask(server, turn2)
    assert cached == len(prompt) + len(answer) - 1
    server.flush_cache()
    cold, cached, _ = _ask(server, turn2)
    assert cached == 0 and second == cold


def test_host_tier_round_trip_equals_device_hit(server):
    """A session pushed out of the device comes back from host RAM (KV pages and recurrent state) and answers
    as the device hit and the cold request did."""
    prompt = [1] + _tokens(99)
    server.flush_cache()
    answer, _, _ = _ask(server, prompt)
    turn2 = prompt + answer + _tokens(30)
    server.flush_cache()
    cold, cached, _ = _ask(server, turn2)
    assert cached == 0
    server.flush_cache()
    _ask(server, prompt)
    device, cached, details = _ask(server, turn2)
    reusable = len(prompt) + len(answer) - 1
    assert cached == reusable and details == {"device": reusable, "host": 0}
    # One prompt that needs nearly the whole device pool: even a retained session (this server runs with
    # --session-retention-seconds) must leave the device for it, and goes to the host tier.
    _ask(server, [1] + _tokens(DEVICE_TOKENS - 41), new_tokens=2)
    host, cached, details = _ask(server, turn2)
    assert cached == reusable and details == {"device": 0, "host": reusable}, "expected a host-tier hit"
    assert device == cold and host == device


def test_retention_keeps_a_session_through_more_than_device_and_host_hold(server):
    """Other prompts of more tokens than device and host hold together go through; without retention (LRU) the
    session, older than all of them, would be evicted from both; with it, its third turn is fully cached."""
    server.flush_cache()
    prompt = [1] + _tokens(99)
    answer, _, _ = _ask(server, prompt)
    turn2 = prompt + answer + _tokens(30)
    answer2, cached, _ = _ask(server, turn2)
    assert cached == len(prompt) + len(answer) - 1
    turn3 = turn2 + answer2 + _tokens(20)
    one_offs = _push_out(server, (1 + HOST_RATIO) * DEVICE_TOKENS + 5 * ONE_OFF_TOKENS)
    _, cached, _ = _ask(server, one_offs[0], new_tokens=2)
    assert cached == 0, "the first one-off prompt should have been evicted from device and host"
    _, cached, _ = _ask(server, turn3)
    assert cached == len(turn2) + len(answer2) - 1
    counters = re.findall(r"retained_dropped_tokens=(\d+)", server.log_text())
    assert counters and int(counters[-1]) == 0


def test_storage_tier_refused_for_hybrids():
    """SGLang's hybrid storage path has no format keys and no checksums: a one-line refusal at start-up."""
    from sglang_ext import compat
    from sglang_ext.hicache.hooks import HYBRID_STORAGE_REFUSAL, _create_backend

    class Entry:
        def __init__(self, host_pool):
            self.host_pool = host_pool

    class Group:
        entries = (Entry(object()), Entry(object.__new__(compat.MambaPoolHost)))

    with pytest.raises(ValueError) as refused:
        _create_backend(lambda *a, **k: pytest.fail("SGLang's backend was created"), None, "file", None, Group())
    assert str(refused.value) == HYBRID_STORAGE_REFUSAL and "\n" not in HYBRID_STORAGE_REFUSAL
