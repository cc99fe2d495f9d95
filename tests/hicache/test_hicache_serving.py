"""End to end on the CPU platform: HiCache with compressed KV formats, host tier and file storage tier.

Five servers, in this order (tests share them through the ServerPool; one is alive at a time), all with
`--hicache-size 1` and one file-storage directory:
  int8 / octave_k3v4 / octave_k3v3, layer_first: a prompt evicted to host comes back (host hits) with the
      greedy output of its device-cache hit; the octave servers do not hit the int8 pages already stored.
  int8, page_first (page_first_direct with the direct io backend), a restart: the prompt is served from the
      pages the layer_first server stored (storage hits, the device-hit output), then the host round trip in
      this layout; then a flipped byte in every stored page makes them misses (recomputed: the uncached
      output, and a log line).
  bf16 (`--kv-cache-dtype bfloat16`, SGLang's dense pool; the weights stay float32): does not hit the
      compressed pages; its host pool size is the capacity baseline.
Layout coverage: the host moves are one code path per layout (kernels/host_pages.py), unit-tested bit-exact
for every format x layout; the server runs put each format through layer_first and one format through the
paged layout, whose page-major indexing is the only layout-specific code.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from text_fixtures import long_text

FORMATS = ("int8", "octave_k3v4", "octave_k3v3")
HEAD_DIM = 64
BF16_BYTES_PER_TOKEN_HEAD = 2 * HEAD_DIM * 2
DEVICE_POOL_TOKENS = 600
PROMPT = long_text(230) + "\nQuestion: what is sold in the market? Answer:"
OTHER = "Story two. " + long_text(130)[::-1] + "\nSummary:"  # shares no prefix with PROMPT
NEW_TOKENS = 8
HOST_POOL_LINE = re.compile(r"Allocating kv hierarchical KV host pool: (\d+) tokens")

# Filled as the module runs: uncached and device-cache-hit outputs and each server's log path, for later tests.
COLD: dict[str, list[int]] = {}
WARM: dict[str, list[int]] = {}
LOGS: dict[str, Path] = {}


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("hicache-store") / "pages"


def server_args(store: Path, kv_format: str, layout: str) -> tuple[str, ...]:
    args = (
        "--dtype", "float32", "--enable-cache-report", "--max-total-tokens", str(DEVICE_POOL_TOKENS),
        "--enable-hierarchical-cache", "--hicache-io-backend", "direct", "--hicache-mem-layout", layout,
        "--hicache-size", "1", "--hicache-storage-backend", "file",
        "--hicache-storage-backend-extra-config", f'{{"file_storage_path": "{store}"}}',
        # SGLang's default (best_effort) admits a request with whatever its storage prefetch has loaded by then:
        # on a slow or loaded machine that can be nothing, and the storage tests would see no storage hits.
        "--hicache-storage-prefetch-policy", "wait_complete",
    )  # fmt: skip
    return args + ("--kv-cache-dtype", kv_format)


def details(response) -> dict:
    return response["meta_info"].get("cached_tokens_details") or {}


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


def evict_and_reload(server) -> tuple[dict, list[int]]:
    """PROMPT from the device cache, then pushed out to host by OTHER, then from host: the same greedy output.

    The oracle is the device-cache hit, not the uncached run: both read the cached prefix through the format's
    codes, while an uncached run sees the prompt's last prefill chunk at full precision (docs/kv-formats.md,
    "Radix cache and chunk boundaries"), so a lossy format may differ there. The host tier is lossless.
    """
    server.flush_cache()
    server.generate(PROMPT, max_new_tokens=NEW_TOKENS)
    warm = server.generate(PROMPT, max_new_tokens=NEW_TOKENS)
    assert details(warm).get("device", 0) > 0, warm["meta_info"]
    other = server.generate(OTHER, max_new_tokens=2)
    tokens = warm["meta_info"]["prompt_tokens"] + other["meta_info"]["prompt_tokens"]
    assert tokens > DEVICE_POOL_TOKENS, tokens  # OTHER pushes PROMPT out of the device pool
    again = server.generate(PROMPT, max_new_tokens=NEW_TOKENS)
    assert details(again).get("host", 0) > 0, again["meta_info"]
    assert details(again).get("host", 0) == details(warm)["device"], (details(again), details(warm))
    assert again["output_ids"] == warm["output_ids"], (again["text"], warm["text"])
    return details(again), warm["output_ids"]


@pytest.mark.parametrize("kv_format", FORMATS)
def test_evicted_prompt_comes_back_from_host(server_pool, store, kv_format):
    server = server_pool.get(*server_args(store, kv_format, "layer_first"), name=f"hicache-{kv_format}")
    LOGS[kv_format] = server.log_path
    # the page-hash extension is loaded at start-up, not by a storage thread that /flush_cache must then stop
    assert "page-hash extension ready" in server.log_path.read_text(errors="replace")
    cold = server.generate(PROMPT, max_new_tokens=NEW_TOKENS)
    # A fresh server: nothing on device or host, and the pages other formats stored are not its own.
    assert cold["meta_info"]["cached_tokens"] == 0, cold["meta_info"]
    COLD[kv_format] = cold["output_ids"]
    got, WARM[kv_format] = evict_and_reload(server)
    print(f"{kv_format} layer_first: {got}")
    if kv_format == "int8":
        print(f"int8 pages stored: {wait_for_stored_pages(store)}")


def test_restart_serves_stored_pages_then_host_round_trip_in_page_first(server_pool, store):
    assert "int8" in WARM, "runs after the int8 layer_first test"
    server = server_pool.get(*server_args(store, "int8", "page_first"), name="hicache-int8-page-first")
    served = server.generate(PROMPT, max_new_tokens=NEW_TOKENS)
    # Stored pages hold the same codes the device cache held: the output of the device-cache hit.
    assert details(served).get("storage", 0) > 0, served["meta_info"]
    assert served["output_ids"] == WARM["int8"], served["text"]
    got, warm = evict_and_reload(server)
    assert warm == WARM["int8"]
    print(f"restart: {details(served)}; int8 page_first: {got}")


def test_flipped_stored_bytes_are_misses_not_wrong_tokens(server_pool, store):
    server = server_pool.get(*server_args(store, "int8", "page_first"), name="hicache-int8-page-first")
    files = sorted(store.glob("*.bin"))
    assert files
    for f in files:
        raw = bytearray(f.read_bytes())
        raw[len(raw) // 2] ^= 0x10
        f.write_bytes(bytes(raw))
    server.flush_cache()
    again = server.generate(PROMPT, max_new_tokens=NEW_TOKENS)
    # Nothing usable is stored: the prompt is recomputed from scratch, as the first uncached run was.
    assert again["meta_info"]["cached_tokens"] == 0, again["meta_info"]
    assert again["output_ids"] == COLD["int8"], again["text"]
    rejected = [line for line in server.log_text().splitlines() if "sglang-ext HiCache storage: page" in line]
    assert rejected and "checksum mismatch" in rejected[0], rejected[:3]
    print(f"{len(rejected)} rejected page lines; first: {rejected[0][-160:]}")


def test_bf16_server_does_not_hit_compressed_pages_and_capacity_per_format(server_pool, store):
    server = server_pool.get(*server_args(store, "bfloat16", "layer_first"), name="hicache-bf16")
    LOGS["bf16"] = server.log_path
    cold = server.generate(PROMPT, max_new_tokens=NEW_TOKENS)
    assert cold["meta_info"]["cached_tokens"] == 0, cold["meta_info"]

    def host_tokens(log: Path) -> int:
        found = HOST_POOL_LINE.findall(log.read_text(errors="replace"))
        assert len(found) == 1, found
        return int(found[0])

    from sglang_ext.kvformats import get_format

    bf16_tokens = host_tokens(LOGS["bf16"])
    ran = [f for f in FORMATS if f in LOGS]  # every format whose server ran in this session (all, unfiltered)
    assert ran, "runs after the per-format tests"
    for kv_format in ran:
        tokens = host_tokens(LOGS[kv_format])
        byte_ratio = BF16_BYTES_PER_TOKEN_HEAD / get_format(kv_format, HEAD_DIM, HEAD_DIM).bytes_per_token_head
        # Both sizes are floor(1e9 / bytes per token) + one padding page: allow that one token of rounding.
        assert tokens >= byte_ratio * bf16_tokens - byte_ratio, (kv_format, tokens, bf16_tokens, byte_ratio)
        print(f"--hicache-size 1: {kv_format} {tokens} host tokens, bf16 {bf16_tokens} ({tokens / bf16_tokens:.3f}x, "
              f"byte ratio {byte_ratio:.3f})")
