"""The compressed host pool inside SGLang's host-pool contract, without a server: the class SGLang picks for a
compressed device pool, sizing by the format's real bytes, bit-exact device -> host -> device moves, storage
pages, and the verified storage wrapper over the 0600 file backend."""

from __future__ import annotations

import os
import stat

import pytest
import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope
from sglang.srt.mem_cache.pool_host.mha import get_mha_host_pool_cls

from sglang_ext.hicache import hooks
from sglang_ext.hicache.file_storage import PrivateHiCacheFile
from sglang_ext.hicache.host_pool import CompressedMHAHostPool
from sglang_ext.hicache.verified_storage import VerifiedPageStorage
from sglang_ext.kvcache.formats import KV_CACHE_DTYPES
from sglang_ext.kvcache.pool import CompressedMHATokenToKVPool
from sglang_ext.kvformats import get_format

HEADS, DIM, LAYERS, SIZE = 3, 64, 2, 40
BF16_BYTES_PER_TOKEN_HEAD = 2 * DIM * 2


def make_device_pool(name: str) -> CompressedMHATokenToKVPool:
    return CompressedMHATokenToKVPool(
        SIZE, page_size=1, dtype=torch.float32, head_num=HEADS, head_dim=DIM, layer_num=LAYERS, device="cpu",
        enable_memory_saver=False, v_head_dim=DIM, start_layer=0, end_layer=LAYERS - 1, enable_alt_stream=False,
        enable_kv_cache_copy=False, kv_format=get_format(name, DIM, DIM),
    )


def make_host_pool(device_pool, layout="layer_first", host_size=0, ratio=2.0) -> CompressedMHAHostPool:
    info = device_pool.get_device_pool_infos()[0].buffer_info
    cls = get_mha_host_pool_cls(info)
    with host_memory_budget_scope(1 << 31):
        return cls(info, ratio, host_size, 1, layout, pin_memory=True, device_capacity_tokens=device_pool.size,
                   start_layer=0, end_layer=LAYERS - 1)


@pytest.fixture(autouse=True, scope="module")
def _hooks():
    # The plugin installs these in SGLang processes; this test process applies them itself.
    from sglang.srt.plugins.hook_registry import HookRegistry

    hooks.register()
    HookRegistry.apply_hooks()


def fill(device_pool, seed):
    g = torch.Generator().manual_seed(seed)
    loc = torch.arange(1, SIZE + 1)
    for layer in range(LAYERS):
        k = torch.randn(SIZE, HEADS, DIM, generator=g)
        v = torch.randn(SIZE, HEADS, DIM, generator=g)
        for name, rows in device_pool.kv_format.quantize(k, v).items():
            device_pool.layer_planes_for_transfer()[layer][name][loc] = rows


@pytest.mark.parametrize("name", KV_CACHE_DTYPES)
def test_sglang_picks_the_compressed_host_pool_sized_by_the_format_bytes(name):
    device = make_device_pool(name)
    host = make_host_pool(device, host_size=1)
    assert type(host) is CompressedMHAHostPool
    fmt = device.kv_format
    assert host.size_per_token == fmt.bytes_per_token_head * HEADS * LAYERS
    bf16_tokens = int(1e9 // (BF16_BYTES_PER_TOKEN_HEAD * HEADS * LAYERS))
    ratio = host.size / bf16_tokens
    assert ratio >= BF16_BYTES_PER_TOKEN_HEAD / fmt.bytes_per_token_head * 0.999, (host.size, bf16_tokens, ratio)
    planes_bytes = sum(p.numel() * p.element_size() for p in host.host_planes.values())
    assert planes_bytes == host.size * host.size_per_token


@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct"])
@pytest.mark.parametrize("name", KV_CACHE_DTYPES)
def test_device_to_host_to_device_is_bit_exact(name, layout):
    device = make_device_pool(name)
    fill(device, seed=4)
    host = make_host_pool(device, layout=layout)
    host_idx = host.alloc(8)
    src_idx = torch.tensor([3, 4, 5, 6, 30, 31, 32, 33])
    host.backup_from_device_all_layer(device, host_idx, src_idx, "direct")
    saved = [{n: p[src_idx].clone() for n, p in planes.items()} for planes in device.layer_planes_for_transfer()]
    dst_idx = torch.tensor([10, 11, 12, 13, 14, 15, 16, 17])
    for planes in device.layer_planes_for_transfer():
        for p in planes.values():
            p[dst_idx] = 0
    for layer in range(LAYERS):
        host.load_to_device_per_layer(device, host_idx, dst_idx, layer, "direct")
    for layer, planes in enumerate(device.layer_planes_for_transfer()):
        for n, p in planes.items():
            assert torch.equal(p[dst_idx], saved[layer][n]), (layer, n)

    page = host.get_data_page(host_idx[2])
    assert page.numel() == host.page_nbytes
    other = make_host_pool(device, layout="layer_first")
    other.set_from_flat_data_page(7, page)
    assert torch.equal(other.get_data_page(7), page)


def test_refusals_name_what_is_supported():
    device = make_device_pool("int8")
    with pytest.raises(ValueError, match="layer_first, page_first, page_first_direct"):
        make_host_pool(device, layout="page_head")
    host = make_host_pool(device)
    with pytest.raises(NotImplementedError, match="zero-copy"):
        host.get_page_buffer_meta(torch.zeros(1, dtype=torch.int64))
    from sglang_ext.hicache.support import check_hicache_supported
    from types import SimpleNamespace

    with pytest.raises(ValueError, match="file"):
        check_hicache_supported("int8", SimpleNamespace(hicache_storage_backend="mooncake"))
    with pytest.raises(ValueError, match="direct, kernel"):
        check_hicache_supported("int8", SimpleNamespace(hicache_io_backend="kernel_ascend"))


def _file_storage(tmp_path, host, model="/home/user/models/../secret model"):
    config = HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
        enable_storage_metrics=False, is_page_first_layout=False, model_name=hooks.hashed_model_name(model),
        extra_config={"file_storage_path": str(tmp_path / "pages")},
    )
    return VerifiedPageStorage(PrivateHiCacheFile(config), hooks.storage_namespace(host))


def test_stored_pages_are_private_verified_and_format_keyed(tmp_path, caplog):
    device = make_device_pool("int8")
    fill(device, seed=5)
    host = make_host_pool(device)
    idx = host.alloc(2)
    host.backup_from_device_all_layer(device, idx, torch.tensor([7, 8]), "direct")
    storage = _file_storage(tmp_path, host)
    assert storage.batch_set(["key-a", "key-b"], [host.get_data_page(idx[0]), host.get_data_page(idx[1])])
    files = sorted((tmp_path / "pages").iterdir())
    assert len(files) == 2
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
        assert all(c in "0123456789abcdef_m" for c in f.name.removesuffix(".bin")), f.name
    assert stat.S_IMODE((tmp_path / "pages").stat().st_mode) == 0o700
    assert storage.batch_exists(["key-a", "key-b", "key-c"]) == 2

    got = storage.get("key-a", host.get_dummy_flat_data_page())
    assert torch.equal(got, host.get_data_page(idx[0]))

    # Another format's server on the same directory sees nothing.
    other_host = make_host_pool(make_device_pool("octave_k3v4"))
    other = _file_storage(tmp_path, other_host)
    assert other.batch_exists(["key-a", "key-b"]) == 0

    # A flipped byte and a truncated file are misses, with one warning line per read call, and are dropped.
    path_a, path_b = (tmp_path / "pages" / f"{storage.inner._get_suffixed_key(storage.key_for(k))}.bin" for k in ("key-a", "key-b"))
    raw = bytearray(path_a.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    path_a.write_bytes(bytes(raw))
    path_b.write_bytes(path_b.read_bytes()[:-10])
    with caplog.at_level("WARNING"):
        got = storage.batch_get(["key-a", "key-b"], [host.get_dummy_flat_data_page() for _ in range(2)])
        assert got == [None, None]
        assert storage.get("key-b", host.get_dummy_flat_data_page()) is None  # dropped: now simply absent
    lines = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "key-a" in lines[0] and "checksum mismatch" in lines[0] and "1 more" in lines[0], lines
    assert not path_a.exists() and not path_b.exists()
    assert storage.rejected_pages == 2

    # The page is stored again after the recompute, and reads back.
    assert storage.set("key-a", host.get_data_page(idx[0]))
    assert torch.equal(storage.get("key-a", host.get_dummy_flat_data_page()), host.get_data_page(idx[0]))


def test_storage_backend_choice(tmp_path):
    host = make_host_pool(make_device_pool("int8"))
    config = HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
        enable_storage_metrics=False, is_page_first_layout=False, model_name="/models/Smol LM-sgx-int8",
        extra_config={"file_storage_path": str(tmp_path / "p")},
    )
    calls = []

    def original(cls, name, storage_config, mem_pool_host, **kwargs):
        calls.append((name, storage_config.model_name))
        return "sglang's backend"

    with pytest.raises(ValueError, match="supported: file"):
        hooks._create_backend(original, None, "mooncake", config, host)
    made = hooks._create_backend(original, None, "file", config, host)
    assert isinstance(made, VerifiedPageStorage) and isinstance(made.inner, PrivateHiCacheFile)
    assert made.namespace == f"{host.storage_format_tag}-p1" and "int8" in made.namespace
    assert "/" not in made.inner.config_suffix and "Smol" not in made.inner.config_suffix
    other = hooks._create_backend(original, None, "sim", config, host)
    assert other.inner == "sglang's backend" and calls == [("sim", hooks.hashed_model_name(config.model_name))]
