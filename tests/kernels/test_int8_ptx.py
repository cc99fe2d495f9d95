"""The PTX int8 -> fp16 conversion (kernels/int8_ptx.py) runs only on NVIDIA GPUs; here its instruction text is
executed by the emulator over every int8 value in every byte position, against torch's exact conversion. On a
GPU, test_attention.py compares the int8 decode that uses it with the torch reference."""

import torch
from ptx_emulator import run

from sglang_ext.kernels import int8_ptx


def _f16_bits(x: int) -> int:
    return int(torch.tensor([x], dtype=torch.float16).view(torch.int16)[0]) & 0xFFFF


def test_every_int8_code_becomes_its_exact_fp16_value():
    asm = int8_ptx.PTX_I8_F16.value
    for start in range(-128, 128, 4):  # 4 codes per register; every value in every position over the loop
        for rot in range(4):
            codes = [start + (i + rot) % 4 for i in range(4)]
            word = sum((c & 0xFF) << (8 * i) for i, c in enumerate(codes))
            outs = run(asm, [word], 2)
            want = [_f16_bits(codes[0]) | (_f16_bits(codes[1]) << 16), _f16_bits(codes[2]) | (_f16_bits(codes[3]) << 16)]
            assert outs == want, f"codes {codes}: {[hex(o) for o in outs]} != {[hex(w) for w in want]}"
