"""Octave level decode by byte-permute table lookups in PTX (CUDA only): codes -> bf16 Lloyd-Max levels.

`prmt.b32 d, a, b, sel` picks 4 bytes out of the 8 bytes of (a, b) with four 4-bit selectors, so one prmt
looks up 4 codes in an 8-entry byte table held in two registers: the hi and lo bytes of each level's bf16
pattern are two such tables. A 3-bit code indexes 8 levels directly; a 4-bit code is mapped to the index of
its magnitude in the positive half (the codebook is symmetric) and its sign bit set from a mask made by
prmt's sign-replicate mode. About 2.5 (4-bit) to 3 instructions per code, against about 20 for the select tree
(tiles.level_of); the values are the levels rounded to bf16 (round to nearest even), exactly what the select
tree's levels become as bf16 dot operands. Used only when the dots take bf16 operands on an NVIDIA GPU; the
interpreter and AMD use the select tree.
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


PTX_4BIT: tl.constexpr = tl.constexpr(_ptx_4bit())
PTX_3BIT: tl.constexpr = tl.constexpr(_ptx_3bit())


@triton.jit
def levels_4bit_ptx(byte, BLOCK_N: tl.constexpr):
    """uint8 [BLOCK_N, 32] packed 4-bit codes -> bf16 levels [BLOCK_N, 64] (dim 2j: low nibble of byte j)."""
    pair = tl.inline_asm_elementwise(PTX_4BIT, "=r,=r,=r,=r,r", [byte], dtype=tl.int32, is_pure=True, pack=4)
    even = pair.to(tl.int16).to(tl.bfloat16, bitcast=True)
    odd = (pair >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    return tl.reshape(tl.join(even, odd), [BLOCK_N, 64])


@triton.jit
def levels_3bit_ptx(code):
    """3-bit codes (any int tensor, values < 8) -> bf16 levels of the same shape."""
    return tl.inline_asm_elementwise(PTX_3BIT, "=r,=r,r", [code.to(tl.uint8)], dtype=tl.bfloat16, is_pure=True,
                                     pack=4)
