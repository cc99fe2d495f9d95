import json

import pytest
import torch

from sglang_ext.kvformats import FORMAT_NAMES, get_format
from sglang_ext.kvformats.__main__ import main as cli_main
from sglang_ext.kvformats.packing import BLOCK_BYTES, pack_block, unpack_block


def test_registry_and_errors():
    assert FORMAT_NAMES == ("bf16", "int8", "octave_k3v4", "octave_k3v3")
    with pytest.raises(ValueError, match="known formats: bf16, int8, octave_k3v4, octave_k3v3"):
        get_format("fp4", 128)
    for name in FORMAT_NAMES:
        with pytest.raises(ValueError, match=r"supported head_dim: \(64, 128, 256\)"):
            get_format(name, 96)
        with pytest.raises(ValueError, match="rotary_dim"):
            get_format(name, 128, 0)
        fmt = get_format(name, 128)
        assert (fmt.name, fmt.head_dim, fmt.rotary_dim) == (name, 128, 128)


@pytest.mark.parametrize("name,head_dim,rotary_dim,expected", [
    ("bf16", 256, 64, 1024), ("int8", 256, 64, 520), ("octave_k3v4", 256, 64, 248), ("octave_k3v3", 256, 64, 216),
    ("octave_k3v4", 128, None, 136), ("octave_k3v3", 128, None, 120), ("octave_k3v4", 64, None, 68),
    ("octave_k3v3", 64, None, 60), ("int8", 64, None, 136),
])
def test_bytes_per_token_head(name, head_dim, rotary_dim, expected):
    fmt = get_format(name, head_dim, rotary_dim)
    assert fmt.bytes_per_token_head == expected
    planes = fmt.allocate(5, 3)
    assert sum(t[0, 0].numel() * t.element_size() for t in planes.values()) == expected
    assert all(not t.any() for t in planes.values())
    for pname, (dtype, tail) in fmt.plane_specs().items():
        assert planes[pname].dtype == dtype and planes[pname].shape == (5, 3, *tail)


def test_octave_bit_policy():
    assert get_format("octave_k3v4", 256, 64).k_bits == (4, 3, 3, 3)
    assert get_format("octave_k3v4", 256, 128).k_bits == (4, 4, 3, 3)
    assert get_format("octave_k3v3", 256, 64).v_bits == (3, 3, 3, 3)
    assert get_format("octave_k3v4", 128).k_bits == (4, 4)  # full RoPE: see docs/formats.md


@pytest.mark.parametrize("bits", [3, 4])
def test_packing_layout(bits):
    g = torch.Generator().manual_seed(bits)
    codes = torch.randint(0, 2 ** bits, (10, 64), generator=g)
    packed = pack_block(codes, bits)
    assert packed.shape == (10, BLOCK_BYTES[bits]) and packed.dtype == torch.uint8
    assert torch.equal(unpack_block(packed, bits), codes)
    one = torch.zeros(1, 64, dtype=torch.long)
    one[0, 5] = 2 ** bits - 1  # dim 5: 4-bit -> byte 2 high nibble; 3-bit -> byte 1 bits 2-3 and byte 16 + 0 bit 5
    p = pack_block(one, bits)[0]
    if bits == 4:
        assert p[2] == 0xF0 and p.sum() == 0xF0
    else:
        assert p[1] == 0b1100 and p[16] == 0b100000 and p.sum() == 0b1100 + 0b100000


@pytest.mark.parametrize("name", FORMAT_NAMES)
@pytest.mark.parametrize("head_dim,rotary_dim", [(64, None), (128, None), (256, 64)])
def test_round_trip_energy_and_zero_vectors(name, head_dim, rotary_dim):
    fmt = get_format(name, head_dim, rotary_dim)
    g = torch.Generator().manual_seed(1)
    k = torch.randn(33, 2, head_dim, generator=g) * 5
    v = torch.randn(33, 2, head_dim, generator=g)
    k[0] = 0
    v[1, 1] = 0
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        planes = fmt.quantize(k.to(dtype), v.to(dtype))
        kh, vh = fmt.dequantize(planes)
        assert kh.dtype == torch.float32 and kh.shape == k.shape
        assert torch.isfinite(kh).all() and torch.isfinite(vh).all()
        assert not kh[0].any() and not vh[1, 1].any(), "zero vectors must come back as zeros"
    if fmt.rotated:
        # energy-keeping per 64-dim block: x . x_hat = |x|^2 (up to the fp16 scale's rounding)
        for x, xh in ((k, kh), (v, vh)):
            xb, xhb = x[2:].reshape(-1, 64), xh[2:].reshape(-1, 64)
            ratio = (xb * xhb).sum(-1) / (xb * xb).sum(-1)
            assert (ratio - 1).abs().max() < 1e-3, float((ratio - 1).abs().max())


def test_cli_table_and_json(capsys):
    assert cli_main(["--head-dim", "256", "--rotary-dim", "64", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == list(FORMAT_NAMES)
    assert {r["name"]: r["bytes_per_token_head"] for r in rows} == {
        "bf16": 1024, "int8": 520, "octave_k3v4": 248, "octave_k3v3": 216}
    assert cli_main(["--head-dim", "128"]) == 0
    out = capsys.readouterr().out
    assert "octave_k3v3" in out and "3.76x" in out  # 512 / 136
    assert cli_main(["--head-dim", "100"]) == 2
    assert "supported head_dim" in capsys.readouterr().err
