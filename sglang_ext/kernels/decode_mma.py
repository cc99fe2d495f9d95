"""The Gluon decode stage 1 on NVIDIA GPUs: which kernel runs a call (the octave one, mma_octave, or the int8 one,
mma_int8), where it can run (supported), where the planner takes it by default (default_for) and its launch
(launch_stage1). Its output is the partial outputs and log-sum-exps of decode._decode_stage1, merged by its stage 2.

Scope (built and measured): octave_k3v4 and octave_k3v3 at head_dim 128 with full RoPE (K blocks 4-bit) and at
head_dim 256 with rotary_dim 64 (K blocks of 4, 3, 3, 3 bits), V blocks all 4-bit or all 3-bit; int8 at head_dim
64, 128 and 256 (layout_of). GQA groups of at most 8 q heads, one query token (q_len 1), NVIDIA GPUs with mma.sync
and movmatrix (sm_80 and later; measured on an H200 only).
"""

from __future__ import annotations

import torch

from . import launch_table
from .mma_int8 import _decode_stage1_mma_int8
from .mma_lut import lut_tensor
from .mma_octave import _decode_stage1_mma
from .mma_ptx import q8_table


def supported(fmt, group: int, q_len: int, info) -> str | None:
    """None when this kernel can run the call on the device `info` (device.DeviceInfo), else why not (the scope in
    the module docstring)."""
    from . import tables

    if tables.format_kind(fmt) not in (tables.FMT_OCTAVE, tables.FMT_INT8):
        return f"{fmt.name} is neither an octave format nor int8"
    if tables.format_kind(fmt) == tables.FMT_INT8:
        if layout_of(fmt) is None:
            return f"int8 at head_dim 64, 128 or 256 only (got {fmt.head_dim})"
    elif layout_of(fmt) is None:
        return (f"only octave_k3v4 / octave_k3v3 at head_dim 128 (4-bit K blocks) or 256 with rotary_dim 64 (K blocks "
                f"of 4, 3, 3, 3 bits), V blocks all 4-bit or all 3-bit (got {fmt.name} at head_dim {fmt.head_dim}, "
                f"K bits {fmt.k_bits}, V bits {fmt.v_bits})")
    if q_len != 1:
        return "only one query token per request"
    if group > 8:
        return f"GQA groups of at most 8 q heads (got {group})"
    if info.vendor != "cuda" or info.capability is None or info.capability[0] < 8:
        return "needs an NVIDIA GPU of compute capability 8.0 or later"
    if info.interpreted:
        return "Gluon kernels do not run under the Triton interpreter"
    return None


def layout_of(fmt) -> str | None:
    """"d128" / "d256" (octave, 4-bit V), "d128v3" / "d256v3" (octave, 3-bit V), "int8d64" / "int8d128" /
    "int8d256": the block layouts the kernels read; None for any other."""
    if not hasattr(fmt, "k_bits"):  # int8
        return f"int8d{fmt.head_dim}" if fmt.head_dim in (64, 128, 256) and fmt.name == "int8" else None
    k_bits = {128: (4, 4), 256: (4, 3, 3, 3)}.get(fmt.head_dim)
    if k_bits is None or fmt.k_bits != k_bits or len(set(fmt.v_bits)) != 1 or fmt.v_bits[0] not in (3, 4):
        return None
    return f"d{fmt.head_dim}" + ("v3" if fmt.v_bits[0] == 3 else "")


def default_for(fmt, group: int, q_len: int, info) -> bool:
    """Whether decode_attention takes this kernel when the caller does not choose: where it runs and was measured
    faster than decode._decode_stage1 (launch_table.MMA_DEFAULT). Where it compiles but was not run (sm_80 /
    sm_86: kernels.targets), stage1="mma" asks for it."""
    return (supported(fmt, group, q_len, info) is None
            and launch_table.lookup(launch_table.MMA_DEFAULT, info, fmt.name, fmt.head_dim, False))


def launch_stage1(grid, q_in, kc, ks, vc, vs, kv_indptr, kv_indices, num_kv_splits, mid_o, mid_lse, sm_scale,
                  group: int, block_n: int, min_block: int, split_mul: int = 1, warmup: bool = False,
                  qk8: bool = False, lazy: bool = False):
    """Launch (or, with warmup, only compile and return what the kernel's warmup returns: decode.resident_programs
    reads it): the int8 kernel for int8 code planes, else the octave one. Octave code planes are read as 32-bit
    words and a (token, head)'s two fp16 scales as one: rows and heads must start on 4-byte boundaries. int8 code
    rows are read as 128-bit words."""
    assert group <= 8, group
    assert block_n in (16, 32, 64), block_n
    d = q_in.shape[-1]
    d256 = d == 256
    if vc.dtype == torch.int8:  # int8: rows of whole 128-bit words (K's four-word loads), float32 scales
        assert kc.shape[-1] == d and vc.shape[-1] == d and d in (64, 128, 256), (kc.shape, vc.shape, d)
        assert all(t.stride(i) % 16 == 0 for t in (kc, vc) for i in (0, 1)), (kc.stride(), vc.stride())
        assert ks.dtype == torch.float32 and vs.dtype == torch.float32 and ks.stride(2) == 1 and vs.stride(2) == 1
        assert all(t.data_ptr() % 16 == 0 for t in (kc, vc))
        kernel, consts = _decode_stage1_mma_int8, {"NB": d // 64}
        wide = max(kc.numel(), vc.numel()) // 4 >= 2**31 or max(ks.numel(), vs.numel()) >= 2**31
    else:
        kernel, consts = _decode_stage1_mma, {"D256": d256, "V3": _octave_v3(vc, d)}
        if qk8:
            consts.update({"Q8": True, "STEP4": q8_table(4)[0], "STEP3": q8_table(3)[0]})
        if lazy:
            consts["LAZY"] = True
        wide = _octave_checks(kc, ks, vc, vs)
    args = (q_in, kc, ks, vc, vs, kv_indptr, kv_indices, num_kv_splits, mid_o, mid_lse, sm_scale,
            lut_tensor(q_in.device), kc.stride(0), kc.stride(1), ks.stride(0), ks.stride(1), vc.stride(0),
            vc.stride(1), vs.stride(0), vs.stride(1), q_in.stride(0), q_in.stride(1), mid_o.stride(0),
            mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1))
    consts.update({"GROUP": group, "BLOCK_N": block_n, "MIN_BLOCK": min_block, "WIDE": wide, "SPLIT_MUL": split_mul,
                   "num_warps": 1})
    if warmup:
        return kernel.warmup(*args, grid=(1,), **consts)
    kernel[grid](*args, **consts)


def _octave_v3(vc, d: int) -> bool:
    assert vc.shape[-1] in (d // 2, d * 3 // 8), (vc.shape, d)  # 4-bit or 3-bit V code rows
    return vc.shape[-1] == d * 3 // 8


def _octave_checks(kc, ks, vc, vs) -> bool:
    """The octave planes' alignment (launch_stage1's docstring); returns WIDE."""
    # rows of whole 64-bit words (K's two-word loads), scale pairs on 4-byte boundaries
    assert kc.stride(0) % 8 == 0 and kc.stride(1) % 8 == 0 and vc.stride(0) % 8 == 0 and vc.stride(1) % 8 == 0
    assert ks.stride(0) % 2 == 0 and ks.stride(1) % 2 == 0 and vs.stride(0) % 2 == 0 and vs.stride(1) % 2 == 0
    assert all(t.data_ptr() % 4 == 0 for t in (kc, ks, vc, vs))
    return max(kc.numel(), vc.numel()) // 4 >= 2**31 or max(ks.numel(), vs.numel()) // 2 >= 2**31
