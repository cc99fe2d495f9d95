"""The PTX level lookup (kernels/levels_ptx.py) runs only on NVIDIA GPUs; here its instruction text is executed
by a small emulator of the five PTX instructions it uses (mov, and, or, shr.u32, prmt default mode, lop3), over
every byte / code, against the bf16-rounded Lloyd-Max levels. On a GPU, test_attention's bf16-operand test and
benchmarks/kernels_check.py compare the kernels that use it with the torch reference."""

import torch

from sglang_ext.kernels import levels_ptx
from sglang_ext.kvformats.codebook import LEVELS

M32 = 0xFFFFFFFF


def _prmt(a: int, b: int, sel: int) -> int:
    src = (a & M32) | ((b & M32) << 32)
    out = 0
    for k in range(4):
        nib = (sel >> (4 * k)) & 15
        byte = (src >> (8 * (nib & 7))) & 0xFF
        if nib & 8:  # sign-replicate mode
            byte = 0xFF if byte & 0x80 else 0x00
        out |= byte << (8 * k)
    return out


def _lop3(a: int, b: int, c: int, lut: int) -> int:
    return sum(((lut >> ((((a >> i) & 1) << 2) | (((b >> i) & 1) << 1) | ((c >> i) & 1))) & 1) << i for i in range(32))


def _run(asm: str, inputs: list[int], num_out: int) -> list[int]:
    regs = {f"${num_out + i}": v for i, v in enumerate(inputs)}

    def val(x: str) -> int:
        return int(x, 0) if x[0].isdigit() else regs[x]

    for line in asm.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        a = [x.strip() for x in rest.split(",")]
        if op == "mov.b32":
            regs[a[0]] = val(a[1])
        elif op == "and.b32":
            regs[a[0]] = val(a[1]) & val(a[2])
        elif op == "or.b32":
            regs[a[0]] = val(a[1]) | val(a[2])
        elif op == "shr.u32":
            regs[a[0]] = (val(a[1]) & M32) >> val(a[2])
        elif op == "prmt.b32":
            regs[a[0]] = _prmt(val(a[1]), val(a[2]), val(a[3]))
        elif op == "lop3.b32":
            regs[a[0]] = _lop3(val(a[1]), val(a[2]), val(a[3]), val(a[4]))
        else:
            raise AssertionError(f"emulator does not know {op}")
    return [regs[f"${i}"] for i in range(num_out)]


def _bf16_bits(bits: int) -> list[int]:
    t = torch.tensor(LEVELS[bits], dtype=torch.float32).to(torch.bfloat16).view(torch.int16)
    return [int(x) & 0xFFFF for x in t]


def test_4bit_lookup_gives_every_byte_its_two_bf16_levels():
    want = _bf16_bits(4)
    asm = levels_ptx.PTX_4BIT.value
    for start in range(0, 256, 4):  # 4 bytes per register; every byte value in every position over the loop
        for rot in range(4):
            bs = [(start + (i + rot) % 4) for i in range(4)]
            outs = _run(asm, [sum(b << (8 * i) for i, b in enumerate(bs))], 4)
            for k, b in enumerate(bs):
                expect = want[b & 15] | (want[b >> 4] << 16)
                assert outs[k] == expect, f"byte {b:#04x} in lane {k}: {outs[k]:#010x} != {expect:#010x}"


def test_3bit_lookup_gives_every_code_its_bf16_level():
    want = _bf16_bits(3)
    asm = levels_ptx.PTX_3BIT.value
    for x in range(8 ** 4):
        codes = [(x >> (3 * i)) & 7 for i in range(4)]
        outs = _run(asm, [sum(c << (8 * i) for i, c in enumerate(codes))], 2)
        expect = [want[codes[0]] | (want[codes[1]] << 16), want[codes[2]] | (want[codes[3]] << 16)]
        assert outs == expect, f"codes {codes}: {[hex(o) for o in outs]} != {[hex(e) for e in expect]}"
