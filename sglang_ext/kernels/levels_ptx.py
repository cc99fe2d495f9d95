"""Octave level decode by byte-permute table lookups in PTX (CUDA only): codes -> bf16 Lloyd-Max levels.

`prmt.b32 d, a, b, sel` picks 4 bytes out of the 8 bytes of (a, b) with four 4-bit selectors, so one prmt
looks up 4 codes in an 8-entry byte table held in two registers: the hi and lo bytes of each level's bf16
pattern are two such tables. A 3-bit code indexes 8 levels directly; a 4-bit code is mapped to the index of
its magnitude in the positive half (the codebook is symmetric) and its sign bit set from a mask made by
prmt's sign-replicate mode. About 2.5 (4-bit) to 3 instructions per code, against about 20 for the select tree
(tiles.level_of); the values are the levels rounded to bf16 (round to nearest even), exactly what the select
tree's levels become as bf16 dot operands. A 3-bit block is decoded either from codes Triton unpacked first
(PTX_3BIT) or, the default, straight from its packed planes (PTX_3BIT_PLANES, 36 PTX instructions per 16 codes).
Used only when the dots take bf16 operands on an NVIDIA GPU; the interpreter and AMD use the select tree.
"""

from __future__ import annotations

import struct

import triton
import triton.language as tl

from ..kvformats.codebook import LEVELS


def _bf16_bits(x: float) -> int:
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF  # round to nearest even (no NaN/inf here)


def _byte_table(values: list[int]) -> tuple[int, int]:
    """8 bytes -> two little-endian words (a = bytes 0..3, b = bytes 4..7), prmt's table operands."""
    word = sum(v << (8 * i) for i, v in enumerate(values))
    return word & 0xFFFFFFFF, word >> 32


def _tables(bits: int) -> dict[str, int]:
    codes = [_bf16_bits(v) for v in LEVELS[bits]]
    out = {}
    for half, sub in (("n", codes[:8]), ("p", codes[8:16])) if bits == 4 else (("", codes),):
        out[f"h{half}0"], out[f"h{half}1"] = _byte_table([c >> 8 for c in sub])
        out[f"l{half}0"], out[f"l{half}1"] = _byte_table([c & 0xFF for c in sub])
    return out


def _ptx_4bit() -> str:
    """4 packed bytes in $4 (8 codes: byte k = dim 2k low nibble, dim 2k+1 high nibble) -> $0..$3, each the bf16
    pair of one byte (low half: even dim). The codebook is symmetric (code c < 8 is minus code 15 - c), so one
    8-entry table of the positive levels serves both halves: per nibble the magnitude index is c & 7 for c >= 8
    and 7 - c = (c ^ 7) & 7 below, and the sign bit of the hi byte comes from prmt's sign-replicate mode."""
    t = _tables(4)
    tab = {k: t[k] for k in ("hp0", "hp1", "lp0", "lp1")}
    half = """
    prmt.b32 sg, k8, k8, sel;
    prmt.b32 h, hp0, hp1, m;
    prmt.b32 l, lp0, lp1, m;
    lop3.b32 h, h, sg, c80, 0xF8;
    prmt.b32 {o0}, l, h, i01;
    prmt.b32 {o1}, l, h, i23;"""
    consts = "".join(f"\n    mov.b32 {k}, {v:#010x};" for k, v in tab.items())
    return ("{\n    .reg .b32 t, n, m, sel, sg, h, l, k8, c80, i01, i23, " + ", ".join(tab) + ";" + consts + """
    mov.b32 k8, 0x00008000;
    mov.b32 c80, 0x80808080;
    mov.b32 i01, 0x5140;
    mov.b32 i23, 0x7362;
    not.b32 t, $4;
    and.b32 t, t, 0x88888888;
    shr.u32 n, t, 3;
    or.b32 sel, n, 0x88888888;
    sub.u32 t, t, n;
    xor.b32 m, $4, t;
    and.b32 m, m, 0x77777777;""" + half.format(o0="$0", o1="$1") + """
    shr.u32 m, m, 16;
    shr.u32 sel, sel, 16;""" + half.format(o0="$2", o1="$3") + "\n}")


def _ptx_3bit() -> str:
    """4 codes in $2 (one per byte, each < 8) -> $0, $1: their bf16 levels, two per register, in order."""
    t = _tables(3)
    consts = "".join(f"\n    mov.b32 {k}, {v:#010x};" for k, v in t.items())
    return ("{\n    .reg .b32 s, sel, h, l, i02, i01, i23, " + ", ".join(t) + ";" + consts + """
    mov.b32 i02, 0x0020;
    mov.b32 i01, 0x5140;
    mov.b32 i23, 0x7362;
    shr.u32 s, $2, 4;
    or.b32 s, s, $2;
    prmt.b32 sel, s, s, i02;
    prmt.b32 h, h0, h1, sel;
    prmt.b32 l, l0, l1, sel;
    prmt.b32 $0, l, h, i01;
    prmt.b32 $1, l, h, i23;
}""")


def _ptx_3bit_planes() -> str:
    """16 codes of a 3-bit block straight from its packed planes -> $0..$7, the bf16 pairs of dims (2p, 2p+1).
    $8: a 32-bit word of the 2-bit plane (dim j at bits 2j..2j+1, j < 16), $9: the 1-bit plane's 16 bits of the
    same dims (dim j at bit j; bits 16.. ignored). Selector nibbles are built for the even dims (se) and the odd
    dims (so): the 2-bit fields by one mask each (nibble n of w & 0x33333333 is dim 2n, of (w >> 2) & ... dim
    2n+1), the high bits by spreading $9's 16 bits to 2 bits per nibble (prmt, then two shift-or-mask steps:
    nibble n holds bits 2n, 2n+1) and shifting each into bit 2. A byte-interleaving prmt of se and so gives
    selector words whose 16-bit halves hold dims (4g, 4g+2, 4g+1, 4g+3); the hi- and lo-byte lookups of the
    8-level table then pair up as bf16 (4g, 4g+1) and (4g+2, 4g+3) in one prmt each. 36 instructions for 16 codes
    (the table moves are constants hoisted by ptxas), against about 9 per code when Triton unpacks the codes
    first (codes_block, then _ptx_3bit)."""
    t = _tables(3)
    consts = "".join(f"\n    mov.b32 {k}, {v:#010x};" for k, v in t.items())
    group = """
    prmt.b32 h, h0, h1, {s};
    prmt.b32 l, l0, l1, {s};
    prmt.b32 {o0}, l, h, p01;
    prmt.b32 {o1}, l, h, p23;"""
    return ("{\n    .reg .b32 we, wo, z, t, se, so, a, b, h, l, zero, i40, i51, i73, p01, p23, "
            + ", ".join(t) + ";" + consts + """
    mov.b32 zero, 0;
    mov.b32 i40, 0x4140;
    mov.b32 i51, 0x5140;
    mov.b32 i73, 0x7362;
    mov.b32 p01, 0x6240;
    mov.b32 p23, 0x7351;
    and.b32 we, $8, 0x33333333;
    shr.u32 wo, $8, 2;
    and.b32 wo, wo, 0x33333333;
    prmt.b32 z, $9, zero, i40;
    shl.b32 t, z, 4;
    or.b32 z, z, t;
    and.b32 z, z, 0x0F0F0F0F;
    shl.b32 t, z, 2;
    or.b32 z, z, t;
    and.b32 z, z, 0x33333333;
    shl.b32 t, z, 2;
    and.b32 t, t, 0x44444444;
    or.b32 se, we, t;
    shl.b32 t, z, 1;
    and.b32 t, t, 0x44444444;
    or.b32 so, wo, t;
    prmt.b32 a, se, so, i51;
    prmt.b32 b, se, so, i73;""" + group.format(s="a", o0="$0", o1="$1") + """
    shr.u32 a, a, 16;""" + group.format(s="a", o0="$2", o1="$3") + group.format(s="b", o0="$4", o1="$5") + """
    shr.u32 b, b, 16;""" + group.format(s="b", o0="$6", o1="$7") + "\n}")


PTX_4BIT: tl.constexpr = tl.constexpr(_ptx_4bit())
PTX_3BIT: tl.constexpr = tl.constexpr(_ptx_3bit())
PTX_3BIT_PLANES: tl.constexpr = tl.constexpr(_ptx_3bit_planes())


@triton.jit
def levels_4bit_ptx(byte, BLOCK_N: tl.constexpr):
    """uint8 [BLOCK_N, 32] packed 4-bit codes -> bf16 levels [BLOCK_N, 64] (dim 2j: low nibble of byte j)."""
    pair = tl.inline_asm_elementwise(PTX_4BIT, "=r,=r,=r,=r,r", [byte], dtype=tl.int32, is_pure=True, pack=4)
    return _bf16_pairs(pair, BLOCK_N)


@triton.jit
def levels_3bit_ptx(code):
    """3-bit codes (any int tensor, values < 8) -> bf16 levels of the same shape."""
    return tl.inline_asm_elementwise(PTX_3BIT, "=r,=r,r", [code.to(tl.uint8)], dtype=tl.bfloat16, is_pure=True,
                                     pack=4)


@triton.jit
def _bf16_pairs(pair, BLOCK_N: tl.constexpr):
    """int32 [BLOCK_N, 32] bf16 pairs (low half first) -> bf16 [BLOCK_N, 64]."""
    even = pair.to(tl.int16).to(tl.bfloat16, bitcast=True)
    odd = (pair >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    return tl.reshape(tl.join(even, odd), [BLOCK_N, 64])


@triton.jit
def levels_3bit_planes_ptx(block_ptr, mask_n, BLOCK_N: tl.constexpr):
    """bf16 levels [BLOCK_N, 64] of a 3-bit block whose 24 packed bytes start at block_ptr (uint8 pointers
    [BLOCK_N], each a multiple of 8 bytes: tiles.kv_block): the 2-bit plane read as 4 int32 words per row (word
    k: dims 16k..16k+15), the 1-bit plane as 4 int16 halfwords (the same dims), one PTX_3BIT_PLANES per word."""
    m2 = mask_n[:, None]
    k = tl.arange(0, 4)[None, :]
    w = tl.load(block_ptr.to(tl.pointer_type(tl.int32))[:, None] + k, mask=m2, other=0)
    hb = tl.load((block_ptr + 16).to(tl.pointer_type(tl.int16))[:, None] + k, mask=m2, other=0).to(tl.int32)
    o0, o1, o2, o3, o4, o5, o6, o7 = tl.inline_asm_elementwise(
        PTX_3BIT_PLANES, "=r,=r,=r,=r,=r,=r,=r,=r,r,r", [w, hb], dtype=(tl.int32,) * 8, is_pure=True, pack=1)
    return _bf16_pairs(_pairs_in_order(o0, o1, o2, o3, o4, o5, o6, o7, BLOCK_N), BLOCK_N)


@triton.jit
def _pairs_in_order(o0, o1, o2, o3, o4, o5, o6, o7, BLOCK_N: tl.constexpr):
    """Eight [BLOCK_N, 4] tensors, o_p[:, k] for dims 16k + 2p and 16k + 2p + 1 -> [BLOCK_N, 32], pair j of
    dims 2j, 2j + 1."""
    # each join appends its axis last, so the nesting is bit-reversed: [k, c, b, a] = o_(4c + 2b + a), the pair of
    # dims 16k + 2p with p = 4c + 2b + a (tests/kernels/test_levels_ptx.py checks this order under the interpreter)
    pair = tl.join(tl.join(tl.join(o0, o4), tl.join(o2, o6)), tl.join(tl.join(o1, o5), tl.join(o3, o7)))
    return tl.reshape(pair, [BLOCK_N, 32])
