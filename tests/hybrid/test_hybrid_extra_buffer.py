"""SGLang's Mamba radix cache with recurrent-state snapshots (`extra_buffer`, its default on GPUs) on the CPU
platform: tiny Qwen3.5 and tiny qwen4_exp on stock launch_server, SGLang's own strategy resolution (no
--mamba-radix-cache-strategy, overlap scheduler on), `--mamba-track-interval 64`.

With extra_buffer SGLang keeps a request's recurrent state and conv window at multiples of 64 tokens (the GDN chunk
size) in tracking slots: in prefill at the last multiple of 64 after each chunk's start (`prefix + extend // 64 *
64`), in decode at every multiple of the track interval the sequence reaches (the checkpoint copy
sglang_ext/hybrid/ops/state_track.py replaces on CPU). A finished request leaves its last tracked state in the tree.
Each check below is greedy and compares a request that restores a tracked state with the same request sent cold
after a cache flush on the same server: the same tokens, log-probabilities within LOGPROB_TOL.

The Qwen3.5 server chunks prefill at 160 tokens, so a 300-token prompt is prefilled as 160 + 140 and tracked
inside both chunks. qwen4_exp's QSA forces page size 64, which the Mamba radix cache takes only with extra_buffer:
its server runs with the radix cache on (its other tests need `--disable-radix-cache` without this strategy).

Both servers also run the features that meet the tracked states: compressed KV (Qwen3.5 octave_k3v4, qwen4_exp
int8), `--session-retention-seconds` and the HiCache host tier. Every hit above restores compressed KV pages with a
tracked state; the host round trip pushes a turn's tracked prefix out of the device with one long prompt and
restores it from host RAM (KV pages, recurrent state and, for qwen4_exp, the QSA indexer's compressed keys).
Flags otherwise as test_hybrid_sessions.py / test_qwen4_exp_serving.py (float32 weights and conv state)."""

import re

import pytest
import requests
import torch
from server import ServerProcess

from sglang_ext.models.tiny import prepare_tiny

GRID = 64  # GDN chunk size = the track interval asked for (SGLang tracks at lcm(64, page size, interval))
CHUNK = 160
# Hit and cold run the same float32 kernels over different splits of the sequence (a prefix restored from a
# tracked state, decode steps vs one prefill): measured at most 2.4e-6 (Qwen3.5) and 1.4e-6 (qwen4_exp).
LOGPROB_TOL = 2e-5
ENV = {"SGLANG_MAMBA_CONV_DTYPE": "float32"}
COMMON = ["--dtype", "float32", "--enable-cache-report", "--mamba-track-interval", str(GRID),
          "--max-mamba-cache-size", "16", "--session-retention-seconds", "600", "--enable-hierarchical-cache",
          "--hicache-io-backend", "direct", "--hicache-mem-layout", "page_first_direct", "--hicache-ratio", "2"]
QWEN3_5_TOKENS, QWEN4_TOKENS = 2000, 1024  # device pools; the host tier holds twice as many


def _tracked(prefix: int, extend: int) -> int:
    """Where SGLang's extend tracks the state of a chunk of `extend` tokens after `prefix` cached ones."""
    return prefix + extend // GRID * GRID


def _start(model: str, kv_format: str, extra: list[str], name: str) -> ServerProcess:
    server = ServerProcess(str(prepare_tiny(model)), [*COMMON, "--kv-cache-dtype", kv_format, *extra], env=ENV,
                           name=name).start()
    log = server.log_text()
    # SGLang's resolution picked the strategy from the platform's declaration, with its overlap scheduler
    assert "'mamba_radix_cache_strategy': 'extra_buffer'" in log and "'disable_overlap_schedule': False" in log
    assert f"sglang-ext HiCache host pool: {kv_format}" in log, "not the compressed host pool"
    return server


@pytest.fixture(scope="module")
def qwen3_5(model_dir):  # model_dir: the built-in tokenizer the tiny model copies
    server = _start("qwen3_5", "octave_k3v4", ["--max-total-tokens", str(QWEN3_5_TOKENS), "--chunked-prefill-size",
                                               str(CHUNK)], "tiny-qwen3_5-extra-buffer")
    yield server
    server.stop()


_gen = torch.Generator().manual_seed(64)


def _tokens(n: int) -> list[int]:
    return torch.randint(3, 49000, (n,), generator=_gen).tolist()


def _ask(server, ids, new_tokens=8) -> dict:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0.0},
            "return_logprob": True}
    reply = requests.post(f"{server.url}/generate", json=body, timeout=600)
    reply.raise_for_status()
    meta = reply.json()["meta_info"]
    return {"ids": reply.json()["output_ids"], "cached": meta["cached_tokens"],
            "details": meta.get("cached_tokens_details"),
            "logprobs": [entry[0] for entry in meta["output_token_logprobs"]]}


def _cold(server, ids, new_tokens=8) -> dict:
    server.flush_cache()
    reply = _ask(server, ids, new_tokens)
    assert reply["cached"] == 0
    return reply


def _assert_same(hit: dict, cold: dict, what: str) -> None:
    assert hit["ids"] == cold["ids"], f"{what}: greedy tokens differ from the cold request's"
    gap = max(abs(a - b) for a, b in zip(hit["logprobs"], cold["logprobs"]))
    assert gap < LOGPROB_TOL, f"{what}: log-probabilities differ from the cold request's by {gap:.2e}"


def test_same_prompt_twice_hits_its_tracked_prefix(qwen3_5):
    prompt = [1] + _tokens(149)
    cold = _cold(qwen3_5, prompt)
    again = _ask(qwen3_5, prompt)
    assert again["cached"] == _tracked(0, len(prompt)) == 128
    _assert_same(again, cold, "same prompt")


def test_prompts_sharing_a_prefix_longer_than_the_interval_share_it(qwen3_5):
    """The first request's state tracked at 128 lies inside the 140 shared tokens: the second request restores it
    (no_buffer keeps the state only where the first request ended, at 150, and misses)."""
    shared = [1] + _tokens(139)
    first, second = shared + _tokens(10), shared + _tokens(30)
    cold = _cold(qwen3_5, second)
    qwen3_5.flush_cache()
    _ask(qwen3_5, first)
    hit = _ask(qwen3_5, second)
    assert hit["cached"] == _tracked(0, len(first)) == 128
    _assert_same(hit, cold, "shared prefix")


def _next_turn_from_device_and_host(server, push_out: int, what: str) -> None:
    """A 120-token prompt is tracked at 64 in prefill; its 20-token answer decodes past 128, where the decode-time
    checkpoint copies the state. The next turn (prompt + answer + new message) restores that state: 128 cached
    tokens, more than the prompt, as cold. Then one prompt of `push_out` tokens needs the device pool (a retained
    session too must leave it) and the same turn restores its 128 tokens from the host tier, as cold."""
    prompt = [1] + _tokens(119)
    answer = _cold(server, prompt, new_tokens=20)["ids"]
    assert len(prompt) < 128 < len(prompt) + len(answer)
    turn = prompt + answer + _tokens(10)
    warm = _ask(server, turn)
    assert warm["cached"] == 128 and warm["details"] == {"device": 128, "host": 0}, warm
    cold = _cold(server, turn)
    _assert_same(warm, cold, f"{what} next turn")
    server.flush_cache()
    _ask(server, prompt, new_tokens=20)
    assert _ask(server, turn)["details"] == {"device": 128, "host": 0}
    _ask(server, [1] + _tokens(push_out - 1), new_tokens=2)
    host = _ask(server, turn)
    assert host["cached"] == 128 and host["details"]["host"] > 0, f"{what}: expected a host-tier hit, got {host}"
    _assert_same(host, cold, f"{what} next turn from the host tier")


def test_decode_checkpoint_serves_the_next_agent_turn_from_device_and_host(qwen3_5):
    _next_turn_from_device_and_host(qwen3_5, QWEN3_5_TOKENS - 40, "Qwen3.5")


def test_chunked_prefill_tracks_inside_each_chunk(qwen3_5):
    """300 tokens prefilled as 160 + 140: the first chunk tracks 128, the second 160 + 128 = 288 (past the interval
    boundaries 192 and 256 inside it). The same prompt again restores 288; a prompt sharing 200 tokens restores
    the first chunk's 128."""
    prompt = [1] + _tokens(299)
    cold = _cold(qwen3_5, prompt)
    assert re.search(rf"#new-token: {CHUNK}, #cached-token: 0,", qwen3_5.log_text()), "the prompt was not chunked"
    again = _ask(qwen3_5, prompt)
    assert again["cached"] == _tracked(CHUNK, len(prompt) - CHUNK) == 288
    _assert_same(again, cold, "chunked prompt")
    branch = prompt[:200] + _tokens(20)
    branch_cold = _cold(qwen3_5, branch)
    qwen3_5.flush_cache()
    _ask(qwen3_5, prompt)
    branch_hit = _ask(qwen3_5, branch)
    assert branch_hit["cached"] == _tracked(0, CHUNK) == 128
    _assert_same(branch_hit, branch_cold, "prompt sharing the first chunk")


def test_qwen4_exp_serves_with_the_radix_cache(model_dir):
    """qwen4_exp (page size 64) with the radix cache on, int8 KV: the same prompt twice and the turn after a
    decode-time checkpoint, from the device and from the host tier, each as cold."""
    server = _start("qwen4_exp", "int8", ["--max-total-tokens", str(QWEN4_TOKENS), "--mem-fraction-static", "0.95"],
                    "tiny-qwen4_exp-extra-buffer")
    try:
        prompt = [1] + _tokens(149)
        cold = _cold(server, prompt)
        again = _ask(server, prompt)
        assert again["cached"] == 128
        _assert_same(again, cold, "qwen4_exp same prompt")
        # 14 of the pool's 16 pages: the turn's 3 pages cannot all stay on the device
        _next_turn_from_device_and_host(server, QWEN4_TOKENS - 128, "qwen4_exp")
    finally:
        server.stop()
