"""int8 decode stage 1 in Gluon (_decode_stage1_mma_int8): mma_octave's structure with f16 operands. A code becomes
one by the exponent-byte conversion (mma_ptx.PTX_INT8_1TOK / PTX_INT8_2TOK), with no lookup; one scale per token
for all of K's blocks (applied to the scores) and all of V's (applied to P once). head_dim 64, 128 or 256.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from .mma_fragments import (LOG2E, _k_pairs, _levels8, _program_split, _q_operand_offsets, _rows, _slots,
    _softmax_step, _store_partials, _transpose_p)
from .mma_lut import LUT_ZEROS_AT, _per_lane
from .mma_ptx import PTX_INT8_1TOK, PTX_INT8_2TOK


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
