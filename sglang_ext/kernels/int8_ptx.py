"""int8 codes to fp16 in PTX by the magic-exponent trick (CUDA only), 4 codes per 32-bit register.

fp16 0x64XX is 1024 + XX for any byte XX (exponent 2^10, 10 mantissa bits), so with u = code ^ 0x80 = code + 128
(offset binary, 0..255), `prmt` places u under a 0x64 high byte and one f16x2 subtraction of 1152 (0x6480) gives
the code exactly: per 4 codes 1 xor, 2 prmt and 2 sub.f16x2, against a quarter-rate I2F per code (plus the byte
shuffles that feeding int8 into the dot's operand layout needs). Every int8 value (-128..127) is exact in fp16.
"""

from __future__ import annotations

import triton
import triton.language as tl

PTX_I8_F16: tl.constexpr = tl.constexpr("""{
    .reg .b32 u, a, b, k, m;
    mov.b32 k, 0x64646464;
    mov.b32 m, 0x64806480;
    xor.b32 u, $2, 0x80808080;
    prmt.b32 a, u, k, 0x5140;
    prmt.b32 b, u, k, 0x7362;
    sub.rn.f16x2 $0, a, m;
    sub.rn.f16x2 $1, b, m;
}""")


@triton.jit
def int8_to_f16_ptx(codes, PURE: tl.constexpr = False):
    """int8 tensor -> fp16 tensor of the same shape, exact. Impure (the default), Triton keeps the conversion where
    it is written, on the loaded vectors, before the tile's trip through shared memory into the dot-operand
    layout; pure, Triton may move it after that trip (the int8 tile goes through shared memory, half the bytes,
    and the conversion runs in the operand layout: cheap for K, whose operand pairs are contiguous codes)."""
    if PURE:
        x = tl.inline_asm_elementwise(PTX_I8_F16, "=r,=r,r", [codes], dtype=tl.float16, is_pure=True, pack=4)
    else:
        x = tl.inline_asm_elementwise(PTX_I8_F16, "=r,=r,r", [codes], dtype=tl.float16, is_pure=False, pack=4)
    return x
