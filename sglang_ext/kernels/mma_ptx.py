"""The PTX routines of the Gluon decode stage 1 (mma_octave, mma_int8): packed codes -> the bf16 / f16 / int8
values of an `mma.sync` operand fragment, 4 to 16 codes per `asm` block (CUDA only).

Octave levels are looked up by `prmt` byte permutes in 8-entry byte tables (levels_ptx's tables, held in registers:
mma_lut); int8 codes become f16 by the exponent-byte trick (int8_ptx's, with the table word as an operand); with
int8 scores (Q8) K's levels are looked up as the codebook's 7-bit grid integers. The lookup tables are asm
operands, loaded once before the loop: as constants moved into registers inside the asm, ptxas kept them in uniform
registers and copied each into a register before every use (94 of 865 instructions of a 16-token iteration, sm_90
SASS). prmt's selector is the one operand SASS takes as an immediate, so selectors are written as immediates. The
lookups run on the integer ALU pipe (half rate on sm_80 and sm_90): shifts are written as mul.hi so that ptxas
issues them on the FMA pipe. Each builder is checked over every input byte by tests/kernels/test_decode_mma.py's
PTX emulator.
"""

from __future__ import annotations

from triton.experimental.gluon import language as gl

from ..kvformats.codebook import GRID, GRID_OFFSET, STEP
from .levels_ptx import _tables



# The lookup tables, as asm operands: loaded once before the loop (lut_words), they stay in registers. As
# constants moved into registers inside the asm, ptxas kept them in uniform registers and copied each into a
# register before every use: 94 of 865 instructions of a 16-token iteration (sm_90 SASS). prmt's selector is
# the one operand SASS takes as an immediate, so selectors are written as immediates.
LUT_NAMES = ("hp0", "hp1", "lp0", "lp1", "k8")
LUT3_NAMES = ("h0", "h1", "l0", "l1")  # the 3-bit level tables (levels_ptx._tables(3)), after LUT_NAMES
LUT8_NAMES = ("m64",)  # int8 codes: the f16 exponent bytes 0x64 the conversion puts above each code byte
I8_BIAS = 0x64806480  # f16 pair (1152, 1152): 0x64XX is 1024 + XX, and XX = code ^ 0x80 = code + 128


def lut_words() -> list[int]:
    """The values of LUT_NAMES, LUT3_NAMES then LUT8_NAMES, in order (int32 bit patterns)."""
    t, t3 = _tables(4), _tables(3)
    words = [t["hp0"], t["hp1"], t["lp0"], t["lp1"], 0x80000000]
    words += [t3[n] for n in LUT3_NAMES]
    words += [0x64646464]
    return [w - (1 << 32) if w >= 1 << 31 else w for w in words]


def _bind(first: int) -> str:
    return "".join(f"\n    mov.b32 {n}, ${first + i};" for i, n in enumerate(LUT_NAMES))


def _prep(w: str, s: str) -> str:
    """Magnitude selectors m{s} (nibble c -> c & 7 for c >= 8, 7 - c below) and negative flags n{s} (nibble = 7
    where c < 8, else 0) of word w: t holds 8 in each nibble below 8, and t * 7 / 8 (one mul.hi by 7 * 2^29) is
    the flags, which are also the mask that mirrors a negative code's magnitude. The shift is written as mul.hi,
    which ptxas issues as IMAD on the FMA pipe: the lookups are bound by the integer ALU pipe (half rate on sm_80
    / sm_90), where prmt and lop3 have to run."""
    return f"""
    not.b32 t, {w};
    and.b32 t, t, 0x88888888;
    mul.hi.u32 n{s}, t, 0xE0000000;
    xor.b32 m{s}, {w}, n{s};
    and.b32 m{s}, m{s}, 0x77777777;"""


def _look(s: str) -> str:
    """Hi bytes h{s} (sign set) and lo bytes l{s} of the levels of the 4 codes in the low halves of m{s}, n{s}:
    the sign byte 0x80 / 0x00 picked from k8 = 0x80000000 (byte 7 / byte 0 of the pair k8, k8) by the negative
    flag and added (the positive table's hi bytes have bit 7 clear)."""
    return f"""
    prmt.b32 sg, k8, k8, n{s};
    prmt.b32 h{s}, hp0, hp1, m{s};
    prmt.b32 l{s}, lp0, lp1, m{s};
    add.u32 h{s}, h{s}, sg;"""


def _upper(s: str) -> str:
    """Move the upper 4 codes' selectors of m{s}, n{s} into their low halves."""
    return f"""
    mul.hi.u32 m{s}, m{s}, 0x10000;
    mul.hi.u32 n{s}, n{s}, 0x10000;"""


def _ptx_4bit_one_token() -> str:
    """$4: a word of 8 packed 4-bit codes (byte p: dims 2p, 2p+1 in its low, high nibble) -> $0..$3, the bf16
    pair of byte p (low half: the even dim). $5..$9: LUT_NAMES. levels_ptx.PTX_4BIT's lookup."""
    return ("{\n    .reg .b32 t, na, ma, sg, ha, la, " + ", ".join(LUT_NAMES) + ";" + _bind(5)
            + _prep("$4", "a") + _look("a") + """
    prmt.b32 $0, la, ha, 0x5140;
    prmt.b32 $1, la, ha, 0x7362;""" + _upper("a") + _look("a") + """
    prmt.b32 $2, la, ha, 0x5140;
    prmt.b32 $3, la, ha, 0x7362;
}""")


def _ptx_4bit_two_tokens() -> str:
    """Two words of 8 packed 4-bit codes, $8 of token 2i and $9 of token 2i+1 (the same 8 dims; dim r at nibble
    r) -> $0..$7: register r holds the bf16 level of dim r of token 2i (low half) and of token 2i+1 (high half).
    $10..$14: LUT_NAMES. The tokens' bytes are interleaved first (x: nibbles a0 a1 b0 b1 a2 a3 b2 b3, y: the same
    for dims 4..7), so one lookup of 4 nibbles holds both tokens' levels of two dims and each output pair is one
    prmt of its hi and lo bytes: 2 prmt more per 16 codes than the one-token lookup, where interleaving the
    looked-up pairs cost 8 (measured)."""

    def out(o0: str, o1: str, s: str) -> str:  # l, h bytes: (a_r, a_r+1, b_r, b_r+1) -> (a_r|b_r), (a_r+1|b_r+1)
        return f"""
    prmt.b32 {o0}, l{s}, h{s}, 0x6240;
    prmt.b32 {o1}, l{s}, h{s}, 0x7351;"""

    return ("{\n    .reg .b32 t, x, y, nx, ny, mx, my, sg, hx, hy, lx, ly, " + ", ".join(LUT_NAMES) + ";"
            + _bind(10) + """
    prmt.b32 x, $8, $9, 0x5140;
    prmt.b32 y, $8, $9, 0x7362;""" + _prep("x", "x") + _prep("y", "y")
            + _look("x") + out("$0", "$1", "x") + _look("y") + out("$4", "$5", "y")
            + _upper("x") + _upper("y")
            + _look("x") + out("$2", "$3", "x") + _look("y") + out("$6", "$7", "y") + "\n}")


def _bind3(first: int) -> str:
    return "".join(f"\n    mov.b32 {n}, ${first + i};" for i, n in enumerate(LUT3_NAMES))


def _group3(s: str, o0: str, o1: str) -> str:
    """The 8-level table's hi and lo bytes of the 4 selector nibbles in the low half of s (codes x0 x1 y0 y1)
    -> o0 = the bf16 pair (x0, y0), o1 = (x1, y1)."""
    return f"""
    prmt.b32 h, h0, h1, {s};
    prmt.b32 l, l0, l1, {s};
    prmt.b32 {o0}, l, h, 0x6240;
    prmt.b32 {o1}, l, h, 0x7351;"""


def _selectors3(w2: str, p1: str) -> str:
    """Selector words se (nibble n: the 3-bit code of dim 2n) and so (of dim 2n + 1) of 16 codes: w2 holds their
    2-bit fields (dim j at bits 2j, 2j + 1), p1 their high bits spread to 4 per byte (byte k: dims 4k..4k+3 at
    bits 0..3, bits 4..7 clear). The 1-bit fields go to 2 per nibble (nibble n: dims 2n, 2n + 1), then each into
    bit 2 of its selector. Shifts are multiplies (the FMA pipe), and-or pairs fuse into lop3."""
    return f"""
    and.b32 se, {w2}, 0x33333333;
    mul.hi.u32 so, {w2}, 0x40000000;
    and.b32 so, so, 0x33333333;
    mul.lo.u32 t, {p1}, 4;
    or.b32 z, {p1}, t;
    and.b32 z, z, 0x33333333;
    mul.lo.u32 t, z, 4;
    and.b32 t, t, 0x44444444;
    or.b32 se, se, t;
    mul.lo.u32 t, z, 2;
    and.b32 t, t, 0x44444444;
    or.b32 so, so, t;"""


def _ptx_3bit_planes() -> str:
    """levels_ptx.PTX_3BIT_PLANES's lookup (16 codes of a 3-bit block: $8 a word of the 2-bit plane, dim j at
    bits 2j..2j+1, $9 the 1-bit plane's 16 bits of the same dims -> $0..$7, the bf16 pairs of dims 2p, 2p + 1),
    with its level tables as operands $10..$13 (LUT3_NAMES), selectors as immediates and shifts as multiplies.
    The byte-interleaving prmt of se and so gives words whose halves hold dims (4g, 4g+2, 4g+1, 4g+3)."""
    return ("{\n    .reg .b32 t, z, p, se, so, a, b, h, l, " + ", ".join(LUT3_NAMES) + ";" + _bind3(10) + """
    prmt.b32 p, $9, 0, 0x4140;
    mul.lo.u32 t, p, 16;
    or.b32 p, p, t;
    and.b32 p, p, 0x0F0F0F0F;""" + _selectors3("$8", "p") + """
    prmt.b32 a, se, so, 0x5140;
    prmt.b32 b, se, so, 0x7362;""" + _group3("a", "$0", "$1") + """
    mul.hi.u32 a, a, 0x10000;""" + _group3("a", "$2", "$3") + _group3("b", "$4", "$5") + """
    mul.hi.u32 b, b, 0x10000;""" + _group3("b", "$6", "$7") + "\n}")


def _ptx_3bit_two_tokens() -> str:
    """The 3-bit V lookup: 8 dims of two tokens -> $0..$7, register r the bf16 levels of dim r of token 2i (low
    half) and of token 2i+1 (high half). $8, $9: the 2-bit plane's words of token 2i, 2i+1 holding those dims'
    16 bits (dim r at bits 2r, 2r+1 of halfword h); $10, $11: the 1-bit plane's words holding their byte j (dim
    r at bit r); $12 = 0x5140 + 0x2222 h, $13 = 0x4040 + 0x1111 j: the prmt selectors that pick them. $14..$17:
    LUT3_NAMES. The tokens' bytes are interleaved first (2-bit fields: a0-3 b0-3 a4-7 b4-7; high bits: byte k
    the same order), so each selector nibble pair of a lookup holds dims (r, r + 2) of both tokens and each
    output pair is one prmt."""
    return ("{\n    .reg .b32 t, z, w, p, q, se, so, h, l, " + ", ".join(LUT3_NAMES) + ";" + _bind3(14) + """
    prmt.b32 w, $8, $9, $12;
    prmt.b32 q, $10, $11, $13;
    mul.hi.u32 t, q, 0x10000000;
    and.b32 p, q, 0x00000F0F;
    and.b32 t, t, 0x0F0F0000;
    or.b32 p, p, t;""" + _selectors3("w", "p") + _group3("se", "$0", "$2") + _group3("so", "$1", "$3") + """
    mul.hi.u32 se, se, 0x10000;
    mul.hi.u32 so, so, 0x10000;""" + _group3("se", "$4", "$6") + _group3("so", "$5", "$7") + "\n}")


def _ptx_int8_one_token() -> str:
    """int8 K: $4, $5 two words of 4 codes each (byte p of $4: dim p, of $5: dim 4 + p) -> $0..$3, the f16 pairs
    of dims (2p, 2p + 1) of those 8. $6: 0x64646464 (LUT8_NAMES). Each pair is one prmt of the code bytes (made
    unsigned: ^ 0x80) with exponent bytes 0x64, i.e. 1024 + 128 + code, then one f16x2 subtraction on the FMA
    pipe: 0.75 ALU-pipe instructions per code."""
    return f"""{{
    .reg .b32 x, y, bias;
    mov.b32 bias, {I8_BIAS:#010x};
    xor.b32 x, $4, 0x80808080;
    xor.b32 y, $5, 0x80808080;
    prmt.b32 $0, x, $6, 0x4140;
    prmt.b32 $1, x, $6, 0x4342;
    prmt.b32 $2, y, $6, 0x4140;
    prmt.b32 $3, y, $6, 0x4342;
    sub.rn.f16x2 $0, $0, bias;
    sub.rn.f16x2 $1, $1, bias;
    sub.rn.f16x2 $2, $2, bias;
    sub.rn.f16x2 $3, $3, bias;
}}"""


def _ptx_int8_two_tokens() -> str:
    """int8 V: $8, $9 the two words of token 2i (dims 0..3, 4..7), $10, $11 those of token 2i+1 -> $0..$7,
    register r the f16 values of dim r of token 2i (low half) and of token 2i+1 (high half). $12: 0x64646464. The
    tokens' bytes are interleaved first (x: a0 b0 a1 b1), then as the one-token conversion."""
    out = []
    for w, (a, b) in enumerate((("$8", "$10"), ("$9", "$11"))):
        for half, sel in ((0, "0x5140"), (1, "0x7362")):
            r = 4 * w + 2 * half
            out.append(f"""
    prmt.b32 x, {a}, {b}, {sel};
    xor.b32 x, x, 0x80808080;
    prmt.b32 ${r}, x, $12, 0x4140;
    prmt.b32 ${r + 1}, x, $12, 0x4342;
    sub.rn.f16x2 ${r}, ${r}, bias;
    sub.rn.f16x2 ${r + 1}, ${r + 1}, bias;""")
    return "{\n    .reg .b32 x, bias;\n    mov.b32 bias, " + f"{I8_BIAS:#010x};" + "".join(out) + "\n}"


# --- int8 scores (Q8): K's levels as 7-bit integers, q as two int8 parts, S^T = K q^T by mma m16n8k32 ----------
# The codebook's levels lie on a 7-bit grid (kvformats/codebook.py): level = (u - 63.5) x step, u an integer in
# 0..127 with u(-L) = 127 - u(L). A level is looked up as its byte u, so the int8 dot's products are exact; the
# 63.5 part comes off through the dot's accumulator input (_q8_operand). All 16 bytes of a 4-bit table have bit 7
# clear, so one prmt over the codes with prmt's sign-replicate mode (selector bit 3) zeroes the bytes of codes
# >= 8 and another over codes ^ 8 those of codes < 8: two lookups and an or per 4 codes, against four lookups and
# an add for the bf16 pairs. q, rotated in float32, goes in as hi + lo / 256, both int8 (_q8_operand, _q8_scores).
Q8_BIAS = GRID_OFFSET
assert Q8_BIAS == 63.5, "_q8_operand's constants"


def q8_table(bits: int) -> tuple[float, tuple[int, ...]]:
    """(step, byte u per code) of LEVELS[bits]: level = (u - Q8_BIAS) x step exactly."""
    return STEP[bits], GRID[bits]


def q8_lut_words() -> list[int]:
    """Q8_LUT_NAMES' words: the 4-bit table's bytes of codes 0..7 (2 words), of codes 8..15 (2), the 3-bit
    table's (2)."""
    _, u4 = q8_table(4)
    _, u3 = q8_table(3)
    words = []
    for part in (u4[:8], u4[8:], u3):
        word = sum(v << (8 * i) for i, v in enumerate(part))
        words += [word & 0xFFFFFFFF, word >> 32]
    return [w - (1 << 32) if w >= 1 << 31 else w for w in words]


Q8_LUT_NAMES = ("tl0", "tl1", "th0", "th1", "t30", "t31")


def _ptx_k4_q8() -> str:
    """$2: a word of 8 packed 4-bit codes (nibble r: dim r) -> $0: the 7-bit levels (q8_table) of dims 0..3 as
    bytes 0..3, $1: of dims 4..7. $3..$6: tl0, tl1, th0, th1. Shifts as mul.hi (the FMA pipe)."""
    return """{
    .reg .b32 x, a, b, w;
    xor.b32 x, $2, 0x88888888;
    prmt.b32 a, $3, $4, $2;
    prmt.b32 b, $5, $6, x;
    or.b32 $0, a, b;
    mul.hi.u32 w, $2, 0x10000;
    mul.hi.u32 x, x, 0x10000;
    prmt.b32 a, $3, $4, w;
    prmt.b32 b, $5, $6, x;
    or.b32 $1, a, b;
}"""


def _ptx_k3_q8() -> str:
    """A 3-bit K block's 16 codes of a lane ($4: the 2-bit plane's word, dim j at bits 2j, 2j + 1; $5: the 1-bit
    plane's 16 bits of the same dims) -> the 7-bit levels as bytes: $0 of dims 0, 2, 4, 6, $1 of 8, 10, 12, 14,
    $2 of 1, 3, 5, 7, $3 of 9, 11, 13, 15 (the dot's contraction order takes them as they come). $6, $7: t30,
    t31. The selectors as _ptx_3bit_planes' (_selectors3), one prmt per 4 codes."""
    return ("{\n    .reg .b32 t, z, p, se, so;" + """
    prmt.b32 p, $5, 0, 0x4140;
    mul.lo.u32 t, p, 16;
    or.b32 p, p, t;
    and.b32 p, p, 0x0F0F0F0F;""" + _selectors3("$4", "p") + """
    prmt.b32 $0, $6, $7, se;
    prmt.b32 $2, $6, $7, so;
    mul.hi.u32 se, se, 0x10000;
    mul.hi.u32 so, so, 0x10000;
    prmt.b32 $1, $6, $7, se;
    prmt.b32 $3, $6, $7, so;
}""")


PTX_K4_Q8: gl.constexpr = gl.constexpr(_ptx_k4_q8())
PTX_K3_Q8: gl.constexpr = gl.constexpr(_ptx_k3_q8())
PTX_INT8_1TOK: gl.constexpr = gl.constexpr(_ptx_int8_one_token())
PTX_INT8_2TOK: gl.constexpr = gl.constexpr(_ptx_int8_two_tokens())
PTX_3BIT_PLANES: gl.constexpr = gl.constexpr(_ptx_3bit_planes())
PTX_3BIT_2TOK: gl.constexpr = gl.constexpr(_ptx_3bit_two_tokens())
PTX_4BIT_1TOK: gl.constexpr = gl.constexpr(_ptx_4bit_one_token())
PTX_4BIT_2TOK: gl.constexpr = gl.constexpr(_ptx_4bit_two_tokens())
