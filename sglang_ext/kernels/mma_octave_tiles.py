"""The octave Gluon stage 1's tile: the words one loop iteration loads (each in the lanes that use it) and the
operand fragments looked up from them: bf16 levels for the bf16 dots, 7-bit grid integers for int8 scores (Q8).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .mma_fragments import _k_pairs, _levels8, _rows
from .mma_ptx import PTX_3BIT_2TOK, PTX_3BIT_PLANES, PTX_4BIT_1TOK, PTX_4BIT_2TOK, PTX_K3_Q8, PTX_K4_Q8


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


@gluon.jit
def _k_operand_a(words, lut, BLOCK_N: gl.constexpr, A_LAYOUT: gl.constexpr):
    """_k_operand's levels as the left operand: bf16 [BLOCK_N, 64], row = token, column k as there."""
    o0, o1, o2, o3 = gl.inline_asm_elementwise(PTX_4BIT_1TOK, "=r,=r,=r,=r,r,r,r,r,r,r",
                                               [words, lut[0], lut[1], lut[2], lut[3], lut[4]],
                                               dtype=(gl.int32,) * 4, is_pure=True, pack=1)
    return _k_pairs(o0, o1, o2, o3, BLOCK_N, A_LAYOUT, gl.bfloat16)


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
