"""Triton device helpers shared by the attention kernels. A head is processed as 64-dim blocks: for block b
`kv_block` gives the tile's unscaled values (bf16 values, int8 codes, or octave Lloyd-Max levels, read from
contiguous packed bytes and unpacked in registers) and `kv_scale` its per-row scale; `scores` and
`accumulate` apply the scales to the [M, BLOCK_N] score / probability tiles, never to a [BLOCK_N, D] tile.
Nothing here dequantizes more than the tile in hand. Heads have at most 4 blocks (head_dim <= 256), so q
blocks and output accumulators travel as four variables (unused ones are dead code)."""

from __future__ import annotations

import triton
import triton.language as tl

from ..kvformats.codebook import LEVELS
from .int8_ptx import int8_to_f16_ptx
from .levels_ptx import levels_3bit_planes_ptx, levels_3bit_ptx, levels_4bit_ptx

# Positive Lloyd-Max levels as compile-time constants (the negative half is the exact mirror).
P4_0: tl.constexpr = tl.constexpr(LEVELS[4][8])
P4_1: tl.constexpr = tl.constexpr(LEVELS[4][9])
P4_2: tl.constexpr = tl.constexpr(LEVELS[4][10])
P4_3: tl.constexpr = tl.constexpr(LEVELS[4][11])
P4_4: tl.constexpr = tl.constexpr(LEVELS[4][12])
P4_5: tl.constexpr = tl.constexpr(LEVELS[4][13])
P4_6: tl.constexpr = tl.constexpr(LEVELS[4][14])
P4_7: tl.constexpr = tl.constexpr(LEVELS[4][15])
P3_0: tl.constexpr = tl.constexpr(LEVELS[3][4])
P3_1: tl.constexpr = tl.constexpr(LEVELS[3][5])
P3_2: tl.constexpr = tl.constexpr(LEVELS[3][6])
P3_3: tl.constexpr = tl.constexpr(LEVELS[3][7])


@triton.jit
def level_of(code, BITS: tl.constexpr):
    """Lloyd-Max level of each code (select tree; no memory lookups)."""
    if BITS == 4:
        neg = code < 8
        m = tl.where(neg, 7 - code, code - 8)
        pos = tl.where(m < 4,
                       tl.where(m < 2, tl.where(m == 0, P4_0, P4_1), tl.where(m == 2, P4_2, P4_3)),
                       tl.where(m < 6, tl.where(m == 4, P4_4, P4_5), tl.where(m == 6, P4_6, P4_7)))
    else:
        neg = code < 4
        m = tl.where(neg, 3 - code, code - 4)
        pos = tl.where(m < 2, tl.where(m == 0, P3_0, P3_1), tl.where(m == 2, P3_2, P3_3))
    return tl.where(neg, -pos, pos)


@triton.jit
def codes_block(row_ptr, mask_n, OFF: tl.constexpr, BITS: tl.constexpr, BLOCK_N: tl.constexpr):
    """int32 codes [BLOCK_N, 64] of the block whose packed bytes start OFF bytes into each row.
    (Measured on an H200: a per-dim gather of each code's byte instead of this load-once-then-join unpack is
    about 3x slower.)"""
    m2 = mask_n[:, None]
    if BITS == 4:
        byte = tl.load(row_ptr[:, None] + OFF + tl.arange(0, 32)[None, :], mask=m2, other=0).to(tl.int32)
        code = tl.reshape(tl.join(byte & 15, byte >> 4), [BLOCK_N, 64])  # dim 2j: low nibble, 2j+1: high
    else:
        p2 = tl.load(row_ptr[:, None] + OFF + tl.arange(0, 16)[None, :], mask=m2, other=0).to(tl.int32)
        # dim 4j + r = bits 2r..2r+1 of byte j; nested joins put field (2s + t) at [j, s, t]
        low = tl.reshape(tl.join(tl.join(p2 & 3, (p2 >> 4) & 3), tl.join((p2 >> 2) & 3, p2 >> 6)), [BLOCK_N, 64])
        p1 = tl.load(row_ptr[:, None] + OFF + 16 + tl.arange(0, 8)[None, :], mask=m2, other=0).to(tl.int32)
        # dim 8j + r = bit r of byte j; field (4a + 2b + c) lands at [j, a, b, c]
        high = tl.reshape(
            tl.join(tl.join(tl.join(p1 & 1, (p1 >> 4) & 1), tl.join((p1 >> 2) & 1, (p1 >> 6) & 1)),
                    tl.join(tl.join((p1 >> 1) & 1, (p1 >> 5) & 1), tl.join((p1 >> 3) & 1, (p1 >> 7) & 1))),
            [BLOCK_N, 64])
        code = low | (high << 2)
    return code


@triton.jit
def octave_levels(row_ptr, mask_n, OFF: tl.constexpr, BITS: tl.constexpr, BLOCK_N: tl.constexpr, LUT: tl.constexpr):
    """Levels [BLOCK_N, 64] of the block whose packed bytes start OFF bytes into each row: float32 from the select
    tree (LUT 0), or bf16 from PTX byte-permute lookups (NVIDIA only; levels_ptx.py), 3-bit blocks decoded from
    their packed planes (LUT 1) or from codes unpacked by Triton first (LUT 2, the earlier path)."""
    if LUT != 0:
        if BITS == 4:
            byte = tl.load(row_ptr[:, None] + OFF + tl.arange(0, 32)[None, :], mask=mask_n[:, None], other=0)
            x = levels_4bit_ptx(byte, BLOCK_N)
        elif LUT == 1:
            tl.static_assert(OFF % 8 == 0)  # with 8-byte aligned rows: the planes' word / halfword loads align
            x = levels_3bit_planes_ptx(row_ptr + OFF, mask_n, BLOCK_N)
        else:
            x = levels_3bit_ptx(codes_block(row_ptr, mask_n, OFF, 3, BLOCK_N))
    else:
        x = level_of(codes_block(row_ptr, mask_n, OFF, BITS, BLOCK_N), BITS)
    return x


@triton.jit
def kv_block(FMT: tl.constexpr, codes_ptr, row, mask_n, b: tl.constexpr, N4: tl.constexpr, BLOCK_N: tl.constexpr,
             LUT: tl.constexpr, I8_F16: tl.constexpr = 0, IS_K: tl.constexpr = False):
    """Unscaled values [BLOCK_N, 64] of block b (float32; bf16 for octave with LUT 1; fp16 for int8 with I8_F16).
    row: int64 [BLOCK_N] element offsets of the rows. FMT 0: plain float rows (bf16 planes, or extend's new K/V);
    1: int8 codes; 2: octave levels, where blocks 0..N4-1 are 4-bit (32 bytes) and the rest 3-bit (24 bytes).
    I8_F16 (int8): 0 float32 conversion; 1 fp16 by PTX on the loaded vectors; 2 the same for V, K's conversion
    left for Triton to place (after the shared-memory trip: int8_ptx.int8_to_f16_ptx)."""
    if FMT == 2:
        if b < N4:
            x = octave_levels(codes_ptr + row, mask_n, b * 32, 4, BLOCK_N, LUT)
        else:
            x = octave_levels(codes_ptr + row, mask_n, N4 * 32 + (b - N4) * 24, 3, BLOCK_N, LUT)
    elif FMT == 1 and I8_F16:
        offs = b * 64 + tl.arange(0, 64)
        x = int8_to_f16_ptx(tl.load(codes_ptr + row[:, None] + offs[None, :], mask=mask_n[:, None], other=0),
                            I8_F16 == 2 and IS_K)
    else:
        offs = b * 64 + tl.arange(0, 64)
        x = tl.load(codes_ptr + row[:, None] + offs[None, :], mask=mask_n[:, None], other=0).to(tl.float32)
    return x


@triton.jit
def kv_scale(FMT: tl.constexpr, scales_ptr, srow, mask_n, b: tl.constexpr):
    """float32 [BLOCK_N] scale of block b (int8: the row's scale; masked rows: 0). Not called for FMT 0."""
    if FMT == 2:
        s = tl.load(scales_ptr + srow + b, mask=mask_n, other=0.0).to(tl.float32)
    else:
        s = tl.load(scales_ptr + srow, mask=mask_n, other=0.0).to(tl.float32)
    return s


@triton.jit
def _dot(a, b, DOT_BF16: tl.constexpr):
    if DOT_BF16:
        r = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    else:
        r = tl.dot(a, b)
    return r


@triton.jit
def q_rows(x, KV_A: tl.constexpr):
    """A per-query-row vector broadcast over a [M, BLOCK_N] tile, or a [BLOCK_N, M] one with KV_A."""
    if KV_A:
        r = x[None, :]
    else:
        r = x[:, None]
    return r


@triton.jit
def token_cols(x, KV_A: tl.constexpr):
    """A per-token vector broadcast over a [M, BLOCK_N] tile, or a [BLOCK_N, M] one with KV_A."""
    if KV_A:
        r = x[:, None]
    else:
        r = x[None, :]
    return r


@triton.jit
def scores(FMT: tl.constexpr, q0, q1, q2, q3, codes_ptr, scales_ptr, row, srow, mask_n, N4: tl.constexpr,
           NB: tl.constexpr, M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_BF16: tl.constexpr,
           LUT: tl.constexpr, I8_F16: tl.constexpr = 0, KV_A: tl.constexpr = False):
    """q . k for a tile: float32 [M, BLOCK_N]. q0..q3: the query's 64-dim blocks [M, 64] (fp16 and scaled to
    |q| <= 1 per row for int8 with I8_F16: see q_blocks_f16). KV_A: transposed, K as the dots' first operand,
    k . q [BLOCK_N, M] from q blocks [64, M]: with M = 8 query rows (a GQA group of 8) the tensor-core tiles hold no
    padding rows, and the loop-invariant q is the second operand, 2 registers per 16 dims that no row padding
    duplicates (measured: launch_table.TRITON_LAUNCH's kv_a entries)."""
    if KV_A:
        qk = tl.zeros([BLOCK_N, M], dtype=tl.float32)
    else:
        qk = tl.zeros([M, BLOCK_N], dtype=tl.float32)
    for b in tl.static_range(NB):
        if b == 0:
            qb = q0
        elif b == 1:
            qb = q1
        elif b == 2:
            qb = q2
        else:
            qb = q3
        kb = kv_block(FMT, codes_ptr, row, mask_n, b, N4, BLOCK_N, LUT, I8_F16, True)
        if KV_A:
            x, y = kb, qb
        else:
            x, y = qb, tl.trans(kb)
        if FMT == 1 and I8_F16:
            part = tl.dot(x, y)
        else:
            part = _dot(x, y, DOT_BF16)
        if FMT == 2:
            part = part * token_cols(kv_scale(FMT, scales_ptr, srow, mask_n, b), KV_A)
        qk += part
    if FMT == 1:
        qk = qk * token_cols(kv_scale(FMT, scales_ptr, srow, mask_n, 0), KV_A)
    return qk


@triton.jit
def accumulate(FMT: tl.constexpr, p, acc0, acc1, acc2, acc3, codes_ptr, scales_ptr, row, srow, mask_n,
               N4: tl.constexpr, NB: tl.constexpr, BLOCK_N: tl.constexpr, DOT_BF16: tl.constexpr,
               LUT: tl.constexpr, I8_F16: tl.constexpr = 0, KV_A: tl.constexpr = False):
    """acc_b += p @ v_b for a tile; p float32 [M, BLOCK_N] (the V scales are folded into p's columns). int8
    with I8_F16: p's columns are scaled by scale / (the tile's largest scale), so the fp16 operand stays in
    [0, 1] whatever the scales' magnitude, and the tile's largest scale multiplies the dot's float32 result.
    KV_A: transposed, acc_b [64, M] += v_b^T @ p for p [BLOCK_N, M] (V as the first operand)."""
    tile_scale = 1.0
    if FMT == 1:
        vs = kv_scale(FMT, scales_ptr, srow, mask_n, 0)
        if I8_F16:
            tile_scale = tl.maximum(tl.max(vs, 0), 1e-30)
            p = (p * token_cols(vs / tile_scale, KV_A)).to(tl.float16)
        else:
            p = p * token_cols(vs, KV_A)
    for b in tl.static_range(NB):
        pb = p
        if FMT == 2:
            pb = p * token_cols(kv_scale(FMT, scales_ptr, srow, mask_n, b), KV_A)
        vb = kv_block(FMT, codes_ptr, row, mask_n, b, N4, BLOCK_N, LUT, I8_F16)
        if KV_A:
            x, y = tl.trans(vb), pb
        else:
            x, y = pb, vb
        if FMT == 1 and I8_F16:
            part = tl.dot(x, y) * tile_scale
        else:
            part = _dot(x, y, DOT_BF16)
        if b == 0:
            acc0 += part
        elif b == 1:
            acc1 += part
        elif b == 2:
            acc2 += part
        else:
            acc3 += part
    return acc0, acc1, acc2, acc3


@triton.jit
def load_q_blocks(ptr, rows, mask_rows, NB: tl.constexpr, DOT_BF16: tl.constexpr):
    """The 64-dim blocks of rows `rows` (int64 element offsets): bf16 when the dots take bf16 operands (cast
    once here, not per tile), else float32; blocks past NB repeat block 0."""
    offs = tl.arange(0, 64)
    m2 = mask_rows[:, None]
    ty = tl.bfloat16 if DOT_BF16 else tl.float32
    q0 = tl.load(ptr + rows[:, None] + offs[None, :], mask=m2, other=0.0).to(tl.float32).to(ty)
    q1 = q0
    q2 = q0
    q3 = q0
    if NB > 1:
        q1 = tl.load(ptr + rows[:, None] + 64 + offs[None, :], mask=m2, other=0.0).to(tl.float32).to(ty)
    if NB > 2:
        q2 = tl.load(ptr + rows[:, None] + 128 + offs[None, :], mask=m2, other=0.0).to(tl.float32).to(ty)
        q3 = tl.load(ptr + rows[:, None] + 192 + offs[None, :], mask=m2, other=0.0).to(tl.float32).to(ty)
    return q0, q1, q2, q3


@triton.jit
def q_blocks_f16(q0, q1, q2, q3, NB: tl.constexpr):
    """float32 q blocks -> (fp16 blocks divided by each row's absmax over the head, that absmax [M]): the fp16
    operands of the int8 dots (I8_F16), where fp16 holds the int8 codes exactly; |q| <= 1 cannot overflow."""
    amax = tl.max(tl.abs(q0), 1)
    if NB > 1:
        amax = tl.maximum(amax, tl.max(tl.abs(q1), 1))
    if NB > 2:
        amax = tl.maximum(amax, tl.maximum(tl.max(tl.abs(q2), 1), tl.max(tl.abs(q3), 1)))
    amax = tl.maximum(amax, 1e-30)
    inv = (1.0 / amax)[:, None]
    return (q0 * inv).to(tl.float16), (q1 * inv).to(tl.float16), (q2 * inv).to(tl.float16), \
        (q3 * inv).to(tl.float16), amax


@triton.jit
def store_blocks(ptr, rows, mask_rows, acc0, acc1, acc2, acc3, inv, NB: tl.constexpr):
    """Store acc_b * inv[:, None] to the rows' 64-dim blocks (cast to the pointer's dtype)."""
    offs = tl.arange(0, 64)
    m2 = mask_rows[:, None]
    ty = ptr.dtype.element_ty
    tl.store(ptr + rows[:, None] + offs[None, :], (acc0 * inv[:, None]).to(ty), mask=m2)
    if NB > 1:
        tl.store(ptr + rows[:, None] + 64 + offs[None, :], (acc1 * inv[:, None]).to(ty), mask=m2)
    if NB > 2:
        tl.store(ptr + rows[:, None] + 128 + offs[None, :], (acc2 * inv[:, None]).to(ty), mask=m2)
        tl.store(ptr + rows[:, None] + 192 + offs[None, :], (acc3 * inv[:, None]).to(ty), mask=m2)
