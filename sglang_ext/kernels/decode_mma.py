"""Octave decode stage 1 in Gluon: 3- and 4-bit levels looked up straight into the tensor cores' operand registers.

Why a second stage-1 kernel: the Triton one (decode._decode_stage1) decodes each K/V tile into a blocked layout,
and Triton moves the levels into the dots' operand layout through shared memory. On an H200 that loop issued
about 6.6 instructions per K/V element and stalled on the round trips (docs/benchmarks/kernels.md, rounds 10-12).
Here every layout is chosen (Gluon). Each lane loads exactly the packed words whose levels it holds in its
`mma.sync` fragments, and a PTX byte-permute lookup writes the bf16 pairs the fragments are made of. No shared
memory, one warp per program.

The dots, per 64-dim block of the head (m16n8k16, bf16 operands, float32 accumulators):
- scores S^T = K q^T: tokens as M, the GQA group's q heads as N = 8 (no padded rows).
- outputs O^T = V^T P^T: head dims as M.
- P^T goes from the scores' accumulator to the right operand of the second dot by one `movmatrix` (an 8 x 8
  transpose across the warp) per 8 tokens (_transpose_p).

q arrives as the model made it: each program rotates its group's queries into the octave basis as a dot with
H64 (_rotated_q), which spares the call a rotation kernel (4-7 us of an H200 call at batch 8 x 32k).

Two freedoms make every load contiguous without changing the pool format:
- K: a dot's contraction may run over the head dims in any order, as long as q uses the same one. Lane t of a K
  fragment owns k = 32 c1 + 16 c0 + 8 h + 2 t + e (e, h, c0, c1 in registers). Mapping k to the block dim
  16 t + 8 c1 + 4 c0 + 2 h + e gives lane t 16 consecutive dims: one 64-bit load per token and block.
- V: the output's rows may come in any order, as long as the store puts them back. Lane g of a V^T fragment owns
  rows m = 8 j + g. Mapping m to the dim 8 g + j gives lane g one 32-bit word (8 dims) per token and 4-bit block
  (a halfword of the 2-bit plane and a byte of the 1-bit plane of a 3-bit block: read as the words holding them).
  The contraction over tokens pairs tokens 2t, 2t + 1 in one register, so the V lookups (PTX_4BIT_2TOK,
  PTX_3BIT_2TOK) read both tokens' words and interleave their bytes before looking up.

The lookups run on the integer ALU pipe (half rate on sm_80 and sm_90), which bounds the loop: shifts are
written as mul.hi so that ptxas issues them on the FMA pipe (_prep, _upper), and the tables are held per lane
(_load_lut). Softmax denominators stay per (token row, head) until the end.

Int8 scores (Q8; decode.MMA_QK8: the default at head_dim 128): the codebook's levels lie on a 7-bit integer grid
(kvformats/codebook.py), so K's codes are looked up as bytes u (level = (u - 63.5) x step, exactly) straight into
the operand of an int8 m16n8k32 dot; q, rotated in float32, goes in as two int8 parts hi + lo / 256, the lo dot
feeding the hi dot's accumulator (_q8_scores). Half the lookups of the bf16 pairs: 5 % faster at batch 8 x 32k
on an H200 (d128), with the error of bf16 scores or less (2.6e-3 to 3.3e-3 relative to the format's reference in
tests/kernels/test_decode_mma.py, against 3.7e-3 to 4.8e-3). At head_dim 256 the four blocks' q operands take
255 registers and the kernel is slower at batch 1, so bf16 scores stay its default. LAZY (decode.MMA_LAZY, exact
arithmetic): the running maximum moves only when a tile exceeds it by 2^8, so most tiles skip rescaling the
outputs (_step).

int8 (_decode_stage1_mma_int8) has the same structure with f16 operands: a code becomes one by the exponent-byte
conversion (PTX_INT8_1TOK, PTX_INT8_2TOK), with no lookup.

Scope (built and measured): octave_k3v4 and octave_k3v3 at head_dim 128 with full RoPE (K blocks 4-bit) and at
head_dim 256 with rotary_dim 64 (K blocks of 4, 3, 3, 3 bits), V blocks all 4-bit or all 3-bit; int8 at head_dim
64, 128 and 256 (layout_of). GQA
groups of at most 8 q heads, one query token (q_len 1), NVIDIA GPUs with mma.sync and movmatrix (sm_80 and later;
measured on an H200 only). Output: the partial outputs and log-sum-exps of
decode._decode_stage1, merged by its stage 2.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from ..kvformats import rotation
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
    looked-up pairs cost 8 (measured in round 16)."""

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
LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)
LN2: gl.constexpr = gl.constexpr(0.6931471805599453)


@gluon.jit
def _halves(pair, DT: gl.constexpr = gl.bfloat16):
    """int32 pairs of 16-bit floats (bf16, or DT) -> (low half, high half) as DT tensors of the same shape and
    layout."""
    lo = pair.to(gl.int16).to(DT, bitcast=True)
    hi = (pair >> 16).to(gl.int16).to(DT, bitcast=True)
    return lo, hi


@gluon.jit
def _slots(idx, n0, s1, kn, vn, cn, CLAMP: gl.constexpr = True):
    """The pool slots of tokens n0.. in the three layouts a tile's loads use (K words, V words, the scores' rows),
    as int32. Tokens at or past s1 (s1 > the split's first token) are masked in the softmax and read any finite
    codes: CLAMP, the slot of token s1 - 1 (no predicate and no zeroing of each index and scale load: 45 fewer
    instructions of octave's 32-token iteration, 160 -> 128 registers at head_dim 128, sm_90 SASS); else slot 0
    by masked loads (int8, where the clamp measured 1-2 % slower at batch 1 x 128k on an H200)."""
    if CLAMP:
        last = s1 - 1
        k = gl.load(idx + gl.minimum(n0 + kn, last)).to(gl.int32)
        v = gl.load(idx + gl.minimum(n0 + vn, last)).to(gl.int32)
        c = gl.load(idx + gl.minimum(n0 + cn, last)).to(gl.int32)
    else:
        k = gl.load(idx + n0 + kn, mask=(n0 + kn) < s1, other=0).to(gl.int32)
        v = gl.load(idx + n0 + vn, mask=(n0 + vn) < s1, other=0).to(gl.int32)
        c = gl.load(idx + n0 + cn, mask=(n0 + cn) < s1, other=0).to(gl.int32)
    return k, v, c


@gluon.jit
def _rows(slot, stride, WIDE: gl.constexpr):
    """Row offsets (in the plane's 32-bit words): slot * stride, in int64 if WIDE."""
    if WIDE:
        return slot.to(gl.int64) * stride
    else:
        return slot * stride


@gluon.jit
def _load_v3(vc_w, v_row, vw, b: gl.constexpr):
    """3-bit V block b of the tokens of v_row (their rows, in words): lane g (V_WORDS) needs the 2-bit plane's
    halfword g and the 1-bit plane's byte g (dims 8 g .. 8 g + 7) and loads the words holding them; the lookup
    picks them out with per-lane selectors (_v3_operand_a). Narrower loads cost a conversion instruction each. A
    3-bit block is 6 words: the 2-bit plane's 4, then the 1-bit plane's 2."""
    p2 = vc_w + v_row[:, None] + (6 * b + (vw >> 1))[None, :]
    p1 = vc_w + v_row[:, None] + (6 * b + 4 + (vw >> 2))[None, :]
    return gl.load(p2), gl.load(p1)


@gluon.jit
def _load_tile(slots, n0, s1, cn, kc_w, vc_w, ks_w, vs_w, kc_stride, vc_stride, ks_stride, vs_stride,
               K_WORDS: gl.constexpr, K3_WORDS: gl.constexpr, V_WORDS: gl.constexpr, D256: gl.constexpr,
               V3: gl.constexpr, WIDE: gl.constexpr):
    """The words one iteration reads (tokens n0..; slots: _slots'), each in the lanes that use it (strides in
    32-bit words).
    D128 (two 4-bit blocks): K [N, 8] per block (K_WORDS), V [N, 8] per block (V_WORDS), the K and V scale
    words [N] (two fp16 each; the scores' rows). D256 (K: a 4-bit block then three 3-bit ones, V: four 4-bit
    blocks): K block 0 [N, 8], each 3-bit block's 2-bit plane [N, 4] words and 1-bit plane [N, 4] halfwords
    (K3_WORDS), V [N, 8] per block, two K and two V scale words [N]. V3 (3-bit V blocks): each V block as
    _load_v3's two [N, 8] word tensors."""
    k_row = _rows(slots[0], kc_stride, WIDE)
    v_row = _rows(slots[1], vc_stride, WIDE)
    c_k = _rows(slots[2], ks_stride, WIDE)
    c_v = _rows(slots[2], vs_stride, WIDE)
    kw = gl.arange(0, 8, layout=gl.SliceLayout(0, K_WORDS))
    vw = gl.arange(0, 8, layout=gl.SliceLayout(0, V_WORDS))
    k_ptr = kc_w + k_row[:, None] + kw[None, :]
    v_ptr = vc_w + v_row[:, None] + vw[None, :]
    ks_p = ks_w + c_k
    vs_p = vs_w + c_v
    if D256:
        k3_row = gl.convert_layout(k_row, gl.SliceLayout(1, K3_WORDS))
        t = gl.arange(0, 4, layout=gl.SliceLayout(0, K3_WORDS))
        p2 = kc_w + k3_row[:, None] + t[None, :]  # block b (1..3): 2-bit plane at word 8 + 6 (b - 1)
        p1 = kc_w.to(gl.pointer_type(gl.int16)) + 2 * k3_row[:, None] + t[None, :]  # 1-bit plane: halfword 24 + 12 (b - 1)
        k_part = (gl.load(k_ptr), gl.load(p2 + 8), gl.load(p1 + 24), gl.load(p2 + 14), gl.load(p1 + 36),
                  gl.load(p2 + 20), gl.load(p1 + 48))
        if V3:
            v_part = _load_v3(vc_w, v_row, vw, 0) + _load_v3(vc_w, v_row, vw, 1) + _load_v3(vc_w, v_row, vw, 2) \
                + _load_v3(vc_w, v_row, vw, 3)
        else:
            v_part = (gl.load(v_ptr), gl.load(v_ptr + 8), gl.load(v_ptr + 16), gl.load(v_ptr + 24))
        tile = k_part + v_part + (gl.load(ks_p), gl.load(ks_p + 1), gl.load(vs_p), gl.load(vs_p + 1))
    else:
        if V3:
            v_part = _load_v3(vc_w, v_row, vw, 0) + _load_v3(vc_w, v_row, vw, 1)
        else:
            v_part = (gl.load(v_ptr), gl.load(v_ptr + 8))
        tile = (gl.load(k_ptr), gl.load(k_ptr + 8)) + v_part + (gl.load(ks_p), gl.load(vs_p))
    return tile


@gluon.jit
def _scale_pair(w):
    """int32 words holding two fp16 scales (blocks 0, 1) -> two float32 tensors."""
    s0 = w.to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
    s1 = (w >> 16).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
    return s0, s1


# x ^ zeros[laneid], i.e. x, through a load ptxas cannot see through (it folds laneid >> 5 to 0): loaded as plain
# scalars, the lookup tables lived in uniform registers and ptxas copied one into a register before each prmt
# (about 10 % of a tile's instructions, sm_90 SASS). $2: the address of LUT_LANE_ZEROS zero words.
PTX_PER_LANE: gl.constexpr = gl.constexpr("""{
    .reg .b32 l, i;
    .reg .b64 a, o;
    mov.u32 i, %laneid;
    mul.wide.u32 o, i, 4;
    add.s64 a, $2, o;
    ld.global.u32 l, [a];
    xor.b32 $0, $1, l;
}""")
LUT_LANE_ZEROS = 32
LUT_ZEROS_AT: gl.constexpr = gl.constexpr(10)  # len(lut_words())
# then the K rotation's signs of blocks 0..3 (float32 bit patterns, 64 a block): the octave kernel rotates q
K_SIGNS_AT: gl.constexpr = gl.constexpr(10 + LUT_LANE_ZEROS)
# then Q8_LUT_NAMES' words (after 4 blocks of 64 signs)
Q8_LUT_AT: gl.constexpr = gl.constexpr(10 + LUT_LANE_ZEROS + 256)


@gluon.jit
def _per_lane(x, zeros):
    return gl.inline_asm_elementwise(PTX_PER_LANE, "=r,r,l", [x, zeros], dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def _load_lut(lut_ptr):
    """LUT_NAMES' words (lut_ptr[0:5]), each held in a register of every lane (PTX_PER_LANE; the zeros are at
    lut_ptr[LUT_ZEROS_AT:])."""
    z = (lut_ptr + LUT_ZEROS_AT).to(gl.int64, bitcast=True)
    return (_per_lane(gl.load(lut_ptr), z), _per_lane(gl.load(lut_ptr + 1), z), _per_lane(gl.load(lut_ptr + 2), z),
            _per_lane(gl.load(lut_ptr + 3), z), _per_lane(gl.load(lut_ptr + 4), z))


@gluon.jit
def _load_lut3(lut_ptr):
    """LUT3_NAMES' words (lut_ptr[5:9]), per lane as _load_lut's."""
    z = (lut_ptr + LUT_ZEROS_AT).to(gl.int64, bitcast=True)
    return (_per_lane(gl.load(lut_ptr + 5), z), _per_lane(gl.load(lut_ptr + 6), z),
            _per_lane(gl.load(lut_ptr + 7), z), _per_lane(gl.load(lut_ptr + 8), z))


PTX_MOVMATRIX_T: gl.constexpr = gl.constexpr("movmatrix.sync.aligned.m8n8.trans.b16 $0, $1;")


@gluon.jit
def _k_operand_a(words, lut, BLOCK_N: gl.constexpr, A_LAYOUT: gl.constexpr):
    """_k_operand's levels as the left operand: bf16 [BLOCK_N, 64], row = token, column k as there."""
    o0, o1, o2, o3 = gl.inline_asm_elementwise(PTX_4BIT_1TOK, "=r,=r,=r,=r,r,r,r,r,r,r",
                                               [words, lut[0], lut[1], lut[2], lut[3], lut[4]],
                                               dtype=(gl.int32,) * 4, is_pure=True, pack=1)
    return _k_pairs(o0, o1, o2, o3, BLOCK_N, A_LAYOUT, gl.bfloat16)


@gluon.jit
def _k_pairs(o0, o1, o2, o3, BLOCK_N: gl.constexpr, A_LAYOUT: gl.constexpr, DT: gl.constexpr):
    """A K lookup's outputs (o_p: the pair of dims 8 j + 2 p, + 1 of the lane's 8-dim word j, [N, 8] with lane t
    holding words 2 t, 2 t + 1) -> the left operand DT [BLOCK_N, 64], column k as _k_operand_a's."""
    a0 = gl.join(*_halves(o0, DT))
    a1 = gl.join(*_halves(o1, DT))
    a2 = gl.join(*_halves(o2, DT))
    a3 = gl.join(*_halves(o3, DT))
    z = gl.join(gl.join(a0, a2), gl.join(a1, a3))  # [N, 8 (word = 2 t + c1), 2 (e), 2 (c0), 2 (h)]
    z = gl.reshape(z, [BLOCK_N, 4, 2, 2, 2, 2])  # (n, t, c1, e, c0, h)
    z = gl.permute(z, [0, 2, 4, 5, 1, 3])  # (n, c1, c0, h, t, e)
    z = gl.reshape(z, [BLOCK_N, 64])
    return gl.convert_layout(z, A_LAYOUT)


@gluon.jit
def _levels8(o0, o1, o2, o3, o4, o5, o6, o7, DT: gl.constexpr = gl.bfloat16):
    """Eight tensors of 16-bit float pairs (register r = 4 b2 + 2 b1 + b0 of a lookup) -> one DT tensor with four
    new trailing axes (e: the pair's half, b2, b1, b0). Each join appends its axis last, so the nesting is
    bit-reversed."""
    a0 = gl.join(*_halves(o0, DT))
    a1 = gl.join(*_halves(o1, DT))
    a2 = gl.join(*_halves(o2, DT))
    a3 = gl.join(*_halves(o3, DT))
    a4 = gl.join(*_halves(o4, DT))
    a5 = gl.join(*_halves(o5, DT))
    a6 = gl.join(*_halves(o6, DT))
    a7 = gl.join(*_halves(o7, DT))
    return gl.join(gl.join(gl.join(a0, a4), gl.join(a2, a6)), gl.join(gl.join(a1, a5), gl.join(a3, a7)))


@gluon.jit
def _k3_operand_a(plane2, plane1, lut3, BLOCK_N: gl.constexpr, A_LAYOUT: gl.constexpr):
    """A 3-bit K block's levels as the left operand, bf16 [BLOCK_N, 64] in _k_operand_a's column order: plane2
    int32 [N, 4] (word t: dims 16 t .. 16 t + 15, 2 bits each), plane1 int16 [N, 4] (halfword t: their high bits),
    lane t holding word t (K3_WORDS); pair p = 4 c1 + 2 c0 + h of PTX_3BIT_PLANES is dims 16 t + 2 p, + 1."""
    o0, o1, o2, o3, o4, o5, o6, o7 = gl.inline_asm_elementwise(
        PTX_3BIT_PLANES, "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r,r,r",
        [plane2, plane1.to(gl.int32), lut3[0], lut3[1], lut3[2], lut3[3]], dtype=(gl.int32,) * 8, is_pure=True,
        pack=1)
    z = _levels8(o0, o1, o2, o3, o4, o5, o6, o7)  # [N, 4 (t), 2 (e), c1, c0, h]: p's bits
    z = gl.permute(z, [0, 3, 4, 5, 1, 2])  # (n, c1, c0, h, t, e)
    z = gl.reshape(z, [BLOCK_N, 64])
    return gl.convert_layout(z, A_LAYOUT)


@gluon.jit
def _v_operand_a(words, lut, BLOCK_N: gl.constexpr, A_LAYOUT: gl.constexpr):
    """_v_operand's levels as the left operand of O^T = V^T P^T: bf16 [64, BLOCK_N], row m = 8 j + g holding
    block dim 8 g + j, column = token."""
    w = gl.permute(gl.reshape(words, [BLOCK_N // 2, 2, 8]), [0, 2, 1])
    w0, w1 = gl.split(w)
    o0, o1, o2, o3, o4, o5, o6, o7 = gl.inline_asm_elementwise(
        PTX_4BIT_2TOK, "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r,r,r,r",
        [w0, w1, lut[0], lut[1], lut[2], lut[3], lut[4]], dtype=(gl.int32,) * 8,
        is_pure=True, pack=1)
    z = _levels8(o0, o1, o2, o3, o4, o5, o6, o7)  # [N / 2 (i), 8 (g), 2 (e), j2, j1, j0]
    z = gl.permute(z, [3, 4, 5, 1, 0, 2])  # (j2, j1, j0, g, i, e)
    z = gl.reshape(z, [64, BLOCK_N])
    return gl.convert_layout(z, A_LAYOUT)


@gluon.jit
def _v3_operand_a(plane2, plane1, lut3, BLOCK_N: gl.constexpr, A_LAYOUT: gl.constexpr):
    """A 3-bit V block's levels as _v_operand_a's: plane2, plane1 int32 [BLOCK_N, 8] (column g: the words holding
    dims 8 g .. 8 g + 7, _load_v3), looked up two tokens at a time (PTX_3BIT_2TOK)."""
    a2, b2 = gl.split(gl.permute(gl.reshape(plane2, [BLOCK_N // 2, 2, 8]), [0, 2, 1]))
    a1, b1 = gl.split(gl.permute(gl.reshape(plane1, [BLOCK_N // 2, 2, 8]), [0, 2, 1]))
    g = gl.arange(0, 8, layout=gl.SliceLayout(0, a2.type.layout))
    sel2 = gl.zeros_like(a2) + (0x5140 + (g & 1) * 0x2222)[None, :]  # halfword g & 1 of each token, interleaved
    sel1 = gl.zeros_like(a2) + (0x4040 + (g & 3) * 0x1111)[None, :]  # byte g & 3 of each token, twice
    o0, o1, o2, o3, o4, o5, o6, o7 = gl.inline_asm_elementwise(
        PTX_3BIT_2TOK, "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r,r,r,r,r,r,r",
        [a2, b2, a1, b1, sel2, sel1, lut3[0], lut3[1], lut3[2], lut3[3]], dtype=(gl.int32,) * 8, is_pure=True,
        pack=1)
    z = _levels8(o0, o1, o2, o3, o4, o5, o6, o7)  # [N / 2 (i), 8 (g), 2 (e), j2, j1, j0]
    z = gl.permute(z, [3, 4, 5, 1, 0, 2])  # (j2, j1, j0, g, i, e)
    z = gl.reshape(z, [64, BLOCK_N])
    return gl.convert_layout(z, A_LAYOUT)


@gluon.jit
def _v_block(tile, first: gl.constexpr, b: gl.constexpr, lut, lut3, BLOCK_N: gl.constexpr, A_LAYOUT: gl.constexpr,
             V3: gl.constexpr):
    """V block b's left operand from the tile's V entries (from tile[first] on: a word tensor per 4-bit block,
    two planes per 3-bit block)."""
    if V3:
        return _v3_operand_a(tile[first + 2 * b], tile[first + 2 * b + 1], lut3, BLOCK_N, A_LAYOUT)
    else:
        return _v_operand_a(tile[first + b], lut, BLOCK_N, A_LAYOUT)


@gluon.jit
def _transpose_p(p, BLOCK_N: gl.constexpr, B_LAYOUT: gl.constexpr, DT: gl.constexpr = gl.bfloat16):
    """P^T [BLOCK_N tokens, 8 heads] bf16 in the scores' accumulator layout (lane g: tokens g + 8 h, lane t: heads
    2t, 2t+1) -> the same values as the right operand of V^T P^T (lane t: tokens 2t, 2t+1 + 8 h, lane g: head g):
    each 8 x 8 block transposed across the warp by movmatrix, i.e. the register pair of a lane becomes the pair
    of the transposed block; the logical index swap is a reshape and permute."""
    x = gl.inline_asm_elementwise(PTX_MOVMATRIX_T, "=r,r", [p.to(gl.int16, bitcast=True)], dtype=gl.int16,
                                  is_pure=True, pack=2).to(DT, bitcast=True)
    # x[8 h + g, n] holds p[8 h + n, g]
    y = gl.reshape(gl.permute(gl.reshape(x, [BLOCK_N // 8, 8, 8]), [0, 2, 1]), [BLOCK_N, 8])
    return gl.convert_layout(y, B_LAYOUT)


@gluon.jit
def _softmax_step(s, c_ok, m_i, l_acc):
    """Online softmax over one tile of scores S^T [N, 8] (log2 units): masks tokens past the split, returns p,
    the rescale factor of the running outputs, and the new running maximum and per-row denominators."""
    s = gl.where(c_ok[:, None], s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=0))
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s - m_new[None, :])
    return p, alpha, m_new, l_acc * alpha[None, :] + p


@gluon.jit
def _pv(v_a, p, vs, o, alpha, BLOCK_N: gl.constexpr, B_LAYOUT: gl.constexpr):
    """o * alpha + V^T (p * vs)^T for one block: vs the block's V scale per token."""
    return mma_v2(v_a, _transpose_p((p * vs[:, None]).to(gl.bfloat16), BLOCK_N, B_LAYOUT), o * alpha[None, :])


# LAZY: the running maximum moves (and the outputs and denominators are rescaled) only when a tile's maximum
# exceeds it by more than this (log2 units), so probabilities stay below 2^LAZY_LOG2; most tiles of a long
# request skip the rescale's multiplies (64 per lane and tile at head_dim 256).
LAZY_LOG2: gl.constexpr = gl.constexpr(8.0)


@gluon.jit
def _pv1(v_a, p, vs, o, BLOCK_N: gl.constexpr, B_LAYOUT: gl.constexpr):
    """o + V^T (p * vs)^T for one block (LAZY: o already rescaled where needed)."""
    return mma_v2(v_a, _transpose_p((p * vs[:, None]).to(gl.bfloat16), BLOCK_N, B_LAYOUT), o)


@gluon.jit
def _store_block(mid_o, o, inv, offs, h_ok, d0):
    om = gl.arange(0, 64, layout=gl.SliceLayout(1, o.type.layout))
    o_dim = d0 + 8 * (om & 7) + (om >> 3)  # row m = 8 j + g holds block dim 8 g + j
    gl.store(mid_o + offs[None, :] + o_dim[:, None], o * inv[None, :], mask=h_ok[None, :])


@gluon.jit
def _k_order(k):
    """The block dim a dot's contraction index k stands for (module docstring): 16 t + 8 c1 + 4 c0 + 2 h + e
    for k = 32 c1 + 16 c0 + 8 h + 2 t + e."""
    return 16 * ((k >> 1) & 3) + 8 * ((k >> 5) & 1) + 4 * ((k >> 4) & 1) + 2 * ((k >> 3) & 1) + (k & 1)


PTX_PARITY: gl.constexpr = gl.constexpr("""{
    .reg .b32 t;
    and.b32 t, $1, $2;
    popc.b32 t, t;
    and.b32 $0, t, 1;
}""")


@gluon.jit
def _hadamard_a(A_OP: gl.constexpr):
    """H64 / 8 with its rows in the permuted K order, as a dot's left operand: bf16 [64, 64], entry (k, j) =
    (-1)^popcount(_k_order(k) & j) / 8 (exact in bf16). Built once per program, from indices."""
    k = gl.arange(0, 64, layout=gl.SliceLayout(1, A_OP))
    j = gl.arange(0, 64, layout=gl.SliceLayout(0, A_OP))
    zeros = gl.zeros([64, 64], gl.int32, layout=A_OP)
    odd = gl.inline_asm_elementwise(PTX_PARITY, "=r,r,r", [zeros + _k_order(k)[:, None], zeros + j[None, :]],
                                    dtype=gl.int32, is_pure=True, pack=1)
    return gl.where(odd != 0, -0.125, 0.125).to(gl.bfloat16)


@gluon.jit
def _rotated_q(q_ptr, signs, q_row, q_mask, d0, qk_scale, h_a, B_OP: gl.constexpr, MMA: gl.constexpr):
    """One 64-dim block of the group's queries, rotated into the octave basis (R q = H64 diag(signs) q / 8) and
    pre-scaled, as the [64, 8] right operand in the permuted K order: the rotation is a dot with _hadamard_a,
    whose rows carry the permutation. q (any float dtype) is split into bf16 high and low parts, so the products
    are exact and the sums float32, as rotate_rows' float32 matmul. q_row: the group's rows (offsets, [1, 8])."""
    j = gl.arange(0, 64, layout=gl.SliceLayout(1, B_OP))
    x = gl.load(q_ptr + q_row + d0 + j[:, None], mask=q_mask, other=0.0).to(gl.float32)
    x = x * gl.load(signs + d0 + j)[:, None]
    hi = x.to(gl.bfloat16)
    lo = (x - hi.to(gl.float32)).to(gl.bfloat16)
    y = mma_v2(h_a, lo, gl.zeros([64, 8], gl.float32, layout=MMA))
    y = mma_v2(h_a, hi, y)
    return gl.convert_layout((y * qk_scale).to(gl.bfloat16), B_OP)


@gluon.jit
def _q8_order(k, K3: gl.constexpr):
    """Q8's contraction order: the block dim the int8 dot's index k stands for. Lane t of an m16n8k32 left
    operand holds k = 16 c + 4 t + e (c, e < 4); its lookup output c byte e is dim 16 t + 4 c + e of a 4-bit block
    (_ptx_k4_q8 over the lane's two words), 16 t + 8 (c & 1) + (c >> 1) + 2 e of a 3-bit one (_ptx_k3_q8)."""
    c = k >> 4
    t = (k >> 2) & 3
    e = k & 3
    if K3:
        return 16 * t + 8 * (c & 1) + (c >> 1) + 2 * e
    else:
        return 16 * t + 4 * c + e


@gluon.jit
def _hadamard_q8(A_OP: gl.constexpr, K3: gl.constexpr):
    """_hadamard_a with its rows in _q8_order."""
    k = gl.arange(0, 64, layout=gl.SliceLayout(1, A_OP))
    j = gl.arange(0, 64, layout=gl.SliceLayout(0, A_OP))
    zeros = gl.zeros([64, 64], gl.int32, layout=A_OP)
    odd = gl.inline_asm_elementwise(PTX_PARITY, "=r,r,r", [zeros + _q8_order(k, K3)[:, None], zeros + j[None, :]],
                                    dtype=gl.int32, is_pure=True, pack=1)
    return gl.where(odd != 0, -0.125, 0.125).to(gl.bfloat16)


@gluon.jit
def _rotated_q32(q_ptr, signs, q_row, q_mask, d0, h_a, B_OP: gl.constexpr, MMA: gl.constexpr):
    """_rotated_q's rotation, float32 [64, 8] in the accumulator layout (rows: h_a's order), not scaled."""
    j = gl.arange(0, 64, layout=gl.SliceLayout(1, B_OP))
    x = gl.load(q_ptr + q_row + d0 + j[:, None], mask=q_mask, other=0.0).to(gl.float32)
    x = x * gl.load(signs + d0 + j)[:, None]
    hi = x.to(gl.bfloat16)
    lo = (x - hi.to(gl.float32)).to(gl.bfloat16)
    y = mma_v2(h_a, lo, gl.zeros([64, 8], gl.float32, layout=MMA))
    return mma_v2(h_a, hi, y)


@gluon.jit
def _q8_operand(y, inv, BLOCK_N: gl.constexpr, MMA: gl.constexpr, B8: gl.constexpr):
    """A rotated q block y [64, 8] (float32) as two int8 right operands of the int8 dot, hi = round(y * inv)
    (|.| <= 127: inv = 127 / the head's largest |y| over all blocks) and lo = round(256 (y * inv - hi)), and the
    accumulator input [BLOCK_N, 8] int32 of the lo dot: -(256 x Q8_BIAS x hi's column sums + Q8_BIAS x lo's, the
    latter rounded), + 128 to round the division by 256 that turns the lo dot into the hi dot's accumulator input
    (_q8_scores). In range: |lo dot| <= 64 x 127 x 128, |bias| <= 16256 x 64 x 127 < 2^28."""
    x = y * inv[None, :]
    hi = gl.where(x >= 0, x + 0.5, x - 0.5).to(gl.int32)
    d = (x - hi.to(gl.float32)) * 256.0
    lo = gl.minimum(gl.where(d >= 0, d + 0.5, d - 0.5).to(gl.int32), 127)
    b = gl.sum(lo, axis=0).to(gl.float32) * 63.5  # Q8_BIAS; exact in float32
    bias = 128 - gl.sum(hi, axis=0) * 16256 - gl.where(b >= 0, b + 0.5, b - 0.5).to(gl.int32)  # 16256 = 256 x 63.5
    c = gl.zeros([BLOCK_N, 8], gl.int32, layout=MMA) + bias[None, :]
    return gl.convert_layout(hi.to(gl.int8), B8), gl.convert_layout(lo.to(gl.int8), B8), c


@gluon.jit
def _q8_scores(k_a, q_hi, q_lo, c):
    """int32 [BLOCK_N, 8]: the scores of an int8 K block k_a in units of q_hi's step x the level step, rounded:
    (256 (K q_hi) + K q_lo + c) / 256, the lo dot's result divided by 256 (mul.hi: the FMA pipe) as the hi dot's
    accumulator input."""
    t = mma_v2(k_a, q_lo, c)
    t = gl.inline_asm_elementwise("mul.hi.s32 $0, $1, 16777216;", "=r,r", [t], dtype=gl.int32, is_pure=True, pack=1)
    return mma_v2(k_a, q_hi, t)


@gluon.jit
def _bytes4(o):
    """int32 [...] -> int8 [..., 2, 2], element [..., i, j] = byte 2 i + j of o."""
    b0 = o.to(gl.int8)
    b1 = (o >> 8).to(gl.int8)
    b2 = (o >> 16).to(gl.int8)
    b3 = (o >> 24).to(gl.int8)
    return gl.join(gl.join(b0, b2), gl.join(b1, b3))


@gluon.jit
def _k4q8_operand_a(words, lut8, BLOCK_N: gl.constexpr, A8: gl.constexpr):
    """A 4-bit K block (int32 [BLOCK_N, 8], lane t holding words 2 t, 2 t + 1: dims 16 t .. 16 t + 15) as the int8
    dot's left operand [BLOCK_N, 64] in _q8_order."""
    lo, hi = gl.inline_asm_elementwise(PTX_K4_Q8, "=r,=r,r,r,r,r,r", [words, lut8[0], lut8[1], lut8[2], lut8[3]],
                                       dtype=(gl.int32,) * 2, is_pure=True, pack=1)
    z = gl.join(_bytes4(lo), _bytes4(hi))  # [N, 8 (2 t + w), 2 (i), 2 (j), 2 (h)]: c = 2 w + h, e = 2 i + j
    z = gl.reshape(z, [BLOCK_N, 4, 2, 2, 2, 2])  # (n, t, w, i, j, h)
    z = gl.permute(z, [0, 2, 5, 1, 3, 4])  # (n, w, h, t, i, j): k = 16 c + 4 t + e
    return gl.convert_layout(gl.reshape(z, [BLOCK_N, 64]), A8)


@gluon.jit
def _k3q8_operand_a(plane2, plane1, lut8, BLOCK_N: gl.constexpr, A8: gl.constexpr):
    """A 3-bit K block (plane2 int32 [N, 4], plane1 int16 [N, 4]: lane t's word / halfword t) as _k4q8_operand_a's."""
    o0, o1, o2, o3 = gl.inline_asm_elementwise(PTX_K3_Q8, "=r,=r,=r,=r,r,r,r,r",
                                               [plane2, plane1.to(gl.int32), lut8[4], lut8[5]],
                                               dtype=(gl.int32,) * 4, is_pure=True, pack=1)
    z = gl.join(gl.join(_bytes4(o0), _bytes4(o2)), gl.join(_bytes4(o1), _bytes4(o3)))  # [N, 4 (t), i, j, u, v]
    z = gl.permute(z, [0, 4, 5, 1, 2, 3])  # (n, u, v, t, i, j): c = 2 u + v, k = 16 c + 4 t + e
    return gl.convert_layout(gl.reshape(z, [BLOCK_N, 64]), A8)


@gluon.jit
def _load_lut8(lut_ptr):
    """Q8_LUT_NAMES' words (lut_ptr[Q8_LUT_AT:]), per lane as _load_lut's."""
    z = (lut_ptr + LUT_ZEROS_AT).to(gl.int64, bitcast=True)
    t = lut_ptr + Q8_LUT_AT
    return (_per_lane(gl.load(t), z), _per_lane(gl.load(t + 1), z), _per_lane(gl.load(t + 2), z),
            _per_lane(gl.load(t + 3), z), _per_lane(gl.load(t + 4), z), _per_lane(gl.load(t + 5), z))


@gluon.jit
def _program_split(kv_indptr, num_kv_splits, MIN_BLOCK: gl.constexpr, SPLIT_MUL: gl.constexpr):
    """This program's (request, KV head, split) and its token range [s0, s1) of the request (kv_start: the
    request's first entry of kv_indices); request b runs num_kv_splits[b] * SPLIT_MUL splits of whole MIN_BLOCKs,
    as stage 2 reads them."""
    batch = gl.program_id(0).to(gl.int64)
    kv_head = gl.program_id(1)
    split = gl.program_id(2)
    kv_start = gl.load(kv_indptr + batch)
    seq_len = gl.load(kv_indptr + batch + 1) - kv_start
    splits = gl.load(num_kv_splits + batch) * SPLIT_MUL
    per_split = gl.cdiv(gl.cdiv(seq_len, splits), MIN_BLOCK) * MIN_BLOCK
    s0 = per_split * split
    return batch, kv_head, split, kv_start, s0, gl.minimum(s0 + per_split, seq_len)


@gluon.jit
def _q_operand_offsets(batch, kv_head, stride_q_b, stride_q_h, GROUP: gl.constexpr, B_OP: gl.constexpr):
    """Offsets (from a block's first dim) and mask of q^T as a block's [64, 8] right operand, in the permuted K
    order (module docstring): row k holds dim 16 t + 8 c1 + 4 c0 + 2 h + e, column n the group's q head n."""
    qk = gl.arange(0, 64, layout=gl.SliceLayout(1, B_OP))
    qh = gl.arange(0, 8, layout=gl.SliceLayout(0, B_OP))
    q_off = batch * stride_q_b + (kv_head * GROUP + qh).to(gl.int64)[None, :] * stride_q_h + _k_order(qk)[:, None]
    return q_off, (qh < GROUP)[None, :]


@gluon.jit
def _store_partials(mid_o, mid_lse, o, m_i, l_acc, batch, kv_head, split, stride_mo_b, stride_mo_h, stride_mo_s,
                    stride_ml_b, stride_ml_h, GROUP: gl.constexpr, HEADS: gl.constexpr):
    """The split's partial outputs (o: one [64, 8] accumulator per 64-dim block) and log-sum-exps, as stage 2
    reads them. The softmax denominators stayed per (token row, head) until here: no cross-lane sum per tile."""
    l_i = gl.sum(l_acc, axis=0)
    inv = 1.0 / l_i
    oh = gl.arange(0, 8, layout=HEADS)
    heads = kv_head * GROUP + oh
    h_ok = oh < GROUP
    offs = batch * stride_mo_b + heads.to(gl.int64) * stride_mo_h + split * stride_mo_s
    for b in gl.static_range(len(o)):
        _store_block(mid_o, o[b], inv, offs, h_ok, 64 * b)
    lse = (m_i + gl.log2(l_i)) * LN2
    gl.store(mid_lse + batch * stride_ml_b + heads * stride_ml_h + split, lse, mask=h_ok)


@gluon.jit
def _step(cur, n0, s1, cn, lut, lut3, q, m_i, l_acc, o, BLOCK_N: gl.constexpr, MMA: gl.constexpr,
          A_OP: gl.constexpr, B_OP: gl.constexpr, D256: gl.constexpr, V3: gl.constexpr, lut8=None, qb=None,
          qs=None, Q8: gl.constexpr = False, STEP4: gl.constexpr = 1.0, STEP3: gl.constexpr = 1.0,
          LAZY: gl.constexpr = False, ql=None):
    """One tile (_load_tile's words `cur`, tokens n0..) into the running softmax and outputs o (one [64, 8]
    accumulator per block). Every operand is decoded before the softmax: one basic block for ptxas to interleave
    the V lookups with the scores' reductions."""
    c_ok = (n0 + cn) < s1
    zero = gl.zeros([BLOCK_N, 8], gl.float32, layout=MMA)
    if D256:
        S0: gl.constexpr = 15 if V3 else 11  # the scale words after K's 7 and V's 4 or 8 entries
        ks0, ks1 = _scale_pair(cur[S0])
        ks2, ks3 = _scale_pair(cur[S0 + 1])
        vs0, vs1 = _scale_pair(cur[S0 + 2])
        vs2, vs3 = _scale_pair(cur[S0 + 3])
        if Q8:
            A8: gl.constexpr = gl.DotOperandLayout(0, MMA, 4)
            # the 3-bit blocks' step is applied with qs (the caller's qs * STEP3), block 0's ratio to it here
            s = _q8_scores(_k4q8_operand_a(cur[0], lut8, BLOCK_N, A8), q[0], ql[0], qb[0]).to(gl.float32) \
                * (ks0 * (STEP4 / STEP3))[:, None]
            s += _q8_scores(_k3q8_operand_a(cur[1], cur[2], lut8, BLOCK_N, A8), q[1], ql[1], qb[1]).to(gl.float32) \
                * ks1[:, None]
            s += _q8_scores(_k3q8_operand_a(cur[3], cur[4], lut8, BLOCK_N, A8), q[2], ql[2], qb[2]).to(gl.float32) \
                * ks2[:, None]
            s += _q8_scores(_k3q8_operand_a(cur[5], cur[6], lut8, BLOCK_N, A8), q[3], ql[3], qb[3]).to(gl.float32) \
                * ks3[:, None]
            s = s * qs[None, :]
        else:
            s = mma_v2(_k_operand_a(cur[0], lut, BLOCK_N, A_OP), q[0], zero) * ks0[:, None]
            s += mma_v2(_k3_operand_a(cur[1], cur[2], lut3, BLOCK_N, A_OP), q[1], zero) * ks1[:, None]
            s += mma_v2(_k3_operand_a(cur[3], cur[4], lut3, BLOCK_N, A_OP), q[2], zero) * ks2[:, None]
            s += mma_v2(_k3_operand_a(cur[5], cur[6], lut3, BLOCK_N, A_OP), q[3], zero) * ks3[:, None]
        v_a0 = _v_block(cur, 7, 0, lut, lut3, BLOCK_N, A_OP, V3)
        v_a1 = _v_block(cur, 7, 1, lut, lut3, BLOCK_N, A_OP, V3)
        v_a2 = _v_block(cur, 7, 2, lut, lut3, BLOCK_N, A_OP, V3)
        v_a3 = _v_block(cur, 7, 3, lut, lut3, BLOCK_N, A_OP, V3)
        if LAZY:
            o0, o1, o2, o3 = o
            s = gl.where(c_ok[:, None], s, float("-inf"))
            m_tile = gl.max(s, axis=0)
            if gl.max(m_tile - m_i, axis=0) > LAZY_LOG2:
                m_new = gl.maximum(m_i, m_tile)
                alpha = gl.exp2(m_i - m_new)
                l_acc = l_acc * alpha[None, :]
                o0 = o0 * alpha[None, :]
                o1 = o1 * alpha[None, :]
                o2 = o2 * alpha[None, :]
                o3 = o3 * alpha[None, :]
                m_i = m_new
            p = gl.exp2(s - m_i[None, :])
            l_acc = l_acc + p
            o = (_pv1(v_a0, p, vs0, o0, BLOCK_N, B_OP), _pv1(v_a1, p, vs1, o1, BLOCK_N, B_OP),
                 _pv1(v_a2, p, vs2, o2, BLOCK_N, B_OP), _pv1(v_a3, p, vs3, o3, BLOCK_N, B_OP))
        else:
            p, alpha, m_i, l_acc = _softmax_step(s, c_ok, m_i, l_acc)
            o = (_pv(v_a0, p, vs0, o[0], alpha, BLOCK_N, B_OP), _pv(v_a1, p, vs1, o[1], alpha, BLOCK_N, B_OP),
                 _pv(v_a2, p, vs2, o[2], alpha, BLOCK_N, B_OP), _pv(v_a3, p, vs3, o[3], alpha, BLOCK_N, B_OP))
    else:
        S0: gl.constexpr = 6 if V3 else 4  # the scale words after K's 2 and V's 2 or 4 entries
        ks0, ks1 = _scale_pair(cur[S0])
        vs0, vs1 = _scale_pair(cur[S0 + 1])
        if Q8:
            A8: gl.constexpr = gl.DotOperandLayout(0, MMA, 4)
            k_a0 = _k4q8_operand_a(cur[0], lut8, BLOCK_N, A8)
            k_a1 = _k4q8_operand_a(cur[1], lut8, BLOCK_N, A8)
        else:
            k_a0 = _k_operand_a(cur[0], lut, BLOCK_N, A_OP)
            k_a1 = _k_operand_a(cur[1], lut, BLOCK_N, A_OP)
        v_a0 = _v_block(cur, 2, 0, lut, lut3, BLOCK_N, A_OP, V3)
        v_a1 = _v_block(cur, 2, 1, lut, lut3, BLOCK_N, A_OP, V3)
        if Q8:
            s = (_q8_scores(k_a0, q[0], ql[0], qb[0]).to(gl.float32) * ks0[:, None]
                 + _q8_scores(k_a1, q[1], ql[1], qb[1]).to(gl.float32) * ks1[:, None]) * qs[None, :]
        else:
            s = mma_v2(k_a0, q[0], zero) * ks0[:, None] + mma_v2(k_a1, q[1], zero) * ks1[:, None]
        if LAZY:
            o0, o1 = o
            s = gl.where(c_ok[:, None], s, float("-inf"))
            m_tile = gl.max(s, axis=0)
            if gl.max(m_tile - m_i, axis=0) > LAZY_LOG2:
                m_new = gl.maximum(m_i, m_tile)
                alpha = gl.exp2(m_i - m_new)
                l_acc = l_acc * alpha[None, :]
                o0 = o0 * alpha[None, :]
                o1 = o1 * alpha[None, :]
                m_i = m_new
            p = gl.exp2(s - m_i[None, :])
            l_acc = l_acc + p
            o = (_pv1(v_a0, p, vs0, o0, BLOCK_N, B_OP), _pv1(v_a1, p, vs1, o1, BLOCK_N, B_OP))
        else:
            p, alpha, m_i, l_acc = _softmax_step(s, c_ok, m_i, l_acc)
            o = (_pv(v_a0, p, vs0, o[0], alpha, BLOCK_N, B_OP), _pv(v_a1, p, vs1, o[1], alpha, BLOCK_N, B_OP))
    return m_i, l_acc, o


@gluon.jit
def _decode_stage1_mma(q_ptr, k_codes, k_scales, v_codes, v_scales, kv_indptr, kv_indices, num_kv_splits,
                       mid_o, mid_lse, sm_scale, lut_ptr,
                       stride_kc_slot, stride_kc_head, stride_ks_slot, stride_ks_head,
                       stride_vc_slot, stride_vc_head, stride_vs_slot, stride_vs_head,
                       stride_q_b, stride_q_h, stride_mo_b, stride_mo_h, stride_mo_s, stride_ml_b, stride_ml_h,
                       GROUP: gl.constexpr, BLOCK_N: gl.constexpr, MIN_BLOCK: gl.constexpr, WIDE: gl.constexpr,
                       D256: gl.constexpr = False, SPLIT_MUL: gl.constexpr = 1, V3: gl.constexpr = False,
                       Q8: gl.constexpr = False, STEP4: gl.constexpr = 1.0, STEP3: gl.constexpr = 1.0,
                       LAZY: gl.constexpr = False):
    """One program per (request, KV head, split); request b runs num_kv_splits[b] * SPLIT_MUL splits. D256:
    head_dim 256 (K: a 4-bit block, three 3-bit ones), else 128 (two 4-bit K blocks). V3: 3-bit V blocks
    (octave_k3v3), else 4-bit (octave_k3v4). WIDE: row offsets in int64 (planes of 2^31 words or more)."""
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
    A_OP: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
    B_OP: gl.constexpr = gl.DotOperandLayout(1, MMA, 2)
    # K words: lane (g, t) holds tokens g (+ 8 ...) and the words 2 t, 2 t + 1 of a 4-bit block (word t of a
    # 3-bit block's planes); V words: tokens 2 t, 2 t + 1 (+ 8 ...) and word g of a block
    K_WORDS: gl.constexpr = gl.BlockedLayout([1, 2], [8, 4], [1, 1], [1, 0])
    K3_WORDS: gl.constexpr = gl.BlockedLayout([1, 1], [8, 4], [1, 1], [1, 0])
    V_WORDS: gl.constexpr = gl.BlockedLayout([2, 1], [4, 8], [1, 1], [0, 1])
    TOKS: gl.constexpr = gl.SliceLayout(1, MMA)  # per token of the scores' rows
    HEADS: gl.constexpr = gl.SliceLayout(0, MMA)  # per q head

    batch, kv_head, split, kv_start, s0, s1 = _program_split(kv_indptr, num_kv_splits, MIN_BLOCK, SPLIT_MUL)
    if s1 > s0:
        qk_scale = sm_scale * LOG2E
        # q^T rotated here (q_ptr holds the queries as the model made them), in the permuted K order, pre-scaled:
        # one [64, 8] right operand per block
        qh = gl.arange(0, 8, layout=gl.SliceLayout(0, B_OP))
        q_row = (batch * stride_q_b + (kv_head * GROUP + qh).to(gl.int64) * stride_q_h)[None, :]
        q_mask = (qh < GROUP)[None, :]
        signs = (lut_ptr + K_SIGNS_AT).to(gl.pointer_type(gl.float32), bitcast=True)
        if Q8:
            # int8 scores: q rotated in float32, one int8 scale per head over all blocks (qs, with qk_scale)
            B8: gl.constexpr = gl.DotOperandLayout(1, MMA, 4)
            h4 = _hadamard_q8(A_OP, False)
            y0 = _rotated_q32(q_ptr, signs, q_row, q_mask, 0, h4, B_OP, MMA)
            if D256:
                h3 = _hadamard_q8(A_OP, True)
                y1 = _rotated_q32(q_ptr, signs, q_row, q_mask, 64, h3, B_OP, MMA)
                y2 = _rotated_q32(q_ptr, signs, q_row, q_mask, 128, h3, B_OP, MMA)
                y3 = _rotated_q32(q_ptr, signs, q_row, q_mask, 192, h3, B_OP, MMA)
                amax = gl.maximum(gl.maximum(gl.max(gl.abs(y0), axis=0), gl.max(gl.abs(y1), axis=0)),
                                  gl.maximum(gl.max(gl.abs(y2), axis=0), gl.max(gl.abs(y3), axis=0)))
            else:
                y1 = _rotated_q32(q_ptr, signs, q_row, q_mask, 64, h4, B_OP, MMA)
                amax = gl.maximum(gl.max(gl.abs(y0), axis=0), gl.max(gl.abs(y1), axis=0))
            amax = gl.maximum(amax, 1e-30)
            qs = amax * (qk_scale / 127.0)
            inv = 127.0 / amax
            q0, ql0, qb0 = _q8_operand(y0, inv, BLOCK_N, MMA, B8)
            q1, ql1, qb1 = _q8_operand(y1, inv, BLOCK_N, MMA, B8)
            if D256:
                q2, ql2, qb2 = _q8_operand(y2, inv, BLOCK_N, MMA, B8)
                q3, ql3, qb3 = _q8_operand(y3, inv, BLOCK_N, MMA, B8)
                qb = (qb0, qb1, qb2, qb3)
                ql = (ql0, ql1, ql2, ql3)
                qs = qs * STEP3  # _step's scores: the 3-bit blocks' step (block 0's ratio to it applied there)
            else:
                qb = (qb0, qb1)
                ql = (ql0, ql1)
                qs = qs * STEP4
            lut8 = _load_lut8(lut_ptr)
        else:
            h_a = _hadamard_a(A_OP)
            q0 = _rotated_q(q_ptr, signs, q_row, q_mask, 0, qk_scale, h_a, B_OP, MMA)
            q1 = _rotated_q(q_ptr, signs, q_row, q_mask, 64, qk_scale, h_a, B_OP, MMA)
            if D256:
                q2 = _rotated_q(q_ptr, signs, q_row, q_mask, 128, qk_scale, h_a, B_OP, MMA)
                q3 = _rotated_q(q_ptr, signs, q_row, q_mask, 192, qk_scale, h_a, B_OP, MMA)
            qb = None
            ql = None
            qs = None
            lut8 = None
        lut = _load_lut(lut_ptr)
        if D256 or V3:
            lut3 = _load_lut3(lut_ptr)
        else:
            lut3 = lut  # not read: only 3-bit blocks use lut3

        kn = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, K_WORDS))
        vn = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, V_WORDS))
        cn = gl.arange(0, BLOCK_N, layout=TOKS)
        m_i = gl.full([8], float("-inf"), gl.float32, layout=HEADS)
        l_acc = gl.zeros([BLOCK_N, 8], gl.float32, layout=MMA)
        o0 = gl.zeros([64, 8], gl.float32, layout=MMA)
        o1 = gl.zeros([64, 8], gl.float32, layout=MMA)
        if D256:
            o2 = gl.zeros([64, 8], gl.float32, layout=MMA)
            o3 = gl.zeros([64, 8], gl.float32, layout=MMA)
        # 32-bit words of the codes and of the fp16 scale pairs; a head's code rows are whole numbers of 64-bit
        # words (launch_stage1 asserts it), which lets K's two-word loads be vectorised
        kc_w = k_codes.to(gl.pointer_type(gl.int32)) + gl.multiple_of(kv_head * (stride_kc_head // 4), 2)
        vc_w = v_codes.to(gl.pointer_type(gl.int32)) + gl.multiple_of(kv_head * (stride_vc_head // 4), 2)
        vc_stride = stride_vc_slot // 4
        ks_w = (k_scales + kv_head * stride_ks_head).to(gl.pointer_type(gl.int32))
        vs_w = (v_scales + kv_head * stride_vs_head).to(gl.pointer_type(gl.int32))
        idx = kv_indices + kv_start
        if D256:
            q = (q0, q1, q2, q3)
            o = (o0, o1, o2, o3)
        else:
            q = (q0, q1)
            o = (o0, o1)
        tile = _load_tile(_slots(idx, s0, s1, kn, vn, cn), s0, s1, cn, kc_w, vc_w, ks_w, vs_w, stride_kc_slot // 4,
                          vc_stride, stride_ks_slot // 2, stride_vs_slot // 2, K_WORDS, K3_WORDS, V_WORDS, D256, V3,
                          WIDE)
        for n0 in range(s0, s1, BLOCK_N):
            cur = tile
            # the next tile's loads in flight while this one is computed (measured: 175 -> 166 us at batch 8 x 32k).
            # ptxas then copies the loaded words into the loop-carried registers at the end of the iteration, and
            # that copy waits for the loads (15 % of the stall samples, round 16); unrolled by two the copies go,
            # but the time did not improve (d128 160 vs 161 us, d256 182 vs 163 at batch 8 x 32k).
            tile = _load_tile(_slots(idx, n0 + BLOCK_N, s1, kn, vn, cn), n0 + BLOCK_N, s1, cn, kc_w, vc_w, ks_w, vs_w,
                              stride_kc_slot // 4, vc_stride, stride_ks_slot // 2, stride_vs_slot // 2, K_WORDS,
                              K3_WORDS, V_WORDS, D256, V3, WIDE)
            m_i, l_acc, o = _step(cur, n0, s1, cn, lut, lut3, q, m_i, l_acc, o, BLOCK_N, MMA, A_OP, B_OP, D256, V3,
                                  lut8, qb, qs, Q8, STEP4, STEP3, LAZY, ql)

        _store_partials(mid_o, mid_lse, o, m_i, l_acc, batch, kv_head, split, stride_mo_b, stride_mo_h, stride_mo_s,
                        stride_ml_b, stride_ml_h, GROUP, HEADS)


@gluon.jit
def _k8_operand_a(words, m64, BLOCK_N: gl.constexpr, A_LAYOUT: gl.constexpr):
    """An int8 K block (int32 [BLOCK_N, 16], lane t holding words 4 t .. 4 t + 3 = dims 16 t .. 16 t + 15) as the
    left operand, f16 [BLOCK_N, 64] in _k_operand_a's column order: words 2 j, 2 j + 1 of the lane play the
    4-bit lookup's word j."""
    w0, w1 = gl.split(gl.reshape(words, [BLOCK_N, 8, 2]))
    o0, o1, o2, o3 = gl.inline_asm_elementwise(PTX_INT8_1TOK, "=r,=r,=r,=r,r,r,r", [w0, w1, m64],
                                               dtype=(gl.int32,) * 4, is_pure=True, pack=1)
    return _k_pairs(o0, o1, o2, o3, BLOCK_N, A_LAYOUT, gl.float16)


@gluon.jit
def _v8_operand_a(words, m64, BLOCK_N: gl.constexpr, A_LAYOUT: gl.constexpr):
    """An int8 V block (int32 [BLOCK_N, 16], lane g holding words 2 g, 2 g + 1 = dims 8 g .. 8 g + 7) as the
    left operand of O^T = V^T P^T, f16 [64, BLOCK_N] in _v_operand_a's row order."""
    w = gl.permute(gl.reshape(words, [BLOCK_N // 2, 2, 8, 2]), [0, 2, 3, 1])  # (i, g, word, token of the pair)
    ta, tb = gl.split(w)
    a0, a1 = gl.split(ta)
    b0, b1 = gl.split(tb)
    o0, o1, o2, o3, o4, o5, o6, o7 = gl.inline_asm_elementwise(
        PTX_INT8_2TOK, "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r,r", [a0, a1, b0, b1, m64], dtype=(gl.int32,) * 8,
        is_pure=True, pack=1)
    z = _levels8(o0, o1, o2, o3, o4, o5, o6, o7, gl.float16)  # [N / 2 (i), 8 (g), 2 (e), j2, j1, j0]
    z = gl.permute(z, [3, 4, 5, 1, 0, 2])  # (j2, j1, j0, g, i, e)
    z = gl.reshape(z, [64, BLOCK_N])
    return gl.convert_layout(z, A_LAYOUT)


@gluon.jit
def _load_tile8(idx, n0, s1, kn, vn, cn, kc_w, vc_w, ks_p, vs_p, kc_stride, vc_stride, ks_stride, vs_stride,
                K_WORDS: gl.constexpr, V_WORDS: gl.constexpr, NB: gl.constexpr, WIDE: gl.constexpr):
    """An int8 tile's words (tokens n0..): per 64-dim block b, K [N, 16] (K_WORDS: one 128-bit load per token)
    and V [N, 16] (V_WORDS); then the K and V scales [N] (float32, one per token and head)."""
    slots = _slots(idx, n0, s1, kn, vn, cn, False)
    k_row = _rows(slots[0], kc_stride, WIDE)
    v_row = _rows(slots[1], vc_stride, WIDE)
    c_ok = (n0 + cn) < s1
    kw = gl.arange(0, 16, layout=gl.SliceLayout(0, K_WORDS))
    vw = gl.arange(0, 16, layout=gl.SliceLayout(0, V_WORDS))
    k_ptr = kc_w + k_row[:, None] + kw[None, :]
    v_ptr = vc_w + v_row[:, None] + vw[None, :]
    ks = gl.load(ks_p + _rows(slots[2], ks_stride, WIDE), mask=c_ok, other=0.0)
    vs = gl.load(vs_p + _rows(slots[2], vs_stride, WIDE), mask=c_ok, other=0.0)
    if NB == 4:
        return (gl.load(k_ptr), gl.load(k_ptr + 16), gl.load(k_ptr + 32), gl.load(k_ptr + 48), gl.load(v_ptr),
                gl.load(v_ptr + 16), gl.load(v_ptr + 32), gl.load(v_ptr + 48), ks, vs)
    elif NB == 2:
        return (gl.load(k_ptr), gl.load(k_ptr + 16), gl.load(v_ptr), gl.load(v_ptr + 16), ks, vs)
    else:
        return (gl.load(k_ptr), gl.load(v_ptr), ks, vs)


@gluon.jit
def _step8(cur, n0, s1, cn, m64, q, m_i, l_acc, o, BLOCK_N: gl.constexpr, MMA: gl.constexpr,
           A_OP: gl.constexpr, B_OP: gl.constexpr, NB: gl.constexpr):
    """_step for int8: one scale per token for all of K's blocks (applied to the scores) and all of V's (applied
    to P once, so one transposed P serves every block's dot)."""
    c_ok = (n0 + cn) < s1
    zero = gl.zeros([BLOCK_N, 8], gl.float32, layout=MMA)
    s = mma_v2(_k8_operand_a(cur[0], m64, BLOCK_N, A_OP), q[0], zero)
    if NB >= 2:
        s = mma_v2(_k8_operand_a(cur[1], m64, BLOCK_N, A_OP), q[1], s)
    if NB == 4:
        s = mma_v2(_k8_operand_a(cur[2], m64, BLOCK_N, A_OP), q[2], s)
        s = mma_v2(_k8_operand_a(cur[3], m64, BLOCK_N, A_OP), q[3], s)
    s = s * cur[2 * NB][:, None]
    v_a0 = _v8_operand_a(cur[NB], m64, BLOCK_N, A_OP)
    if NB >= 2:
        v_a1 = _v8_operand_a(cur[NB + 1], m64, BLOCK_N, A_OP)
    if NB == 4:
        v_a2 = _v8_operand_a(cur[NB + 2], m64, BLOCK_N, A_OP)
        v_a3 = _v8_operand_a(cur[NB + 3], m64, BLOCK_N, A_OP)
    p, alpha, m_i, l_acc = _softmax_step(s, c_ok, m_i, l_acc)
    pt = _transpose_p((p * cur[2 * NB + 1][:, None]).to(gl.float16), BLOCK_N, B_OP, gl.float16)
    if NB == 4:
        o = (mma_v2(v_a0, pt, o[0] * alpha[None, :]), mma_v2(v_a1, pt, o[1] * alpha[None, :]),
             mma_v2(v_a2, pt, o[2] * alpha[None, :]), mma_v2(v_a3, pt, o[3] * alpha[None, :]))
    elif NB == 2:
        o = (mma_v2(v_a0, pt, o[0] * alpha[None, :]), mma_v2(v_a1, pt, o[1] * alpha[None, :]))
    else:
        o = (mma_v2(v_a0, pt, o[0] * alpha[None, :]),)
    return m_i, l_acc, o


@gluon.jit
def _decode_stage1_mma_int8(q_ptr, k_codes, k_scales, v_codes, v_scales, kv_indptr, kv_indices, num_kv_splits,
                            mid_o, mid_lse, sm_scale, lut_ptr,
                            stride_kc_slot, stride_kc_head, stride_ks_slot, stride_ks_head,
                            stride_vc_slot, stride_vc_head, stride_vs_slot, stride_vs_head,
                            stride_q_b, stride_q_h, stride_mo_b, stride_mo_h, stride_mo_s, stride_ml_b, stride_ml_h,
                            GROUP: gl.constexpr, BLOCK_N: gl.constexpr, MIN_BLOCK: gl.constexpr, WIDE: gl.constexpr,
                            NB: gl.constexpr, SPLIT_MUL: gl.constexpr = 1):
    """_decode_stage1_mma for int8 (NB 64-dim blocks: head_dim 64, 128 or 256): the codes go into f16 operands by
    the exponent-byte conversion (PTX_INT8_1TOK / PTX_INT8_2TOK) instead of a level lookup; q and P are f16."""
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
    A_OP: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
    B_OP: gl.constexpr = gl.DotOperandLayout(1, MMA, 2)
    # K words: lane (g, t) holds tokens g (+ 8 ...) and words 4 t .. 4 t + 3 of a block; V words: tokens 2 t,
    # 2 t + 1 (+ 8 ...) and words 2 g, 2 g + 1
    K_WORDS: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [1, 1], [1, 0])
    V_WORDS: gl.constexpr = gl.BlockedLayout([2, 2], [4, 8], [1, 1], [0, 1])
    TOKS: gl.constexpr = gl.SliceLayout(1, MMA)
    HEADS: gl.constexpr = gl.SliceLayout(0, MMA)

    batch, kv_head, split, kv_start, s0, s1 = _program_split(kv_indptr, num_kv_splits, MIN_BLOCK, SPLIT_MUL)
    if s1 > s0:
        qk_scale = sm_scale * LOG2E
        q_off, q_mask = _q_operand_offsets(batch, kv_head, stride_q_b, stride_q_h, GROUP, B_OP)
        q0 = (gl.load(q_ptr + q_off, mask=q_mask, other=0.0) * qk_scale).to(gl.float16)
        o0 = gl.zeros([64, 8], gl.float32, layout=MMA)
        if NB == 4:
            q = (q0, (gl.load(q_ptr + q_off + 64, mask=q_mask, other=0.0) * qk_scale).to(gl.float16),
                 (gl.load(q_ptr + q_off + 128, mask=q_mask, other=0.0) * qk_scale).to(gl.float16),
                 (gl.load(q_ptr + q_off + 192, mask=q_mask, other=0.0) * qk_scale).to(gl.float16))
            o = (o0, o0, o0, o0)
        elif NB == 2:
            q = (q0, (gl.load(q_ptr + q_off + 64, mask=q_mask, other=0.0) * qk_scale).to(gl.float16))
            o = (o0, o0)
        else:
            q = (q0,)
            o = (o0,)
        z = (lut_ptr + LUT_ZEROS_AT).to(gl.int64, bitcast=True)
        m64 = _per_lane(gl.load(lut_ptr + LUT_ZEROS_AT - 1), z)

        kn = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, K_WORDS))
        vn = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, V_WORDS))
        cn = gl.arange(0, BLOCK_N, layout=TOKS)
        m_i = gl.full([8], float("-inf"), gl.float32, layout=HEADS)
        l_acc = gl.zeros([BLOCK_N, 8], gl.float32, layout=MMA)
        # code rows are whole numbers of 128-bit words (launch_stage1 asserts it): K's loads are vectorised
        kc_w = k_codes.to(gl.pointer_type(gl.int32)) + gl.multiple_of(kv_head * (stride_kc_head // 4), 4)
        vc_w = v_codes.to(gl.pointer_type(gl.int32)) + gl.multiple_of(kv_head * (stride_vc_head // 4), 4)
        ks_p = k_scales + kv_head * stride_ks_head
        vs_p = v_scales + kv_head * stride_vs_head
        idx = kv_indices + kv_start
        tile = _load_tile8(idx, s0, s1, kn, vn, cn, kc_w, vc_w, ks_p, vs_p, stride_kc_slot // 4, stride_vc_slot // 4,
                           stride_ks_slot, stride_vs_slot, K_WORDS, V_WORDS, NB, WIDE)
        for n0 in range(s0, s1, BLOCK_N):
            cur = tile
            tile = _load_tile8(idx, n0 + BLOCK_N, s1, kn, vn, cn, kc_w, vc_w, ks_p, vs_p, stride_kc_slot // 4,
                               stride_vc_slot // 4, stride_ks_slot, stride_vs_slot, K_WORDS, V_WORDS, NB, WIDE)
            m_i, l_acc, o = _step8(cur, n0, s1, cn, m64, q, m_i, l_acc, o, BLOCK_N, MMA, A_OP, B_OP, NB)

        _store_partials(mid_o, mid_lse, o, m_i, l_acc, batch, kv_head, split, stride_mo_b, stride_mo_h, stride_mo_s,
                        stride_ml_b, stride_ml_h, GROUP, HEADS)


_LUT: dict = {}


def lut_tensor(device) -> torch.Tensor:
    """lut_words(), LUT_LANE_ZEROS zeros (_load_lut) and the K rotation's signs of 4 blocks (K_SIGNS_AT) as an
    int32 tensor on `device` (cached)."""
    key = str(device)
    if key not in _LUT:
        words = lut_words()
        assert len(words) == LUT_ZEROS_AT.value and len(words) + LUT_LANE_ZEROS == K_SIGNS_AT.value
        signs = rotation.signs(rotation.K_TENSOR, 4).reshape(-1).view(torch.int32).tolist()
        assert len(words) + LUT_LANE_ZEROS + len(signs) == Q8_LUT_AT.value
        _LUT[key] = torch.tensor(words + [0] * LUT_LANE_ZEROS + signs + q8_lut_words(), dtype=torch.int32,
                                 device=device)
    return _LUT[key]


def supported(fmt, group: int, q_len: int, info) -> str | None:
    """None when this kernel can run the call on the device `info` (device.DeviceInfo), else why not (the scope in
    the module docstring)."""
    from . import tables

    if tables.format_kind(fmt) not in (tables.FMT_OCTAVE, tables.FMT_INT8):
        return f"{fmt.name} is neither an octave format nor int8"
    if tables.format_kind(fmt) == tables.FMT_INT8:
        if layout_of(fmt) is None:
            return f"int8 at head_dim 64, 128 or 256 only (got {fmt.head_dim})"
    elif layout_of(fmt) is None:
        return (f"only octave_k3v4 / octave_k3v3 at head_dim 128 (4-bit K blocks) or 256 with rotary_dim 64 (K blocks "
                f"of 4, 3, 3, 3 bits), V blocks all 4-bit or all 3-bit (got {fmt.name} at head_dim {fmt.head_dim}, "
                f"K bits {fmt.k_bits}, V bits {fmt.v_bits})")
    if q_len != 1:
        return "only one query token per request"
    if group > 8:
        return f"GQA groups of at most 8 q heads (got {group})"
    if info.vendor != "cuda" or info.capability is None or info.capability[0] < 8:
        return "needs an NVIDIA GPU of compute capability 8.0 or later"
    if info.interpreted:
        return "Gluon kernels do not run under the Triton interpreter"
    return None


def layout_of(fmt) -> str | None:
    """"d128" / "d256" (octave, 4-bit V), "d128v3" / "d256v3" (octave, 3-bit V), "int8d64" / "int8d128" /
    "int8d256": the block layouts the kernels read; None for any other."""
    if not hasattr(fmt, "k_bits"):  # int8
        return f"int8d{fmt.head_dim}" if fmt.head_dim in (64, 128, 256) and fmt.name == "int8" else None
    k_bits = {128: (4, 4), 256: (4, 3, 3, 3)}.get(fmt.head_dim)
    if k_bits is None or fmt.k_bits != k_bits or len(set(fmt.v_bits)) != 1 or fmt.v_bits[0] not in (3, 4):
        return None
    return f"d{fmt.head_dim}" + ("v3" if fmt.v_bits[0] == 3 else "")


# The block layouts (layout_of) whose Gluon stage 1 was measured faster than decode._decode_stage1 on an H200
# (docs/benchmarks/kernels.md, rounds 15-16).
DEFAULT_LAYOUTS = frozenset({"d128", "d256", "d128v3", "d256v3", "int8d128", "int8d256"})


def default_for(fmt, group: int, q_len: int, info) -> bool:
    """Whether decode_attention takes this kernel when the caller does not choose: where it runs and was
    measured faster than decode._decode_stage1 (DEFAULT_LAYOUTS), on compute capability 9 (an H200). On sm_80 /
    sm_86 it compiles (kernels.targets) but was not run: stage1="mma" asks for it."""
    return supported(fmt, group, q_len, info) is None and layout_of(fmt) in DEFAULT_LAYOUTS and info.at_least(9)


def launch_stage1(grid, q_in, kc, ks, vc, vs, kv_indptr, kv_indices, num_kv_splits, mid_o, mid_lse, sm_scale,
                  group: int, block_n: int, min_block: int, split_mul: int = 1, warmup: bool = False,
                  qk8: bool = False, lazy: bool = False):
    """Launch (or, with warmup, only compile and return the kernel: decode.resident_programs reads it): the int8
    kernel for int8 code planes, else the octave one. Octave code planes are read as 32-bit words and a (token,
    head)'s two fp16 scales as one: rows and heads must start on 4-byte boundaries. int8 code rows are read as
    128-bit words."""
    assert group <= 8, group
    assert block_n in (16, 32, 64), block_n
    d = q_in.shape[-1]
    d256 = d == 256
    if vc.dtype == torch.int8:  # int8: rows of whole 128-bit words (K's four-word loads), float32 scales
        assert kc.shape[-1] == d and vc.shape[-1] == d and d in (64, 128, 256), (kc.shape, vc.shape, d)
        assert all(t.stride(i) % 16 == 0 for t in (kc, vc) for i in (0, 1)), (kc.stride(), vc.stride())
        assert ks.dtype == torch.float32 and vs.dtype == torch.float32 and ks.stride(2) == 1 and vs.stride(2) == 1
        assert all(t.data_ptr() % 16 == 0 for t in (kc, vc))
        kernel, consts = _decode_stage1_mma_int8, {"NB": d // 64}
        wide = max(kc.numel(), vc.numel()) // 4 >= 2**31 or max(ks.numel(), vs.numel()) >= 2**31
    else:
        kernel, consts = _decode_stage1_mma, {"D256": d256, "V3": _octave_v3(vc, d)}
        if qk8:
            consts.update({"Q8": True, "STEP4": q8_table(4)[0], "STEP3": q8_table(3)[0]})
        if lazy:
            consts["LAZY"] = True
        wide = _octave_checks(kc, ks, vc, vs)
    args = (q_in, kc, ks, vc, vs, kv_indptr, kv_indices, num_kv_splits, mid_o, mid_lse, sm_scale,
            lut_tensor(q_in.device), kc.stride(0), kc.stride(1), ks.stride(0), ks.stride(1), vc.stride(0),
            vc.stride(1), vs.stride(0), vs.stride(1), q_in.stride(0), q_in.stride(1), mid_o.stride(0),
            mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1))
    consts.update({"GROUP": group, "BLOCK_N": block_n, "MIN_BLOCK": min_block, "WIDE": wide, "SPLIT_MUL": split_mul,
                   "num_warps": 1})
    if warmup:
        compiled = kernel.warmup(*args, grid=(1,), **consts)
        return compiled.result() if hasattr(compiled, "result") else compiled
    kernel[grid](*args, **consts)


def _octave_v3(vc, d: int) -> bool:
    assert vc.shape[-1] in (d // 2, d * 3 // 8), (vc.shape, d)  # 4-bit or 3-bit V code rows
    return vc.shape[-1] == d * 3 // 8


def _octave_checks(kc, ks, vc, vs) -> bool:
    """The octave planes' alignment (launch_stage1's docstring); returns WIDE."""
    # rows of whole 64-bit words (K's two-word loads), scale pairs on 4-byte boundaries
    assert kc.stride(0) % 8 == 0 and kc.stride(1) % 8 == 0 and vc.stride(0) % 8 == 0 and vc.stride(1) % 8 == 0
    assert ks.stride(0) % 2 == 0 and ks.stride(1) % 2 == 0 and vs.stride(0) % 2 == 0 and vs.stride(1) % 2 == 0
    assert all(t.data_ptr() % 4 == 0 for t in (kc, ks, vc, vs))
    return max(kc.numel(), vc.numel()) // 4 >= 2**31 or max(ks.numel(), vs.numel()) // 2 >= 2**31
