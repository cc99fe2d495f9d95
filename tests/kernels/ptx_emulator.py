"""A small emulator of the PTX instructions our inline-asm helpers use (mov, and, or, xor, not, add.u32, sub.u32,
mul.hi.u32, mul.lo.u32, shr.u32, shl.b32, prmt in its default mode, lop3, sub.rn.f16x2), so their instruction text can be checked exhaustively on
the CPU."""

import torch

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


def run(asm: str, inputs: list[int], num_out: int) -> list[int]:
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
        elif op == "shl.b32":
            regs[a[0]] = (val(a[1]) << val(a[2])) & M32
        elif op == "prmt.b32":
            regs[a[0]] = _prmt(val(a[1]), val(a[2]), val(a[3]))
        elif op == "not.b32":
            regs[a[0]] = ~val(a[1]) & M32
        elif op == "sub.u32":
            regs[a[0]] = (val(a[1]) - val(a[2])) & M32
        elif op == "add.u32":
            regs[a[0]] = (val(a[1]) + val(a[2])) & M32
        elif op == "mul.lo.u32":
            regs[a[0]] = ((val(a[1]) & M32) * (val(a[2]) & M32)) & M32
        elif op == "mul.hi.u32":
            regs[a[0]] = ((val(a[1]) & M32) * (val(a[2]) & M32)) >> 32
        elif op == "xor.b32":
            regs[a[0]] = val(a[1]) ^ val(a[2])
        elif op == "sub.rn.f16x2":
            x = torch.tensor([val(a[1]) & 0xFFFF, val(a[1]) >> 16], dtype=torch.int32).to(torch.int16)
            y = torch.tensor([val(a[2]) & 0xFFFF, val(a[2]) >> 16], dtype=torch.int32).to(torch.int16)
            d = (x.view(torch.float16).double() - y.view(torch.float16).double()).to(torch.float16)
            lo, hi = (int(v) & 0xFFFF for v in d.view(torch.int16))
            regs[a[0]] = lo | (hi << 16)
        elif op == "lop3.b32":
            regs[a[0]] = _lop3(val(a[1]), val(a[2]), val(a[3]), val(a[4]))
        else:
            raise AssertionError(f"emulator does not know {op}")
    return [regs[f"${i}"] for i in range(num_out)]
