"""What both Gluon decode stage-1 kernels (mma_octave, mma_int8) share: a program's split of the request, the slot
loads, reshapes of `mma.sync` fragments, the online softmax step, P's transpose for the second dot and the store
of the partial outputs (as decode._decode_stage2 reads them).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


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


PTX_MOVMATRIX_T: gl.constexpr = gl.constexpr("movmatrix.sync.aligned.m8n8.trans.b16 $0, $1;")


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
def _store_block(mid_o, o, inv, offs, h_ok, d0):
    om = gl.arange(0, 64, layout=gl.SliceLayout(1, o.type.layout))
    o_dim = d0 + 8 * (om & 7) + (om >> 3)  # row m = 8 j + g holds block dim 8 g + j
    gl.store(mid_o + offs[None, :] + o_dim[:, None], o * inv[None, :], mask=h_ok[None, :])


@gluon.jit
def _k_order(k):
    """The block dim a dot's contraction index k stands for (module docstring): 16 t + 8 c1 + 4 c0 + 2 h + e
    for k = 32 c1 + 16 c0 + 8 h + 2 t + e."""
    return 16 * ((k >> 1) & 3) + 8 * ((k >> 5) & 1) + 4 * ((k >> 4) & 1) + 2 * ((k >> 3) & 1) + (k & 1)


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
