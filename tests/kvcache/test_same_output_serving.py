"""Same prompt, same output over a lossy KV format whatever the cache tier or scheduler, in the default extend
mode (`SGLANG_EXT_KV_EXTEND_NEW_TOKENS=pool`: every extend reads its new tokens back through the format).

Servers on the CPU platform (float32, greedy, SGLang's default prefill chunk), sharing one HiCache file-storage
directory:
  A, per format (int8, octave_k3v4, octave_k3v3), overlap scheduler on: cold; radix device hit; host-tier hit
     (pushed out of a small device pool, loaded back).
  B, octave_k3v4 restarted with --disable-overlap-schedule: storage-tier hit (A's pages); radix device hit;
     then, the stored pages deleted and the cache flushed, cold again.
Every run is compared with A's cold run: the same output tokens, per-token logprobs within LOGPROB_TOL.
A hit reads the prefix's stored bytes and recomputes only the last prompt token, over the same values the cold
prefill read (in the default "full" mode the cold prefill read its own tokens at full precision instead).
Not tested: other --chunked-prefill-size values and batches of different prompts. A chunk computes its rows
in one GEMM whose float32 rounding depends on the row count (MKL), a last-bit difference that a 3-4-bit code
boundary turns into a different code, and the difference then spreads through every later token's K/V
(docs/kv-formats.md); SGLang guarantees batch invariance only under --enable-deterministic-inference, which on
this platform covers decode and verify steps, not prefill.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import requests
from server import ServerProcess
from text_fixtures import long_text

FORMATS = ("int8", "octave_k3v4", "octave_k3v3")
DEVICE_POOL_TOKENS = 600
PROMPT = long_text(230) + "\nQuestion: what is sold in the market? Answer:"
OTHER = "Story two. " + long_text(130)[::-1] + "\nSummary:"  # shares no prefix with PROMPT
NEW_TOKENS = 16
# float32 noise: a hit recomputes the last prompt token in a 1-row GEMM, the cold prefill in a 307-row one (MKL
# rounds them last-bit differently); its K/V can land on the other side of a code boundary. Measured (16 tokens):
# pool mode 1.5e-6 to 4.5e-3 over every case with batched decode rows; with row-invariant decode (the default over
# compressed KV since) the int8 device hit parted from cold by 4.6e-2 with equal tokens (cause not isolated: the
# recomputed token is the only input that differs). The full mode on the same device hits: int8 7.1e-2,
# octave_k3v4 2.6e-1, octave_k3v3 other tokens. Tokens must be equal; logprobs within LOGPROB_TOL.
LOGPROB_TOL = 1e-1


def server_args(store: Path, kv_format: str, *extra: str) -> tuple[str, ...]:
    return (
        "--dtype", "float32", "--enable-cache-report", "--max-total-tokens", str(DEVICE_POOL_TOKENS),
        "--enable-hierarchical-cache", "--hicache-io-backend", "direct", "--hicache-mem-layout", "layer_first",
        "--hicache-size", "1", "--hicache-storage-backend", "file",
        "--hicache-storage-backend-extra-config", f'{{"file_storage_path": "{store}"}}',
        "--hicache-storage-prefetch-policy", "wait_complete", "--kv-cache-dtype", kv_format, *extra,
    )  # fmt: skip


def generate(server: ServerProcess, text, max_new_tokens: int = NEW_TOKENS):
    body = {"text": text, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0},
            "return_logprob": True}
    r = requests.post(f"{server.url}/generate", json=body, timeout=600)
    r.raise_for_status()
    return r.json()


def details(out: dict) -> dict:
    return out["meta_info"].get("cached_tokens_details") or {}


def tokens_and_logprobs(out: dict) -> tuple[list[int], list[float]]:
    pairs = [(tok, lp) for lp, tok, _txt in out["meta_info"]["output_token_logprobs"]]
    return [t for t, _ in pairs], [lp for _, lp in pairs]


def assert_same(got: dict, want: dict, what: str) -> float:
    """Same tokens, logprobs within LOGPROB_TOL; returns the largest logprob difference."""
    got_ids, got_lp = tokens_and_logprobs(got)
    want_ids, want_lp = tokens_and_logprobs(want)
    assert got_ids == want_ids, f"{what}: {got['text']!r} != {want['text']!r}"
    diff = max(abs(a - b) for a, b in zip(got_lp, want_lp))
    assert diff <= LOGPROB_TOL, f"{what}: logprobs differ by up to {diff:.2e} (tokens equal)"
    return diff


def wait_for_stored_pages(store: Path, timeout_s: float = 300) -> int:
    """Storage writes are asynchronous: wait until the page count is non-zero and stable for 3 s."""
    deadline, last, stable_since = time.monotonic() + timeout_s, -1, time.monotonic()
    while time.monotonic() < deadline:
        n = len(list(store.glob("*.bin"))) if store.exists() else 0
        if n != last:
            last, stable_since = n, time.monotonic()
        elif n > 0 and time.monotonic() - stable_since >= 3:
            return n
        time.sleep(0.5)
    raise TimeoutError(f"stored pages did not settle in {timeout_s} s (last count {last})")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("same-output-store") / "pages"


COLD: dict[str, dict] = {}  # each format's cold run on server A, for the restart test


@pytest.mark.parametrize("kv_format", FORMATS)
def test_same_output_across_cache_tiers(server_pool, store, kv_format):
    a = server_pool.get(*server_args(store, kv_format), name=f"same-{kv_format}")
    cold = generate(a, PROMPT)
    assert cold["meta_info"]["cached_tokens"] == 0, cold["meta_info"]
    COLD[kv_format] = cold
    diffs = {}
    device = generate(a, PROMPT)
    assert details(device).get("device", 0) > 0, device["meta_info"]
    diffs["device hit"] = assert_same(device, cold, f"{kv_format}: radix device hit vs cold")
    other = generate(a, OTHER, max_new_tokens=2)
    assert device["meta_info"]["prompt_tokens"] + other["meta_info"]["prompt_tokens"] > DEVICE_POOL_TOKENS
    host = generate(a, PROMPT)
    assert details(host).get("host", 0) > 0, host["meta_info"]
    diffs["host hit"] = assert_same(host, cold, f"{kv_format}: host-tier hit vs cold")
    print(f"{kv_format}: largest logprob differences vs cold: " + ", ".join(f"{k} {v:.1e}" for k, v in diffs.items()))
    if kv_format == RESTART_FORMAT:
        wait_for_stored_pages(store)
    a.stop()


RESTART_FORMAT = "octave_k3v4"


def test_same_output_after_restart_without_overlap(server_pool, store):
    # The restart covers the storage tier and the scheduler without overlap for one format: the tiers move the
    # same bytes for every format (tests/hicache), and a server start costs about a minute of the CI budget.
    kv_format = RESTART_FORMAT
    assert kv_format in COLD, "runs after test_same_output_across_cache_tiers"
    cold = COLD[kv_format]
    b = server_pool.get(*server_args(store, kv_format, "--disable-overlap-schedule"),
                        name=f"same-{kv_format}-b")
    diffs = {}
    stored = generate(b, PROMPT)
    assert details(stored).get("storage", 0) > 0, stored["meta_info"]
    diffs["storage hit after restart"] = assert_same(stored, cold, f"{kv_format}: storage hit after a restart vs cold")
    again = generate(b, PROMPT)
    assert details(again).get("device", 0) > 0, again["meta_info"]
    diffs["device hit, no overlap"] = assert_same(again, cold, f"{kv_format}: device hit without overlap vs cold")
    wait_for_stored_pages(store)
    for page in store.glob("*.bin"):
        page.unlink()
    b.flush_cache()
    recomputed = generate(b, PROMPT)
    assert recomputed["meta_info"]["cached_tokens"] == 0, recomputed["meta_info"]
    diffs["cold, no overlap"] = assert_same(recomputed, cold, f"{kv_format}: cold without overlap vs cold")
    b.stop()
    print(f"{kv_format}: largest logprob differences vs cold: " + ", ".join(f"{k} {v:.1e}" for k, v in diffs.items()))
