"""Quantize-and-store: new K/V [N, H, D] (bf16 / fp16 / fp32) into the pool's planes at slots loc[N].

Bit-exact with the torch reference quantizer (kvformats) run on the CPU: the octave path evaluates the
rotation with the same butterfly order, every sum with the same pairwise-halves tree, and uses correctly
rounded division and square root (div_rn / sqrt_rn); the kernel is compiled with enable_fp_fusion=False so
that no multiply and add are contracted into one FMA (which rounds once instead of twice). Note that torch's
own CUDA quantizer is not the spec: it divides by a Python scalar as a multiply by its reciprocal
(int8's absmax / 127), which is not correctly rounded.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..kvformats import KVFormat, rotation
from . import launch_table, tables
from .checks import check_planes

# no FMA contraction: the reference rounds every product and every sum (see the module docstring)
STORE_COMPILE_OPTIONS = {"enable_fp_fusion": False}


def default_launch(fmt_name: str, head_dim: int) -> tuple[int, int]:
    """(tokens per program, warps) of the store: launch_table.STORE_LAUNCH's, else (16, 4)."""
    return launch_table.at(launch_table.STORE_LAUNCH, launch_table.ANY, fmt_name, head_dim, (16, 4))


@triton.jit
def _bits7(W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr, W3: tl.constexpr, W4: tl.constexpr,
           W5: tl.constexpr):
    """int32 [1, 2, 2, 2, 2, 2, 2]: sum of bit_k * W_k, where axis k + 1 holds bit 5 - k of a dim's index."""
    i = tl.arange(0, 2)
    return (i[None, :, None, None, None, None, None] * W0 + i[None, None, :, None, None, None, None] * W1
            + i[None, None, None, :, None, None, None] * W2 + i[None, None, None, None, :, None, None] * W3
            + i[None, None, None, None, None, :, None] * W4 + i[None, None, None, None, None, None, :] * W5)


@triton.jit
def _butterfly(u, AXIS: tl.constexpr, BIT: tl.constexpr):
    """One in-place Walsh-Hadamard stage along a size-2 axis: the element whose index bit is 0 gets a + b, the
    other a - b (a: bit 0, b: bit 1); both are sums of two terms, so every output is rounded once, exactly as
    rotation.fwht64's perfect-shuffle stage that combines the same pair."""
    sign = tl.where((_bits7(32, 16, 8, 4, 2, 1) & BIT) != 0, -1.0, 1.0)
    total = tl.sum(u, axis=AXIS, keep_dims=True)
    diff = tl.sum(u * sign, axis=AXIS, keep_dims=True)
    return tl.where((_bits7(32, 16, 8, 4, 2, 1) & BIT) == 0, total, diff)


@triton.jit
def _fwht64(u):
    """u [BLOCK_N, 2, 2, 2, 2, 2, 2] (axis k + 1 = bit 5 - k of the dim) -> H64 u, same layout and order.

    The in-place form (stride 1, 2, 4, ..., 32) combines the same pairs in the same order as the format's
    perfect-shuffle stages (bit 0 of the input index first), so each value is rounded identically; only where
    intermediates sit differs, and both end in natural order. Every stage is a reduction over one size-2 axis of
    one 7-d layout: no reshape or permute, which Triton 3.6 lowered to a layout replicated over the lanes
    (32x the work, 7.5 KB of stack per thread: 12 ms per 4096 tokens at d128 on an H200)."""
    u = _butterfly(u, 6, 1)
    u = _butterfly(u, 5, 2)
    u = _butterfly(u, 4, 4)
    u = _butterfly(u, 3, 8)
    u = _butterfly(u, 2, 16)
    u = _butterfly(u, 1, 32)
    return u


@triton.jit
def _tree_sum64(x):
    """x [BLOCK_N, 2, 2, 2, 2, 2, 2] -> [BLOCK_N]: s = s[:32] + s[32:], s = s[:16] + s[16:], ...
    (kvformats.octave.tree_sum64): bit 5 of the index first, each step a sum of two terms."""
    x = tl.sum(x, axis=1)
    x = tl.sum(x, axis=1)
    x = tl.sum(x, axis=1)
    x = tl.sum(x, axis=1)
    x = tl.sum(x, axis=1)
    return tl.sum(x, axis=1)


@triton.jit
def _bcast7(v):
    return v[:, None, None, None, None, None, None]


@triton.jit
def _round_to_bf16(x):
    # float32 -> nearest bfloat16 (ties to even) done on the bits, so that the final cast is exact: the CPU
    # interpreter's cast truncates, a GPU's rounds; this way both match torch's .to(torch.bfloat16).
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _store_octave_block(x, code_row, scale_row, mask_n, sign_ptr, thr_ptr, level_ptr, b: tl.constexpr,
                        BITS: tl.constexpr, BLOCK_OFF: tl.constexpr):
    """Quantize one rotated 64-dim block per row and store its packed bytes and fp16 scale.
    x: float32 [BLOCK_N, 2, 2, 2, 2, 2, 2] (axis k + 1 = bit 5 - k of the dim inside the block)."""
    dim = _bits7(32, 16, 8, 4, 2, 1)
    u = x * tl.load(sign_ptr + b * 64 + dim)
    y = _fwht64(u) * 0.125
    norm2 = _tree_sum64(y * y)
    nonzero = norm2 > 0
    sigma = tl.where(nonzero, tl.sqrt_rn(norm2) * 0.125, 1.0)
    t = tl.div_rn(y, tl.broadcast_to(_bcast7(sigma), y.shape))
    if BITS == 4:
        NT: tl.constexpr = 15
        THR_OFF: tl.constexpr = 0
        LVL_OFF: tl.constexpr = 0
    else:
        NT: tl.constexpr = 7
        THR_OFF: tl.constexpr = 15
        LVL_OFF: tl.constexpr = 16
    code = tl.zeros(y.shape, dtype=tl.int32)
    for k in tl.static_range(NT):
        code += (t > tl.load(thr_ptr + THR_OFF + k)).to(tl.int32)
    dot = _tree_sum64(y * tl.load(level_ptr + LVL_OFF + code))
    scale = tl.where(nonzero, tl.div_rn(norm2, tl.where(nonzero, dot, 1.0)), 0.0)
    scale = tl.minimum(scale, 65504.0).to(tl.float16)
    tl.store(scale_row + b, scale, mask=mask_n)
    # packing (packing.py): the fields of a byte are disjoint bit ranges, so their sum is their OR; a byte's
    # offset is reduced with max over the axes it does not depend on
    if BITS == 4:  # byte i // 2, odd dims in the high nibble: reduce over bit 0
        byte = tl.sum(code << _bits7(0, 0, 0, 0, 0, 4), axis=6)
        off = tl.max(_bits7(16, 8, 4, 2, 1, 0), axis=6)
        tl.store(code_row[:, None, None, None, None, None] + BLOCK_OFF + off, byte.to(tl.uint8),
                 mask=mask_n[:, None, None, None, None, None])
    else:  # a 2-bit plane (byte i // 4, bits 2 * (i % 4)), then a 1-bit plane (byte i // 8, bit i % 8)
        plane2 = tl.sum(tl.sum((code & 3) << _bits7(0, 0, 0, 0, 4, 2), axis=6), axis=5)
        off2 = tl.max(tl.max(_bits7(8, 4, 2, 1, 0, 0), axis=6), axis=5)
        tl.store(code_row[:, None, None, None, None] + BLOCK_OFF + off2, plane2.to(tl.uint8),
                 mask=mask_n[:, None, None, None, None])
        plane1 = tl.sum(tl.sum(tl.sum((code >> 2) << _bits7(0, 0, 0, 4, 2, 1), axis=6), axis=5), axis=4)
        off1 = tl.max(tl.max(tl.max(_bits7(4, 2, 1, 0, 0, 0), axis=6), axis=5), axis=4)
        tl.store(code_row[:, None, None, None] + BLOCK_OFF + 16 + off1, plane1.to(tl.uint8),
                 mask=mask_n[:, None, None, None])


@triton.jit
def _store_kernel(x_ptr, loc_ptr, codes_ptr, scales_ptr, sign_ptr, thr_ptr, level_ptr, num_tokens,
                  stride_x_n, stride_x_h, stride_c_slot, stride_c_head, stride_s_slot, stride_s_head,
                  FMT: tl.constexpr, D: tl.constexpr, N4: tl.constexpr, NB: tl.constexpr, BLOCK_N: tl.constexpr):
    head = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = rows < num_tokens
    slot = tl.load(loc_ptr + rows, mask=mask_n, other=0).to(tl.int64)
    x_row = rows.to(tl.int64) * stride_x_n + head * stride_x_h
    code_row = codes_ptr + slot * stride_c_slot + head * stride_c_head
    scale_row = scales_ptr + slot * stride_s_slot + head * stride_s_head
    m2 = mask_n[:, None]
    if FMT == 0:
        offs_d = tl.arange(0, D)
        x = tl.load(x_ptr + x_row[:, None] + offs_d[None, :], mask=m2, other=0.0).to(tl.float32)
        tl.store(code_row[:, None] + offs_d[None, :], _round_to_bf16(x).to(tl.bfloat16), mask=m2)
    elif FMT == 1:
        offs_d = tl.arange(0, D)
        x = tl.load(x_ptr + x_row[:, None] + offs_d[None, :], mask=m2, other=0.0).to(tl.float32)
        amax = tl.max(tl.abs(x), axis=1)
        scale = tl.div_rn(amax, tl.full([BLOCK_N], 127.0, tl.float32))
        safe = tl.where(amax > 0, scale, 1.0)
        r = tl.div_rn(x, tl.broadcast_to(safe[:, None], (BLOCK_N, D)))
        r = (r + 12582912.0) - 12582912.0  # round half to even (|r| <= 127 << 2**22), as torch.round
        r = tl.minimum(tl.maximum(r, -127.0), 127.0)
        tl.store(code_row[:, None] + offs_d[None, :], r.to(tl.int8), mask=m2)
        tl.store(scale_row, scale, mask=mask_n)
    else:
        dim = _bits7(32, 16, 8, 4, 2, 1)
        x_row7 = _bcast7(x_row)
        m7 = _bcast7(mask_n)
        for b in tl.static_range(NB):
            x = tl.load(x_ptr + x_row7 + b * 64 + dim, mask=m7, other=0.0).to(tl.float32)
            if b < N4:
                _store_octave_block(x, code_row, scale_row, mask_n, sign_ptr, thr_ptr, level_ptr, b, 4, b * 32)
            else:
                _store_octave_block(x, code_row, scale_row, mask_n, sign_ptr, thr_ptr, level_ptr, b, 3,
                                    N4 * 32 + (b - N4) * 24)


def _store_one(fmt: KVFormat, x: torch.Tensor, loc: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor | None,
               tensor: int, bits: tuple[int, ...], block_n: int, num_warps: int) -> None:
    kind = tables.format_kind(fmt)
    dev = x.device
    n, h, d = x.shape
    nb = d // 64
    n4 = tables.leading_4bit_blocks(bits) if kind == tables.FMT_OCTAVE else 0
    placeholder = tables.identity_placeholder(dev)
    scales_t = scales if scales is not None else placeholder
    _store_kernel[(triton.cdiv(n, block_n), h)](
        x, loc, codes, scales_t,
        tables.sign_table(tensor, nb, dev) if kind == tables.FMT_OCTAVE else placeholder,
        tables.threshold_table(dev), tables.level_table(dev), n,
        x.stride(0), x.stride(1), codes.stride(0), codes.stride(1),
        scales_t.stride(0) if scales is not None else 0, scales_t.stride(1) if scales is not None else 0,
        FMT=kind, D=d, N4=n4, NB=nb, BLOCK_N=block_n, num_warps=num_warps, **STORE_COMPILE_OPTIONS)


def store_kv(fmt: KVFormat, planes: dict[str, torch.Tensor], loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             block_n: int | None = None, num_warps: int | None = None) -> None:
    """Quantize k, v [N, H_kv, D] and write them into planes[...][loc]. loc: int32/int64 [N] slot ids.
    Mutates planes in place; every byte of the N slots' rows is written. block_n tokens per program and
    num_warps: None = default_launch's."""
    check_planes(fmt, planes)
    num_kv_heads = next(iter(planes.values())).shape[1]
    for name, t in (("k", k), ("v", v)):
        assert t.dim() == 3 and t.shape[1:] == (num_kv_heads, fmt.head_dim), f"{name}: {tuple(t.shape)}"
        assert t.dtype in (torch.bfloat16, torch.float16, torch.float32), f"{name}: dtype {t.dtype}"
        assert t.stride(-1) == 1, f"{name}: last dim must be contiguous"
    assert k.shape == v.shape, (k.shape, v.shape)
    assert loc.dim() == 1 and loc.shape[0] == k.shape[0], (loc.shape, k.shape)
    assert loc.dtype in (torch.int32, torch.int64), loc.dtype
    if k.shape[0] == 0:
        return
    kind = tables.format_kind(fmt)
    launch = default_launch(fmt.name, fmt.head_dim)
    block_n = block_n or launch[0]
    num_warps = num_warps or launch[1]
    if kind == tables.FMT_BF16:
        _store_one(fmt, k, loc, planes["k"], None, rotation.K_TENSOR, (), block_n, num_warps)
        _store_one(fmt, v, loc, planes["v"], None, rotation.V_TENSOR, (), block_n, num_warps)
        return
    k_bits = getattr(fmt, "k_bits", ())
    v_bits = getattr(fmt, "v_bits", ())
    _store_one(fmt, k, loc, planes["k_codes"], planes["k_scales"], rotation.K_TENSOR, k_bits, block_n, num_warps)
    _store_one(fmt, v, loc, planes["v_codes"], planes["v_scales"], rotation.V_TENSOR, v_bits, block_n, num_warps)
