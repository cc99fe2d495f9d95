"""Compressed KV on a hybrid GDN model together with NEXTN speculative decoding from the model's MTP layer, the
HiCache host tier and agent sessions: the checks that tests/hybrid/test_hybrid_kv_formats.py runs per format, and
the host pool's packing of the MTP draft layer (server-less, below).

The servers live in test_hybrid_kv_formats.py: the per-format plain server is the reference, and one or two NEXTN
servers per format (ROTATION) compare with it, so that every format meets chain or tree drafts and the host tier
without a server per (format x feature):

| format      | plain server (torch_native)    | NEXTN servers (torch_native)              |
|-------------|--------------------------------|-------------------------------------------|
| int8        | session retention              | chain + host tier + session retention     |
| octave_k3v4 | session retention              | chain + host tier + session retention     |
| octave_k3v3 | session retention              | tree + host tier + session retention      |

- NEXTN chain (topk 1) / tree (topk 2) over the format: greedy output token for token equal to the plain server
  over the same format (row-invariant decode over compressed KV is the default,
  docs/speculative-decoding.md), and drafts accepted. The draft (SGLang's Qwen3_5ForCausalLMMTP) has its own
  HybridLinearKVPool whose full-attention sub-pool holds the format's planes; its attention must be our
  compressed backend (spec/draft_backends.py).
- HiCache host tier with NEXTN on: an agent turn pushed out of the 600-token device pool by one long prompt comes
  back from host RAM (format planes of the target's and the MTP layer's KV + recurrent state;
  cached_tokens_details says host) and answers as the device hit and the cold request did, log-probabilities and
  verify counts included. The server runs --session-retention-seconds too: the device hit is the second agent
  turn, cached up to the first turn's last answer token, and the one long prompt still pushes the retained
  session to the host tier. The MTP layer of this checkpoint drafts without its attention (o_proj zero, see
  test_hybrid_mtp.py), so a wrong draft KV page would not show in the served tokens: the bit-exact round trip of
  the draft layer is checked on the host pool itself (test_host_pool_packs_the_mtp_draft_layer).
"""

import pytest
import requests
import torch

NEXTN_PROMPT_LENGTHS = (6, 20, 40, 71)
NEXTN_NEW_TOKENS = 32
DEVICE_TOKENS = 600
HOST_NEW_TOKENS = 16
HICACHE_ARGS = ("--max-total-tokens", str(DEVICE_TOKENS), "--enable-hierarchical-cache", "--hicache-io-backend",
                "direct", "--hicache-mem-layout", "page_first_direct", "--hicache-ratio", "2",
                "--session-retention-seconds", "600")
# name: (--speculative-num-steps, --speculative-eagle-topk, --speculative-num-draft-tokens)
DRAFTS = {"chain": (3, 1, 4), "tree": (3, 2, 6)}
# format: ((draft, with the host tier), ...): every format meets a draft shape and the host tier
ROTATION = {
    "int8": (("chain", True),),
    "octave_k3v4": (("chain", True),),
    "octave_k3v3": (("tree", True),),
}


def nextn_args(draft: str) -> tuple[str, ...]:
    steps, topk, draft_tokens = DRAFTS[draft]
    return ("--speculative-algorithm", "NEXTN", "--speculative-num-steps", str(steps), "--speculative-eagle-topk",
            str(topk), "--speculative-num-draft-tokens", str(draft_tokens))


def nextn_prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [[1] + torch.randint(3, 49000, (n - 1,), generator=gen).tolist() for n in NEXTN_PROMPT_LENGTHS]


def generate(server, ids, new_tokens, logprobs=False) -> dict:
    body = {"input_ids": ids, "return_logprob": logprobs,
            "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0.0, "ignore_eos": True}}
    reply = requests.post(f"{server.url}/generate", json=body, timeout=900)
    reply.raise_for_status()
    return reply.json()


def greedy(server) -> list[dict]:
    return [generate(server, ids, NEXTN_NEW_TOKENS) for ids in nextn_prompts()]  # batch 1: one request per verify


def check_nextn_equals_plain(server, plain, label) -> float:
    """NEXTN's greedy output on the NEXTN prompts equals `plain` (the same prompts on the plain server) token for
    token and drafts were accepted; returns the accept length."""
    outs = greedy(server)
    for ids, got, want in zip(nextn_prompts(), outs, plain):
        first_diff = next((i for i, (a, b) in enumerate(zip(got["output_ids"], want["output_ids"])) if a != b), None)
        assert first_diff is None and len(got["output_ids"]) == NEXTN_NEW_TOKENS, (
            f"{label}, prompt of {len(ids)} tokens: NEXTN parts from plain at token {first_diff}")
    verifies = sum(o["meta_info"]["spec_verify_ct"] for o in outs)
    accept_length = NEXTN_NEW_TOKENS * len(outs) / verifies
    assert accept_length > 1.1, f"{label}: accept length {accept_length:.2f}: (almost) no MTP draft was accepted"
    return accept_length


def host_round_trip(server, kv_format: str | None) -> dict:
    """An agent turn's greedy answer cold, as a device hit (the second turn), and as a host hit after one long
    prompt pushed its prefix out of the device pool; asserts the hits happened where expected
    (cached_tokens_details) and returns {kind: (output ids, meta_info, token log-probabilities)}. kv_format: the
    compressed format the host pool must hold (None: SGLang's dense host pool)."""
    if kv_format is not None:
        assert f"sglang-ext HiCache host pool: {kv_format}" in server.log_text(), "not the compressed host pool"
    gen = torch.Generator().manual_seed(40)

    def tokens(n):
        return torch.randint(3, 49000, (n,), generator=gen).tolist()

    def ask(ids, new_tokens=HOST_NEW_TOKENS):
        reply = generate(server, ids, new_tokens, logprobs=True)
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
    # One prompt that needs nearly the whole device pool pushes the turn's prefix out to the host tier (a
    # retained session too: retention orders eviction, it does not pin pages a request needs).
    ask([1] + tokens(DEVICE_TOKENS - 41), new_tokens=2)
    got["host"] = ask(turn2)
    assert got["host"][1]["cached_tokens"] == reusable
    assert got["host"][1]["cached_tokens_details"] == {"device": 0, "host": reusable}, (
        f"expected a host-tier hit: {got['host'][1]['cached_tokens_details']}")
    assert got["device"][0] == got["cold"][0] and got["host"][0] == got["device"][0]
    # The host tier moves the stored bytes as they are: the same pages give the same log-probabilities, and
    # after a host hit the drafts are the drafts after a device hit.
    assert got["host"][2] == got["device"][2]
    if "spec_verify_ct" in got["device"][1]:
        assert got["host"][1]["spec_verify_ct"] == got["device"][1]["spec_verify_ct"]
    return got


def _compressed_device_pool(layers: int, fmt_name: str = "octave_k3v4"):
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
