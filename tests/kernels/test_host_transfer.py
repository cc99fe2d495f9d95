"""Triton host <-> device row copies (kernels/host_transfer.py) against the torch spec (kernels/host_pages.py):
bit-exact in every host layout and KV format, rows outside the moved slots untouched. Interpreter on CPU; on a
GPU host the device planes live on the GPU and the host planes are page-locked (read in place)."""

import os

import pytest
import torch

from sglang_ext.kernels import host_pages, host_transfer
from sglang_ext.kvcache.formats import KV_CACHE_DTYPES
from sglang_ext.kvformats import get_format

HEADS, DIM, LAYERS, DEVICE_SLOTS, HOST_SLOTS, PAGE = 3, 64, 2, 24, 32, 4
# CPU planes only under the interpreter: compiled kernels (TRITON_INTERPRET=0 on a GPU host) take GPU planes
DEVICES = (["cpu"] if os.environ.get("TRITON_INTERPRET") == "1" else []) + (["cuda"] if torch.cuda.is_available() else [])


def quantized_layers(fmt, seed, device):
    g = torch.Generator().manual_seed(seed)
    return [{n: p.to(device) for n, p in fmt.quantize(torch.randn(DEVICE_SLOTS, HEADS, DIM, generator=g),
                                                        torch.randn(DEVICE_SLOTS, HEADS, DIM, generator=g)).items()}
            for _ in range(LAYERS)]


def host_planes(fmt, layout, device, fill):
    planes = host_pages.allocate_host_planes(fmt.plane_specs(), layout, LAYERS, HOST_SLOTS, PAGE, HEADS,
                                             pin=device == "cuda")
    for p in planes.values():
        p.view(torch.uint8).fill_(fill)
    return planes


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", host_pages.HOST_LAYOUTS)
@pytest.mark.parametrize("name", KV_CACHE_DTYPES)
def test_backup_and_load_match_torch_spec(name, layout, device):
    fmt = get_format(name, DIM, DIM)
    src = quantized_layers(fmt, 3, device)
    device_idx = torch.tensor([5, 6, 7, 8, 20, 21, 22, 23, 0])
    host_idx = torch.tensor([12, 13, 14, 15, 4, 5, 6, 7, 31])  # whole pages out of order, and a lone slot

    want_host, got_host = host_planes(fmt, layout, device, 0xA5), host_planes(fmt, layout, device, 0xA5)
    host_pages.backup_layers(want_host, src, layout, host_idx, device_idx, PAGE)
    host_transfer.backup_layers(got_host, src, layout, host_idx, device_idx)
    for n in want_host:
        assert torch.equal(got_host[n].view(torch.uint8), want_host[n].view(torch.uint8)), f"backup plane {n}"

    back_to = torch.tensor([0, 1, 2, 3, 9, 10, 11, 12, 23])
    for layer in range(LAYERS):
        want = {n: torch.full_like(p, 7) for n, p in src[layer].items()}
        got = {n: torch.full_like(p, 7) for n, p in src[layer].items()}
        host_pages.load_layer(want_host, want, layout, layer, host_idx, back_to, PAGE)
        host_transfer.load_layer(got_host, got, layout, layer, host_idx, back_to)
        if device == "cuda":
            torch.cuda.synchronize()
        for n in want:
            assert torch.equal(got[n], want[n]), f"load layer {layer} plane {n}"
            assert torch.equal(got[n][back_to], src[layer][n][device_idx]), f"round trip layer {layer} plane {n}"
    if device == "cuda":
        host_pages.unpin_host_planes(want_host)
        host_pages.unpin_host_planes(got_host)


def test_word_is_widest_common_divisor():
    assert host_transfer.word_dtype(64, 128, 0) == torch.int64
    assert host_transfer.word_dtype(12, 24) == torch.int32
    assert host_transfer.word_dtype(6, 12) == torch.int16
    assert host_transfer.word_dtype(3) == torch.uint8
