"""HiCache over a compressed KV format under tensor parallelism: octave_k3v4 at `--tp-size 2` on the CPU platform.

Model: the tiny llama-d128 (2 KV heads of 128, 2 layers, float32): at TP=2 each rank holds one KV head in its
device pool, its host pool and its stored pages. Two server starts sharing one file-storage directory:
  1. host tier: a prompt pushed out of a 600-token device pool to host comes back (host hits, as many tokens as
     the device hit had) with the device hit's greedy output; the pages written to storage are keyed per rank:
     SGLang's HiCacheFile suffix `_<model>_<rank>_<tp size>`, and sglang-ext's verified namespace carries the rank
     too (`hooks.shard_suffix`), so no page key is stored by both ranks, both ranks stored as many pages, and no
     rank's page holds the bytes of another rank's page (another head).
  2. a restart with the same flags serves the prompt from those pages (storage hits) with the device hit's output.
Without a server: two ranks' verified file storages over one directory do not see each other's pages, a page
another rank wrote under this rank's name fails its checksum, and one process keeps its namespace.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
import torch
from server import ServerProcess
from text_fixtures import long_text

from sglang_ext.models.tiny import prepare_tiny

from test_hicache_host_pool import fill, make_device_pool, make_host_pool  # isort: skip

TP = 2
DEVICE_POOL_TOKENS = 600
PROMPT = long_text(230) + "\nQuestion: what is sold in the market? Answer:"
OTHER = "Story two. " + long_text(130)[::-1] + "\nSummary:"  # shares no prefix with PROMPT
NEW_TOKENS = 8
RANK_SUFFIX = re.compile(r"^(?P<key>[0-9a-f]+)_(?P<model>m[0-9a-f]+)_(?P<rank>\d+)_(?P<size>\d+)\.bin$")


def details(response) -> dict:
    return response["meta_info"].get("cached_tokens_details") or {}


def serve(store: Path, name: str) -> ServerProcess:
    args = [
        "--dtype", "float32", "--enable-cache-report", "--max-total-tokens", str(DEVICE_POOL_TOKENS),
        "--kv-cache-dtype", "octave_k3v4", "--tp-size", str(TP),
        "--enable-hierarchical-cache", "--hicache-io-backend", "direct", "--hicache-mem-layout", "layer_first",
        "--hicache-size", "1", "--hicache-storage-backend", "file",
        "--hicache-storage-backend-extra-config", f'{{"file_storage_path": "{store}"}}',
        "--hicache-storage-prefetch-policy", "wait_complete",
    ]  # fmt: skip
    env = {"SGLANG_CPU_OMP_THREADS_BIND": "|".join(str(r % (os.cpu_count() or 1)) for r in range(TP))}
    return ServerProcess(str(prepare_tiny("llama-d128")), args, env=env, name=name).start()


def pages_by_rank(store: Path) -> dict[int, dict[str, bytes]]:
    ranks: dict[int, dict[str, bytes]] = {}
    for f in store.glob("*.bin"):
        m = RANK_SUFFIX.match(f.name)
        assert m, f"page file {f.name} is not keyed <digest>_<model>_<rank>_<tp size>"
        assert int(m["size"]) == TP, f.name
        ranks.setdefault(int(m["rank"]), {})[m["key"]] = f.read_bytes()
    return ranks


def wait_for_pages(store: Path, timeout_s: float = 300) -> dict[int, dict[str, bytes]]:
    """Storage writes are asynchronous: wait until both ranks' page counts are non-zero and stable for 3 s."""
    deadline, last, stable_since = time.monotonic() + timeout_s, None, time.monotonic()
    while time.monotonic() < deadline:
        counts = {r: len(p) for r, p in pages_by_rank(store).items()} if store.exists() else {}
        if counts != last:
            last, stable_since = counts, time.monotonic()
        elif len(counts) == TP and time.monotonic() - stable_since >= 3:
            return pages_by_rank(store)
        time.sleep(0.5)
    raise TimeoutError(f"stored pages did not settle in {timeout_s} s (last counts per rank {last})")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("hicache-tp-store") / "pages"


WARM: dict[str, list[int]] = {}


def test_host_tier_round_trip_and_per_rank_pages(store):
    server = serve(store, "hicache-tp2-octave_k3v4")
    try:
        assert server.server_info().get("tp_size") == TP
        cold = server.generate(PROMPT, max_new_tokens=NEW_TOKENS)
        assert cold["meta_info"]["cached_tokens"] == 0, cold["meta_info"]
        warm = server.generate(PROMPT, max_new_tokens=NEW_TOKENS)
        assert details(warm).get("device", 0) > 0, warm["meta_info"]
        other = server.generate(OTHER, max_new_tokens=2)
        assert warm["meta_info"]["prompt_tokens"] + other["meta_info"]["prompt_tokens"] > DEVICE_POOL_TOKENS
        again = server.generate(PROMPT, max_new_tokens=NEW_TOKENS)
        assert details(again).get("host", 0) == details(warm)["device"], (details(again), details(warm))
        assert again["output_ids"] == warm["output_ids"], (again["text"], warm["text"])
        WARM["octave_k3v4"] = warm["output_ids"]
        ranks = wait_for_pages(store)
    finally:
        server.stop()
    assert sorted(ranks) == list(range(TP)), sorted(ranks)
    keys = [set(ranks[r]) for r in range(TP)]
    assert len(keys[0]) == len(keys[1]), [len(k) for k in keys]
    shared = keys[0] & keys[1]
    assert not shared, f"{len(shared)} of {len(keys[0])} page keys are stored by both ranks: not keyed per rank"
    contents = [{page[64:] for page in ranks[r].values()} for r in range(TP)]  # past the 64-byte header
    assert not contents[0] & contents[1], "a page of one rank holds the bytes of a page of the other (one head each)"
    print(f"host hit {details(again)}; {len(keys[0])} pages per rank, keys and bytes distinct across ranks")


def test_restart_reads_each_ranks_pages_back(store):
    assert "octave_k3v4" in WARM, "runs after test_host_tier_round_trip_and_per_rank_pages"
    server = serve(store, "hicache-tp2-octave_k3v4-restart")
    try:
        served = server.generate(PROMPT, max_new_tokens=NEW_TOKENS)
        rejected = [line for line in server.log_text().splitlines() if "sglang-ext HiCache storage: page" in line]
    finally:
        server.stop()
    assert details(served).get("storage", 0) > 0, served["meta_info"]
    assert not rejected, rejected[:3]
    assert served["output_ids"] == WARM["octave_k3v4"], served["text"]
    print(f"restart: {details(served)}")


def test_ranks_keep_their_own_verified_keys(tmp_path):
    import shutil

    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_ext.hicache import hooks

    hooks.register()  # the plugin does this in SGLang processes; this test process applies them itself
    HookRegistry.apply_hooks()
    device = make_device_pool("octave_k3v4")
    fill(device, seed=3)
    host = make_host_pool(device)
    idx = host.alloc(1)
    host.backup_from_device_all_layer(device, idx, torch.tensor([4]), "direct")

    def storage(rank, size=TP):
        config = HiCacheStorageConfig(
            tp_rank=rank, tp_size=size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
            enable_storage_metrics=False, is_page_first_layout=False, model_name="tiny",
            extra_config={"file_storage_path": str(tmp_path / "pages")},
        )  # fmt: skip
        return hooks._create_backend(None, None, "file", config, host)

    single, rank0, rank1 = storage(0, 1), storage(0), storage(1)
    assert single.namespace == f"{host.storage_format_tag}-p1"  # one process: pages stored before stay valid
    assert len({single.namespace, rank0.namespace, rank1.namespace}) == 3
    assert rank0.set("key-a", host.get_data_page(idx[0]))
    assert rank0.batch_exists(["key-a"]) == 1 and rank1.batch_exists(["key-a"]) == 0
    # A backend that does not add the rank to its keys: rank 0's page under the name rank 1 looks up.
    written = tmp_path / "pages" / f"{rank0.inner._get_suffixed_key(rank0.key_for('key-a'))}.bin"
    shutil.copy(written, tmp_path / "pages" / f"{rank1.inner._get_suffixed_key(rank1.key_for('key-a'))}.bin")
    assert rank1.get("key-a", host.get_dummy_flat_data_page()) is None and rank1.rejected_pages == 1
    assert torch.equal(rank0.get("key-a", host.get_dummy_flat_data_page()), host.get_data_page(idx[0]))
