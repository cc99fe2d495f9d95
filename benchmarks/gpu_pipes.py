"""Per-SM throughput of the integer instructions the octave lookups are made of, on the GPU at hand: the rate of
the integer ALU pipe in docs/benchmarks/kernels.md's roofline ("Decode at the byte limit"). A few kernel launches:

    python3 benchmarks/gpu_pipes.py [SM_CLOCK_HZ]      # on the H200: 1.98e9

Each kernel runs 32 chained instructions of one kind (or two kinds alternating) per loop iteration, in 4-warp
programs, 16 programs per SM, 4096 iterations; printed: lane operations per clock per SM (the SM clock is the
argument: nvidia-smi's clocks.max.sm). ptxas keeps every instruction (checked in the SASS: 32 PRMT, 36 LOP3.LUT,
32 IMAD.HI.U32 per loop body).
"""

import sys

import torch
import triton
import triton.language as tl

N = 32  # instructions per loop iteration


def body(op: str) -> str:
    """N instructions of `op` on four registers ($0..$3), each reading the next; $4 a fifth operand."""
    regs = ["$0", "$1", "$2", "$3"]
    one = {"prmt": "prmt.b32 {x}, {x}, {y}, 0x6240;", "lop3": "lop3.b32 {x}, {x}, {y}, $4, 0x96;",
           "imadhi": "mul.hi.u32 {x}, {x}, {y};", "fmul": "mul.f32 {x}, {x}, {y};",
           "hfma2": "fma.rn.f16x2 {x}, {x}, {y}, $4;"}
    kinds = op.split("_")  # "prmt_imadhi": the two alternating
    lines = [one[kinds[i % len(kinds)]].format(x=regs[i % 4], y=regs[(i + 1) % 4]) for i in range(N)]
    return "{\n" + "\n".join(lines) + "\n}"


@triton.jit
def _chain(x_ptr, o_ptr, iters, ASM: tl.constexpr):
    offs = tl.program_id(0) * 128 + tl.arange(0, 128)
    a = tl.load(x_ptr + offs)
    b, c, d, e = a ^ 0x1234567, a + 77, a * 3, a | 5
    for _ in range(iters):
        a, b, c, d = tl.inline_asm_elementwise(ASM, "=r,=r,=r,=r,0,1,2,3,r", [a, b, c, d, e], dtype=(tl.int32,) * 4,
                                               is_pure=True, pack=1)
    tl.store(o_ptr + offs, a ^ b ^ c ^ d)


def main():
    clock = float(sys.argv[1]) if len(sys.argv) > 1 else 1.98e9
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    blocks, iters = sms * 16, 4096
    x = torch.randint(0, 2**30, (blocks * 128,), dtype=torch.int32, device="cuda")
    o = torch.empty_like(x)
    for op in ("prmt", "lop3", "imadhi", "prmt_imadhi", "prmt_lop3", "prmt_fmul", "hfma2"):
        asm = body(op)
        _chain[(blocks,)](x, o, iters, ASM=asm, num_warps=4)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(3):
            _chain[(blocks,)](x, o, iters, ASM=asm, num_warps=4)
        end.record()
        torch.cuda.synchronize()
        t = start.elapsed_time(end) / 3 * 1e-3
        lane_ops = blocks * 4 * iters * N * 32 / (t * clock * sms)
        print(f"{op:12s} {t * 1e6:9.1f} us  {lane_ops:6.1f} lane-ops/clk/SM ({lane_ops / 32:5.2f} warp-instr/clk/SM)",
              flush=True)


if __name__ == "__main__":
    main()
