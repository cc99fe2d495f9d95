"""Host pages and stored-page envelopes without a server: bit-exact moves in every host layout, the
layout-independent page bytes, and every way a stored page must fail verification."""

from __future__ import annotations

import pytest
import torch

from sglang_ext.hicache.page_envelope import (
    HEADER_BYTES,
    PageIntegrityError,
    open_envelope,
    seal,
    storage_key,
)
from sglang_ext.kernels import host_pages
from sglang_ext.kvcache.formats import KV_CACHE_DTYPES
from sglang_ext.kvformats import get_format

HEADS, DIM, LAYERS, DEVICE_SLOTS, HOST_SLOTS, PAGE = 3, 64, 2, 24, 32, 4
# The CUDA path (pinned host planes, device planes on the GPU) runs where a GPU is present.
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def device_planes(fmt, seed: int, device: str = "cpu") -> list[dict[str, torch.Tensor]]:
    """Per-layer planes holding real quantized K/V (random codes and scales of the format's dtypes)."""
    g = torch.Generator().manual_seed(seed)
    layers = []
    for _ in range(LAYERS):
        k = torch.randn(DEVICE_SLOTS, HEADS, DIM, generator=g)
        v = torch.randn(DEVICE_SLOTS, HEADS, DIM, generator=g)
        layers.append({n: p.to(device) for n, p in fmt.quantize(k, v).items()})
    return layers


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", host_pages.HOST_LAYOUTS)
@pytest.mark.parametrize("name", KV_CACHE_DTYPES)
def test_backup_then_load_is_bit_exact_in_every_layout(name, layout, device):
    fmt = get_format(name, DIM, DIM)
    src = device_planes(fmt, seed=1, device=device)
    host = host_pages.allocate_host_planes(
        fmt.plane_specs(), layout, LAYERS, HOST_SLOTS, PAGE, HEADS, pin=device == "cuda"
    )
    for plane in host.values():
        plane.zero_()
    device_idx = torch.tensor([5, 6, 7, 8, 20, 21, 22, 23])
    host_idx = torch.tensor([12, 13, 14, 15, 4, 5, 6, 7])  # two whole pages, out of order
    host_pages.backup_layers(host, src, layout, host_idx, device_idx, PAGE)

    dst = [{n: torch.zeros_like(p) for n, p in planes.items()} for planes in src]
    back_to = torch.tensor([0, 1, 2, 3, 9, 10, 11, 12])
    for layer in range(LAYERS):
        assert not torch.equal(dst[layer]["k_codes"][back_to], src[layer]["k_codes"][device_idx])
        host_pages.load_layer(host, dst[layer], layout, layer, host_idx, back_to, PAGE)
    if device == "cuda":
        torch.cuda.synchronize()
    untouched = torch.ones(DEVICE_SLOTS, dtype=torch.bool)
    untouched[back_to] = False
    for layer in range(LAYERS):
        for n in src[layer]:
            assert torch.equal(dst[layer][n][back_to], src[layer][n][device_idx]), (layer, n)
            assert not dst[layer][n][untouched].any(), f"{n}: slots outside the load were written"


@pytest.mark.parametrize("name", KV_CACHE_DTYPES)
def test_page_bytes_do_not_depend_on_the_host_layout(name):
    fmt = get_format(name, DIM, DIM)
    src = device_planes(fmt, seed=2)
    device_idx = torch.arange(8, 8 + PAGE)
    host_idx = torch.arange(2 * PAGE, 3 * PAGE)
    pages = {}
    for layout in host_pages.HOST_LAYOUTS:
        host = host_pages.allocate_host_planes(fmt.plane_specs(), layout, LAYERS, HOST_SLOTS, PAGE, HEADS, pin=False)
        host_pages.backup_layers(host, src, layout, host_idx, device_idx, PAGE)
        pages[layout] = host_pages.page_bytes(host, layout, 2 * PAGE, PAGE)
    expected = host_pages.page_nbytes(fmt.plane_specs(), LAYERS, PAGE, HEADS)
    assert expected == fmt.bytes_per_token_head * HEADS * LAYERS * PAGE
    for layout, data in pages.items():
        assert data.dtype == torch.uint8 and data.numel() == expected, layout
        assert torch.equal(data, pages["layer_first"]), f"{layout} page bytes differ from layer_first"

    # A page written in one layout reads back identically from another layout's pool.
    other = host_pages.allocate_host_planes(fmt.plane_specs(), "page_first_direct", LAYERS, HOST_SLOTS, PAGE, HEADS, pin=False)
    for plane in other.values():
        plane.zero_()
    host_pages.set_page_bytes(other, "page_first_direct", 0, PAGE, pages["page_first"])
    loaded = {n: torch.zeros_like(p) for n, p in src[1].items()}
    host_pages.load_layer(other, loaded, "page_first_direct", 1, torch.arange(PAGE), device_idx, PAGE)
    for n in src[1]:
        assert torch.equal(loaded[n][device_idx], src[1][n][device_idx]), n


def test_set_page_bytes_refuses_a_page_of_another_size():
    fmt = get_format("int8", DIM, DIM)
    host = host_pages.allocate_host_planes(fmt.plane_specs(), "layer_first", LAYERS, HOST_SLOTS, PAGE, HEADS, pin=False)
    good = host_pages.page_bytes(host, "layer_first", 0, PAGE)
    with pytest.raises(ValueError, match="bytes"):
        host_pages.set_page_bytes(host, "layer_first", 0, PAGE, good[:-1])
    with pytest.raises(ValueError, match="not supported"):
        host_pages.check_layout("page_head")


def _sealed(payload_bytes: int = 1000):
    payload = torch.randint(0, 256, (payload_bytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    return payload, seal("sgx-int8-h3", "abc", payload)


def test_sealed_page_opens_to_the_same_bytes():
    payload, env = _sealed()
    assert env.numel() == HEADER_BYTES + payload.numel()
    assert torch.equal(open_envelope("sgx-int8-h3", "abc", env, payload.numel()), payload)


@pytest.mark.parametrize("offset", [0, 5, 20, 40, HEADER_BYTES, HEADER_BYTES + 500, HEADER_BYTES + 999])
def test_any_flipped_byte_is_rejected(offset):
    payload, env = _sealed()
    env[offset] ^= 0x01
    with pytest.raises(PageIntegrityError):
        open_envelope("sgx-int8-h3", "abc", env, payload.numel())


def test_truncated_other_namespace_and_other_key_are_rejected():
    payload, env = _sealed()
    with pytest.raises(PageIntegrityError, match="payload is"):
        open_envelope("sgx-int8-h3", "abc", env[:-1], payload.numel())
    with pytest.raises(PageIntegrityError, match="shorter than"):
        open_envelope("sgx-int8-h3", "abc", env[:10], payload.numel())
    with pytest.raises(PageIntegrityError, match="another KV format"):
        open_envelope("sgx-octave_k3v4-h3", "abc", env, payload.numel())
    with pytest.raises(PageIntegrityError, match="another key"):
        open_envelope("sgx-int8-h3", "abd", env, payload.numel())


def test_storage_keys_are_hex_and_separate_namespaces():
    k1 = storage_key("sgx-int8", "../../etc/passwd")
    assert len(k1) == 40 and all(c in "0123456789abcdef" for c in k1)
    assert k1 != storage_key("sgx-octave_k3v4", "../../etc/passwd")
    assert k1 == storage_key("sgx-int8", "../../etc/passwd")
