"""The PTX level lookup (kernels/levels_ptx.py) runs only on NVIDIA GPUs; here its instruction text is executed
by a small emulator of the PTX instructions it uses (tests/kernels/ptx_emulator.py), over
every byte / code, against the bf16-rounded Lloyd-Max levels. On a GPU, test_attention's bf16-operand test compares
the kernels that use it with the torch reference."""

import torch
from ptx_emulator import run as _run

from sglang_ext.kernels import levels_ptx
from sglang_ext.kvformats.codebook import LEVELS

def _bf16_bits(bits: int) -> list[int]:
    t = torch.tensor(LEVELS[bits], dtype=torch.float32).to(torch.bfloat16).view(torch.int16)
    return [int(x) & 0xFFFF for x in t]


def test_4bit_lookup_gives_every_byte_its_two_bf16_levels():
    want = _bf16_bits(4)
    asm = levels_ptx.PTX_4BIT.value
    for start in range(0, 256, 4):  # 4 bytes per register; every byte value in every position over the loop
        for rot in range(4):
            bs = [(start + (i + rot) % 4) for i in range(4)]
            outs = _run(asm, [sum(b << (8 * i) for i, b in enumerate(bs))], 4)
            for k, b in enumerate(bs):
                expect = want[b & 15] | (want[b >> 4] << 16)
                assert outs[k] == expect, f"byte {b:#04x} in lane {k}: {outs[k]:#010x} != {expect:#010x}"


def test_3bit_lookup_gives_every_code_its_bf16_level():
    want = _bf16_bits(3)
    asm = levels_ptx.PTX_3BIT.value
    for x in range(8 ** 4):
        codes = [(x >> (3 * i)) & 7 for i in range(4)]
        outs = _run(asm, [sum(c << (8 * i) for i, c in enumerate(codes))], 2)
        expect = [want[codes[0]] | (want[codes[1]] << 16), want[codes[2]] | (want[codes[3]] << 16)]
        assert outs == expect, f"codes {codes}: {[hex(o) for o in outs]} != {[hex(e) for e in expect]}"


def test_3bit_planes_lookup_gives_every_code_its_bf16_level():
    """Each 4 dims' 12 bits (a byte of the 2-bit plane and its 4 high bits) over all 4096 values, in each of the 4
    positions of a word, the other dims random and the halfword's upper 16 bits set (they must be ignored)."""
    want = _bf16_bits(3)
    asm = levels_ptx.PTX_3BIT_PLANES.value
    gen = torch.Generator().manual_seed(0)
    rand = torch.randint(0, 2 ** 16, (4, 4096, 3), generator=gen).tolist()
    for q in range(4):
        for v in range(4096):
            r0, r1, r2 = rand[q][v]
            w = (r0 | r1 << 16) & ~(0xFF << (8 * q)) | ((v & 0xFF) << (8 * q))
            h = r2 & ~(0xF << (4 * q)) | ((v >> 8) << (4 * q))
            outs = _run(asm, [w, h | 0xABCD0000], 8)
            codes = [((w >> (2 * j)) & 3) | (((h >> j) & 1) << 2) for j in range(16)]
            expect = [want[codes[2 * p]] | (want[codes[2 * p + 1]] << 16) for p in range(8)]
            assert outs == expect, f"w {w:#010x} h {h:#06x}: {[hex(o) for o in outs]} != {[hex(e) for e in expect]}"


def test_3bit_planes_pairs_land_in_dim_order(device):
    """The join tree after PTX_3BIT_PLANES: output p of word k must become pair 8k + p."""
    import triton
    import triton.language as tl

    @triton.jit
    def kern(out, BLOCK_N: tl.constexpr):
        r = tl.arange(0, BLOCK_N)[:, None] * 1000 + tl.arange(0, 4)[None, :] * 8
        pair = levels_ptx._pairs_in_order(r, r + 1, r + 2, r + 3, r + 4, r + 5, r + 6, r + 7, BLOCK_N)
        tl.store(out + tl.arange(0, BLOCK_N)[:, None] * 32 + tl.arange(0, 32)[None, :], pair)

    out = torch.zeros(2, 32, dtype=torch.int32, device=device)
    kern[(1,)](out, BLOCK_N=2)
    assert out.cpu().tolist() == [[n * 1000 + j for j in range(32)] for n in range(2)], out
