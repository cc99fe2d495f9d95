"""`--hicache-io-backend kernel` with a compressed pool: the Triton page-copy kernel (kernels/host_transfer.py) moves
the pages, on CPU tensors under TRITON_INTERPRET=1, against the torch moves (kernels/host_pages.py, the spec).

  pool level   the host pool SGLang picks for a real compressed device pool, every format x host layout, pages of 4:
               backup and load through `kernel` give the bytes `direct` gives, bit-exact; the destination differed
               before; nothing outside the moved pages changed.
  server       the CPU platform with TRITON_INTERPRET=1, octave_k3v4 (codes and scale planes), `page_first` (the
               layout SGLang keeps only for the kernel backend): a prompt pushed out to host comes back through the
               kernel with the output of its device-cache hit, and the server counts the host hit.
"""

from __future__ import annotations

import pytest
import torch
from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope
from sglang.srt.mem_cache.pool_host.mha import get_mha_host_pool_cls

from sglang_ext.hicache import hooks
from sglang_ext.hicache.host_pool import CompressedMHAHostPool
from sglang_ext.kernels import host_pages, host_transfer
from sglang_ext.kvcache.formats import KV_CACHE_DTYPES
from sglang_ext.kvcache.pool import CompressedMHATokenToKVPool
from sglang_ext.kvformats import get_format
from text_fixtures import long_text

HEADS, DIM, LAYERS, SIZE, PAGE = 2, 64, 2, 48, 4
SENTINEL = 0x5A


@pytest.fixture(autouse=True, scope="module")
def _hooks():
    # The plugin installs these in SGLang processes; this test process applies them itself.
    from sglang.srt.plugins.hook_registry import HookRegistry

    hooks.register()
    HookRegistry.apply_hooks()


def device_pool(name: str, seed: int) -> CompressedMHATokenToKVPool:
    pool = CompressedMHATokenToKVPool(
        SIZE, page_size=PAGE, dtype=torch.float32, head_num=HEADS, head_dim=DIM, layer_num=LAYERS, device="cpu",
        enable_memory_saver=False, v_head_dim=DIM, start_layer=0, end_layer=LAYERS - 1, enable_alt_stream=False,
        enable_kv_cache_copy=False, kv_format=get_format(name, DIM, DIM),
    )
    g = torch.Generator().manual_seed(seed)
    for planes in pool.layer_planes_for_transfer():
        rows = pool.kv_format.quantize(torch.randn(SIZE + PAGE, HEADS, DIM, generator=g),
                                       torch.randn(SIZE + PAGE, HEADS, DIM, generator=g))
        for n, p in planes.items():
            p.copy_(rows[n][: p.shape[0]])
    return pool


def host_pool(device, layout: str) -> CompressedMHAHostPool:
    info = device.get_device_pool_infos()[0].buffer_info
    with host_memory_budget_scope(1 << 31):
        host = get_mha_host_pool_cls(info)(info, 2.0, 0, PAGE, layout, pin_memory=True, device_capacity_tokens=SIZE,
                                           start_layer=0, end_layer=LAYERS - 1)
    for p in host.host_planes.values():
        p.view(torch.uint8).fill_(SENTINEL)
    return host


def planes_bytes(planes: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {n: p.view(torch.uint8).clone() for n, p in planes.items()}


@pytest.mark.parametrize("layout", host_pages.HOST_LAYOUTS)
@pytest.mark.parametrize("name", KV_CACHE_DTYPES)
def test_kernel_io_moves_the_bytes_of_direct_io(name, layout):
    assert host_transfer.runs_on_cpu_tensors(), "run under TRITON_INTERPRET=1 (tests/conftest.py sets it)"
    # each host pool moves pages of the device pool it was built for: two equal device pools
    dev_k, dev_t = device_pool(name, seed=11), device_pool(name, seed=11)
    by_kernel, by_torch = host_pool(dev_k, layout), host_pool(dev_t, layout)
    assert type(by_kernel) is CompressedMHAHostPool and by_kernel._use_kernel("kernel")
    assert not by_kernel._use_kernel("direct")
    host_idx = by_kernel.alloc(2 * PAGE)
    assert torch.equal(host_idx, by_torch.alloc(2 * PAGE))
    host_idx = host_idx.flip(0)  # pages in reverse order, rows reversed inside each page
    device_idx = torch.cat([torch.arange(20, 24), torch.arange(8, 12)])

    # device -> host
    before = planes_bytes(by_kernel.host_planes)
    by_kernel.backup_from_device_all_layer(dev_k, host_idx, device_idx, "kernel")
    by_torch.backup_from_device_all_layer(dev_t, host_idx, device_idx, "direct")
    pages = host_idx.unique()
    for n, plane in by_kernel.host_planes.items():
        got, want = plane.view(torch.uint8), by_torch.host_planes[n].view(torch.uint8)
        assert not torch.equal(got, before[n]), f"backup changed nothing in plane {n}"
        assert torch.equal(got, want), f"backup: plane {n} differs from the torch move"
        # every host byte outside the two pages still holds the fill
        if layout == "page_first_direct":  # [pages, layers, page, H, *tail]
            outside = torch.ones(plane.shape[0], dtype=torch.bool)
            outside[pages // PAGE] = False
            rows = got[outside]
        else:  # [layers, slots, ...] or [slots, layers, ...]
            outside = torch.ones(plane.shape[1 if layout == "layer_first" else 0], dtype=torch.bool)
            outside[pages] = False
            rows = got[:, outside] if layout == "layer_first" else got[outside]
        assert rows.numel() and (rows == SENTINEL).all(), f"backup wrote outside its pages in plane {n}"

    # host -> device, into other slots
    back_to = torch.cat([torch.arange(32, 36), torch.arange(40, 44)])
    for layer, (kp, tp) in enumerate(zip(dev_k.layer_planes_for_transfer(), dev_t.layer_planes_for_transfer())):
        saved = {n: p[device_idx].clone() for n, p in kp.items()}
        untouched = {n: p.clone() for n, p in kp.items()}
        for n in kp:
            assert not torch.equal(kp[n][back_to], saved[n]), f"layer {layer} plane {n} already holds the rows"
        by_kernel.load_to_device_per_layer(dev_k, host_idx, back_to, layer, "kernel")
        by_torch.load_to_device_per_layer(dev_t, host_idx, back_to, layer, "direct")
        keep = torch.ones(kp[next(iter(kp))].shape[0], dtype=torch.bool)
        keep[back_to] = False
        for n in kp:
            assert torch.equal(kp[n].view(torch.uint8), tp[n].view(torch.uint8)), f"load layer {layer} plane {n}"
            assert torch.equal(kp[n][back_to].view(torch.uint8), saved[n].view(torch.uint8)), (layer, n)
            assert torch.equal(kp[n][keep], untouched[n][keep]), f"load layer {layer} wrote outside its slots"


# --- a server -----------------------------------------------------------------------------------------------------

DEVICE_POOL_TOKENS = 600
PROMPT = long_text(230) + "\nQuestion: what is sold in the market? Answer:"
OTHER = "Story two. " + long_text(130)[::-1] + "\nSummary:"  # shares no prefix with PROMPT
NEW_TOKENS = 8
KERNEL_LINE = "--hicache-io-backend kernel moves pages with the Triton copy kernel on cpu tensors"


def test_server_moves_host_pages_through_the_kernel(server_pool):
    server = server_pool.get(
        "--dtype", "float32", "--enable-cache-report", "--max-total-tokens", str(DEVICE_POOL_TOKENS),
        "--kv-cache-dtype", "octave_k3v4", "--enable-hierarchical-cache", "--hicache-io-backend", "kernel",
        "--hicache-mem-layout", "page_first", "--hicache-size", "1",
        env={"TRITON_INTERPRET": "1"}, name="hicache-kernel-io")  # fmt: skip
    # The default extend mode reads a hit's recomputed last prompt token through the format like the rest
    # (docs/kv-formats.md, "Extend: new tokens ..."), so a device hit and a host hit read the same bytes. With
    # SGLANG_EXT_KV_EXTEND_NEW_TOKENS=full the device hit's decode reads the cold request's copy of that token and
    # the host hit its own recomputed one, and their texts can part (here at the 6th token).
    log = server.log_text()
    assert "layout page_first" in log, "SGLang changed the layout"
    cold = server.generate(PROMPT, max_new_tokens=NEW_TOKENS)
    assert cold["meta_info"]["cached_tokens"] == 0, cold["meta_info"]
    warm = server.generate(PROMPT, max_new_tokens=NEW_TOKENS)
    device_hit = (warm["meta_info"].get("cached_tokens_details") or {}).get("device", 0)
    assert device_hit > 0, warm["meta_info"]
    other = server.generate(OTHER, max_new_tokens=2)
    assert warm["meta_info"]["prompt_tokens"] + other["meta_info"]["prompt_tokens"] > DEVICE_POOL_TOKENS
    again = server.generate(PROMPT, max_new_tokens=NEW_TOKENS)
    details = again["meta_info"].get("cached_tokens_details") or {}
    # the whole device hit came back from host, through the kernel, to the same greedy tokens
    assert details.get("host", 0) == device_hit, (details, warm["meta_info"])
    assert again["meta_info"]["cached_tokens"] == device_hit, again["meta_info"]
    assert again["output_ids"] == warm["output_ids"], (again["text"], warm["text"])
    log = server.log_text()
    chosen = [line for line in log.splitlines() if "--hicache-io-backend kernel moves pages" in line]
    assert chosen and all(KERNEL_LINE in line for line in chosen), chosen
    print(f"kernel io, octave_k3v4 page_first: device hit {device_hit}, host hit {details}")
