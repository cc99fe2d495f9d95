"""The lookup tables of the Gluon decode stage 1 as one int32 tensor per device, and their loads into every lane's
registers.

Layout of lut_tensor(device): mma_ptx.lut_words() (LUT_NAMES, LUT3_NAMES, LUT8_NAMES), LUT_LANE_ZEROS zero words,
the K rotation's signs of 4 blocks (float32 bit patterns, 64 a block: the octave kernel rotates q itself), then
mma_ptx.q8_lut_words().
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..kvformats import rotation
from .mma_ptx import lut_words, q8_lut_words


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


@gluon.jit
def _load_lut8(lut_ptr):
    """Q8_LUT_NAMES' words (lut_ptr[Q8_LUT_AT:]), per lane as _load_lut's."""
    z = (lut_ptr + LUT_ZEROS_AT).to(gl.int64, bitcast=True)
    t = lut_ptr + Q8_LUT_AT
    return (_per_lane(gl.load(t), z), _per_lane(gl.load(t + 1), z), _per_lane(gl.load(t + 2), z),
            _per_lane(gl.load(t + 3), z), _per_lane(gl.load(t + 4), z), _per_lane(gl.load(t + 5), z))


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
