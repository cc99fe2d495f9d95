import pytest
import torch

from sglang_ext.kernels import dequantize_tokens, store_kv
from sglang_ext.kvformats import FORMAT_NAMES, get_format

GEOMETRIES = [(64, None), (128, None), (256, 64), (256, 128)]


def _poison(planes):
    for t in planes.values():
        t.view(torch.uint8).fill_(0xA5)


@pytest.mark.parametrize("name", FORMAT_NAMES)
@pytest.mark.parametrize("head_dim,rotary_dim", GEOMETRIES)
def test_store_is_bit_exact_and_touches_only_loc(name, head_dim, rotary_dim, device):
    fmt = get_format(name, head_dim, rotary_dim)
    g = torch.Generator().manual_seed(head_dim)
    n, h, slots = 21, 2, 64
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        k = (torch.randn(n, h, head_dim, generator=g) * 4).to(dtype)
        v = torch.randn(n, h, head_dim, generator=g).to(dtype)
        k[0, 1] = 0  # zero vector guard
        k[2, 0, 3] = 300.0  # outlier channel
        loc = torch.randperm(slots, generator=g)[:n]
        planes = fmt.allocate(slots, h, device)
        _poison(planes)
        before = {name_: t.clone() for name_, t in planes.items()}
        store_kv(fmt, planes, loc.to(device=device, dtype=torch.int32), k.to(device), v.to(device))
        ref = fmt.quantize(k, v)
        untouched = torch.ones(slots, dtype=torch.bool)
        untouched[loc] = False
        for pname, t in planes.items():
            got = t[loc.to(device)].cpu()
            assert torch.equal(got.view(torch.uint8), ref[pname].view(torch.uint8)), \
                f"{name} d{head_dim} {dtype}: plane {pname} differs from the reference quantizer in " \
                f"{(got.view(torch.uint8) != ref[pname].view(torch.uint8)).sum().item()} bytes"
            assert torch.equal(t[untouched.to(device)], before[pname][untouched.to(device)]), f"{pname}: wrote outside loc"


@pytest.mark.parametrize("name", FORMAT_NAMES)
@pytest.mark.parametrize("head_dim,rotary_dim", [(64, None), (256, 64)])
def test_dequantize_tokens_matches_reference(name, head_dim, rotary_dim, device):
    fmt = get_format(name, head_dim, rotary_dim)
    g = torch.Generator().manual_seed(7)
    k = torch.randn(40, 3, head_dim, generator=g)
    v = torch.randn(40, 3, head_dim, generator=g)
    planes = fmt.allocate(50, 3, device)
    loc = torch.randperm(50, generator=g)[:40]
    store_kv(fmt, planes, loc.to(device), k.to(device), v.to(device))
    pick = loc[torch.randperm(40, generator=g)[:17]]
    kd, vd = dequantize_tokens(fmt, planes, pick.to(device))
    kr, vr = fmt.dequantize({n_: t[pick.to(device)].cpu() for n_, t in planes.items()})
    torch.testing.assert_close(kd.cpu(), kr, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(vd.cpu(), vr, rtol=1e-5, atol=1e-5)


def test_launcher_asserts(device):
    fmt = get_format("octave_k3v4", 128)
    planes = fmt.allocate(8, 2, device)
    k = torch.zeros(4, 2, 128, device=device)
    with pytest.raises(AssertionError, match="dtype"):
        store_kv(fmt, planes, torch.arange(4, device=device), k.to(torch.int32), k)
    with pytest.raises(AssertionError):
        store_kv(fmt, planes, torch.arange(4, device=device), torch.zeros(4, 3, 128, device=device), k)
    bad = dict(planes)
    bad["k_scales"] = planes["k_scales"].float()
    with pytest.raises(AssertionError, match="k_scales"):
        store_kv(fmt, bad, torch.arange(4, device=device), k, k)
