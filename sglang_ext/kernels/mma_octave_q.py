"""q of the octave Gluon stage 1, rotated into the octave basis inside the kernel (a dot with H64 whose rows carry
the permuted K order): bf16 operands for bf16 scores, or two int8 parts and the accumulator bias for int8 scores
(Q8: the codebook's levels lie on a 7-bit integer grid, level = (u - 63.5) x step).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from .mma_fragments import _k_order


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
