"""Compressed KV (`--kv-cache-dtype octave_k3v4`) on a hybrid GDN model together with NEXTN speculative decoding
from the model's MTP layer and the HiCache host tier: tiny Qwen3.5 on stock launch_server on the CPU platform,
float32, torch_native attention.

- NEXTN chain (topk 1) and tree (topk 2) over octave_k3v4: greedy output token for token equal to plain decoding
  over octave_k3v4, and drafts accepted. The draft (SGLang's Qwen3_5ForCausalLMMTP) has its own
  HybridLinearKVPool whose full-attention sub-pool holds the format's planes; its attention must be our
  compressed backend (before the fix in spec/draft_backends.py it got SGLang's dense torch_native backend, which
  the compressed pool refuses: the scheduler died on the first prefill).
- HiCache host tier over octave_k3v4: an agent turn pushed out of the 600-token device pool by one long prompt
  comes back from host RAM (format planes + recurrent state; cached_tokens_details says host) and answers as the
  device hit and the cold request did, log-probabilities included.
- All three together (the chain server runs the host tier too): SGLang packs the MTP draft's KV layer into the
  KV host pool; the compressed host pool refused that at start-up before (hicache/host_pool.py), now it carries
  the draft's planes after the target's. The MTP layer of this checkpoint drafts without its attention (o_proj
  zero, see below), so a wrong draft KV page would not show in the served tokens: the bit-exact round trip of the
  draft layer is checked on the host pool itself (test_host_pool_packs_the_mtp_draft_layer).

Checkpoint and NEXTN settings as tests/hybrid/test_hybrid_mtp.py (the MTP layer made able to guess); the host
tier recipe as tests/hybrid/test_hybrid_sessions.py. Three servers, at most two at once: the plain one is the
HiCache server (with the cache flushed first its greedy output is plain decoding: row-invariant decode over
compressed KV is the default, docs/speculative-decoding.md), NEXTN chain + host tier, NEXTN tree.
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
HICACHE_ARGS = ("--max-total-tokens", str(DEVICE_TOKENS), "--enable-hierarchical-cache", "--hicache-io-backend",
                "direct", "--hicache-mem-layout", "page_first_direct", "--hicache-ratio", "2")
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
    server = ServerProcess(checkpoint, [*HYBRID_ARGS, *HICACHE_ARGS], env=HYBRID_ENV,
                           name=f"hybrid-{KV_FORMAT}-hicache").start()
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


def _nextn_server(checkpoint, name, steps, topk, draft_tokens, extra=()) -> ServerProcess:
    return ServerProcess(checkpoint, [
        *HYBRID_ARGS, "--speculative-algorithm", "NEXTN", "--speculative-num-steps", str(steps),
        "--speculative-eagle-topk", str(topk), "--speculative-num-draft-tokens", str(draft_tokens), *extra,
    ], env=HYBRID_ENV, name=f"hybrid-{KV_FORMAT}-{name}").start()


def _check_nextn_equals_plain(server, plain, name, record_property):
    outs = _greedy(server)
    for ids, got, want in zip(_prompts(), outs, plain):
        first_diff = next((i for i, (a, b) in enumerate(zip(got["output_ids"], want["output_ids"])) if a != b), None)
        assert first_diff is None and len(got["output_ids"]) == NEW_TOKENS, (
            f"{KV_FORMAT} {name}, prompt of {len(ids)} tokens: NEXTN parts from plain at token {first_diff}")
    verifies = sum(o["meta_info"]["spec_verify_ct"] for o in outs)
    accept_length = NEW_TOKENS * len(outs) / verifies
    record_property(f"{name}_accept_length", accept_length)
    assert accept_length > 1.1, f"{name}: accept length {accept_length:.2f}: (almost) no MTP draft was accepted"


def _host_round_trip(server) -> dict:
    """An agent turn's greedy answer cold, as a device hit, and as a host hit after one long prompt pushed its
    prefix out of the device pool; asserts the hits happened where expected (cached_tokens_details) and returns
    {kind: (output ids, meta_info, token log-probabilities)}."""
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
    reusable = len(prompt) + len(answer) - 1  # the last answer token's KV and state were never computed
    server.flush_cache()
    got = {"cold": ask(turn2)}
    assert got["cold"][1]["cached_tokens"] == 0
    server.flush_cache()
    ask(prompt)
    got["device"] = ask(turn2)
    assert got["device"][1]["cached_tokens_details"] == {"device": reusable, "host": 0}, got["device"][1]
    # One prompt that needs nearly the whole device pool pushes the turn's prefix out to the host tier.
    ask([1] + tokens(DEVICE_TOKENS - 41), new_tokens=2)
    got["host"] = ask(turn2)
    assert got["host"][1]["cached_tokens"] == reusable
    assert got["host"][1]["cached_tokens_details"] == {"device": 0, "host": reusable}, (
        f"expected a host-tier hit: {got['host'][1]['cached_tokens_details']}")
    assert got["device"][0] == got["cold"][0] and got["host"][0] == got["device"][0]
    return got


def test_host_tier_hit_equals_device_hit(hicache_server):
    got = _host_round_trip(hicache_server)
    # The host tier moves the format's bytes as they are: the same planes give the same log-probabilities.
    assert got["host"][2] == got["device"][2]


def test_nextn_chain_with_host_tier(checkpoint, plain, record_property):
    """NEXTN chain over octave_k3v4 = plain decoding; the same server runs the HiCache host tier, which then
    carries the MTP draft's KV layer next to the target's (packed draft layers of the compressed host pool)."""
    name, steps, topk, draft_tokens = DRAFTS[0]
    server = _nextn_server(checkpoint, f"{name}-hicache", steps, topk, draft_tokens, extra=HICACHE_ARGS)
    try:
        _check_nextn_equals_plain(server, plain, name, record_property)
        got = _host_round_trip(server)
    finally:
        server.stop()
    assert "packed MTP KV layers: target_layers=1, draft_layers=1" in server.log_text()
    assert got["host"][2] == got["device"][2]
    # Equal verify counts: the drafts after a host hit are the drafts after a device hit.
    assert got["host"][1]["spec_verify_ct"] == got["device"][1]["spec_verify_ct"]


def test_nextn_tree_equals_plain(checkpoint, plain, record_property):
    name, steps, topk, draft_tokens = DRAFTS[1]
    server = _nextn_server(checkpoint, name, steps, topk, draft_tokens, extra=("--max-total-tokens", "2000"))
    try:
        _check_nextn_equals_plain(server, plain, name, record_property)
    finally:
        server.stop()


def _compressed_device_pool(layers: int, fmt_name: str = KV_FORMAT):
    from sglang_ext.kvcache.pool import CompressedMHATokenToKVPool
    from sglang_ext.kvformats import get_format

    return CompressedMHATokenToKVPool(
        40, page_size=1, dtype=torch.float32, head_num=2, head_dim=256, layer_num=layers, device="cpu",
        enable_memory_saver=False, v_head_dim=256, start_layer=0, end_layer=layers - 1, enable_alt_stream=False,
        enable_kv_cache_copy=False, kv_format=get_format(fmt_name, 256, 64))


def _host_pool(target, drafts):
    from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope

    from sglang_ext.hicache.host_pool import CompressedMHAHostPool

    info = target.get_device_pool_infos()[0].buffer_info
    draft_infos = tuple(d.get_device_pool_infos()[0].buffer_info for d in drafts)
    with host_memory_budget_scope(1 << 30):
        return CompressedMHAHostPool(info, 2.0, 0, 1, "page_first_direct", device_capacity_tokens=target.size,
                                     start_layer=0, end_layer=target.layer_num - 1, draft_buffer_infos=draft_infos)


def test_host_pool_packs_the_mtp_draft_layer():
    """The compressed host pool with SGLang's packed MTP draft pools (NEXTN + --enable-hierarchical-cache): one
    host layer per draft after the target's, backed up with them and loaded only when the controller asks for the
    draft (is_draft), bit-exact; a draft in another format is refused with one line."""
    target, draft = _compressed_device_pool(1), _compressed_device_pool(1)
    host = _host_pool(target, [draft])
    assert (host.target_layer_num, host.layer_num) == (1, 2)
    assert host.size_per_token == 2 * target.kv_format.bytes_per_token_head * 2
    gen = torch.Generator().manual_seed(3)
    src, dst = torch.tensor([3, 4, 5, 30]), torch.tensor([10, 11, 12, 13])
    for pool in (target, draft):
        k, v = (torch.randn(4, 2, 256, generator=gen) for _ in range(2))
        for name, rows in pool.kv_format.quantize(k, v).items():
            pool.layer_planes_for_transfer()[0][name][src] = rows
    saved = [{n: p[src].clone() for n, p in pool.layer_planes_for_transfer()[0].items()} for pool in (target, draft)]
    host_idx = host.alloc(4)
    host.backup_from_device_all_layer(target, host_idx, src, "direct")
    host.load_to_device_per_layer(target, host_idx, dst, 0, "direct")
    host.load_to_device_per_layer(draft, host_idx, dst, 1, "direct")  # not a draft load: a target layer id only
    assert all(torch.count_nonzero(p[dst]) == 0 for p in draft.layer_planes_for_transfer()[0].values())
    host.load_to_device_per_layer(draft, host_idx, dst, 1, "direct", is_draft=True)
    for pool, want in zip((target, draft), saved):
        for n, p in pool.layer_planes_for_transfer()[0].items():
            assert torch.equal(p[dst], want[n]), n
    with pytest.raises(ValueError) as refused:
        _host_pool(target, [_compressed_device_pool(1, "int8")])
    assert "MTP draft's KV pool is int8" in str(refused.value) and "\n" not in str(refused.value)
