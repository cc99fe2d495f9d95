"""Octave decode stage 1 in Gluon: 3- and 4-bit levels looked up straight into the tensor cores' operand registers.

Why a second stage-1 kernel: the Triton one (decode._decode_stage1) decodes each K/V tile into a blocked layout,
and Triton moves the levels into the dots' operand layout through shared memory. On an H200 that loop issued
about 6.6 instructions per K/V element and stalled on those round trips. Here every layout is chosen (Gluon).
Each lane loads exactly the packed words whose levels it holds in its `mma.sync` fragments, and a PTX
byte-permute lookup writes the bf16 pairs the fragments are made of. No shared memory, one warp per program.

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

The lookups (mma_ptx) run on the integer ALU pipe (half rate on sm_80 and sm_90), which bounds the loop: shifts are
written as mul.hi so that ptxas issues them on the FMA pipe, and the tables are held per lane (mma_lut). Tile loads
and operand lookups are in mma_octave_tiles, q's rotation in mma_octave_q. Softmax denominators stay per (token row,
head) until the end.

Int8 scores (Q8; launch_table.MMA_QK8: the default at head_dim 128): the codebook's levels lie on a 7-bit integer grid
(kvformats/codebook.py), so K's codes are looked up as bytes u (level = (u - 63.5) x step, exactly) straight into
the operand of an int8 m16n8k32 dot; q, rotated in float32, goes in as two int8 parts hi + lo / 256, the lo dot
feeding the hi dot's accumulator (mma_octave_q._q8_scores). Half the lookups of the bf16 pairs: 5 % faster at batch
8 x 32k on an H200 (d128), with the error of bf16 scores or less (2.6e-3 to 3.3e-3 relative to the format's
reference in tests/kernels/test_decode_mma.py, against 3.7e-3 to 4.8e-3). At head_dim 256 the four blocks' q
operands take 255 registers and the kernel is slower at batch 1, so bf16 scores stay its default. LAZY
(launch_table.MMA_LAZY, exact arithmetic): the running maximum moves only when a tile exceeds it by 2^8, so most tiles
skip rescaling the outputs (_step).

The launch, the scope and the default choice are in decode_mma; the int8 kernel of the same structure in
mma_int8.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from .mma_fragments import LOG2E, _program_split, _slots, _softmax_step, _store_partials, _transpose_p
from .mma_lut import K_SIGNS_AT, _load_lut, _load_lut3, _load_lut8
from .mma_octave_q import _hadamard_a, _hadamard_q8, _q8_operand, _q8_scores, _rotated_q, _rotated_q32
from .mma_octave_tiles import (_k3_operand_a, _k3q8_operand_a, _k4q8_operand_a, _k_operand_a, _load_tile, _scale_pair,
    _v_block)


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
            # that copy waits for the loads (15 % of the stall samples); unrolled by two the copies go,
            # but the time did not improve (d128 160 vs 161 us, d256 182 vs 163 at batch 8 x 32k).
            tile = _load_tile(_slots(idx, n0 + BLOCK_N, s1, kn, vn, cn), n0 + BLOCK_N, s1, cn, kc_w, vc_w, ks_w, vs_w,
                              stride_kc_slot // 4, vc_stride, stride_ks_slot // 2, stride_vs_slot // 2, K_WORDS,
                              K3_WORDS, V_WORDS, D256, V3, WIDE)
            m_i, l_acc, o = _step(cur, n0, s1, cn, lut, lut3, q, m_i, l_acc, o, BLOCK_N, MMA, A_OP, B_OP, D256, V3,
                                  lut8, qb, qs, Q8, STEP4, STEP3, LAZY, ql)

        _store_partials(mid_o, mid_lse, o, m_i, l_acc, batch, kv_head, split, stride_mo_b, stride_mo_h, stride_mo_s,
                        stride_ml_b, stride_ml_h, GROUP, HEADS)
