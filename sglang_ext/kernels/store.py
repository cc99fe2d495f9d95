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
from . import tables
from .checks import check_planes

# no FMA contraction: the reference rounds every product and every sum (see the module docstring)
STORE_COMPILE_OPTIONS = {"enable_fp_fusion": False}


@triton.jit
def _fwht64(u, BLOCK_N: tl.constexpr):
    # six perfect-shuffle stages: out[k] = u[2k] + u[2k+1], out[k + 32] = u[2k] - u[2k+1]
    for _ in tl.static_range(6):
        a, b = tl.split(tl.reshape(u, [BLOCK_N, 32, 2]))
        u = tl.reshape(tl.permute(tl.join(a + b, a - b), (0, 2, 1)), [BLOCK_N, 64])
    return u


@triton.jit
def _tree_sum64(x, BLOCK_N: tl.constexpr):
    # s = s[:32] + s[32:], s = s[:16] + s[16:], ... (kvformats.octave.tree_sum64)
    a, b = tl.split(tl.permute(tl.reshape(x, [BLOCK_N, 2, 32]), (0, 2, 1)))
    x = a + b
    a, b = tl.split(tl.permute(tl.reshape(x, [BLOCK_N, 2, 16]), (0, 2, 1)))
    x = a + b
    a, b = tl.split(tl.permute(tl.reshape(x, [BLOCK_N, 2, 8]), (0, 2, 1)))
    x = a + b
    a, b = tl.split(tl.permute(tl.reshape(x, [BLOCK_N, 2, 4]), (0, 2, 1)))
    x = a + b
    a, b = tl.split(tl.permute(tl.reshape(x, [BLOCK_N, 2, 2]), (0, 2, 1)))
    x = a + b
    a, b = tl.split(tl.reshape(x, [BLOCK_N, 2]))
    return a + b


@triton.jit
def _round_to_bf16(x):
    # float32 -> nearest bfloat16 (ties to even) done on the bits, so that the final cast is exact: the CPU
    # interpreter's cast truncates, a GPU's rounds; this way both match torch's .to(torch.bfloat16).
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _store_octave_block(x, code_row, scale_row, mask_n, sign_ptr, thr_ptr, level_ptr, b: tl.constexpr,
                        BITS: tl.constexpr, BLOCK_OFF: tl.constexpr, BLOCK_N: tl.constexpr):
    """Quantize one rotated 64-dim block per row and store its packed bytes and fp16 scale."""
    offs = tl.arange(0, 64)
    u = x * tl.load(sign_ptr + b * 64 + offs)[None, :]
    y = _fwht64(u, BLOCK_N) * 0.125
    norm2 = _tree_sum64(y * y, BLOCK_N)
    nonzero = norm2 > 0
    sigma = tl.where(nonzero, tl.sqrt_rn(norm2) * 0.125, 1.0)
    t = tl.div_rn(y, tl.broadcast_to(sigma[:, None], (BLOCK_N, 64)))
    if BITS == 4:
        NT: tl.constexpr = 15
        THR_OFF: tl.constexpr = 0
        LVL_OFF: tl.constexpr = 0
    else:
        NT: tl.constexpr = 7
        THR_OFF: tl.constexpr = 15
        LVL_OFF: tl.constexpr = 16
    code = tl.zeros([BLOCK_N, 64], dtype=tl.int32)
    for k in tl.static_range(NT):
        code += (t > tl.load(thr_ptr + THR_OFF + k)).to(tl.int32)
    dot = _tree_sum64(y * tl.load(level_ptr + LVL_OFF + code), BLOCK_N)
    scale = tl.where(nonzero, tl.div_rn(norm2, tl.where(nonzero, dot, 1.0)), 0.0)
    scale = tl.minimum(scale, 65504.0).to(tl.float16)
    tl.store(scale_row + b, scale, mask=mask_n)
    m2 = mask_n[:, None]
    if BITS == 4:
        nib = tl.arange(0, 2) * 4
        byte = tl.sum(tl.reshape(code, [BLOCK_N, 32, 2]) << nib[None, None, :], axis=2)
        tl.store(code_row[:, None] + BLOCK_OFF + tl.arange(0, 32)[None, :], byte.to(tl.uint8), mask=m2)
    else:
        sh2 = tl.arange(0, 4) * 2
        plane2 = tl.sum(tl.reshape(code & 3, [BLOCK_N, 16, 4]) << sh2[None, None, :], axis=2)
        tl.store(code_row[:, None] + BLOCK_OFF + tl.arange(0, 16)[None, :], plane2.to(tl.uint8), mask=m2)
        sh1 = tl.arange(0, 8)
        plane1 = tl.sum(tl.reshape(code >> 2, [BLOCK_N, 8, 8]) << sh1[None, None, :], axis=2)
        tl.store(code_row[:, None] + BLOCK_OFF + 16 + tl.arange(0, 8)[None, :], plane1.to(tl.uint8), mask=m2)


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
        offs = tl.arange(0, 64)
        for b in tl.static_range(NB):
            x = tl.load(x_ptr + x_row[:, None] + b * 64 + offs[None, :], mask=m2, other=0.0).to(tl.float32)
            if b < N4:
                _store_octave_block(x, code_row, scale_row, mask_n, sign_ptr, thr_ptr, level_ptr, b, 4, b * 32,
                                    BLOCK_N)
            else:
                _store_octave_block(x, code_row, scale_row, mask_n, sign_ptr, thr_ptr, level_ptr, b, 3,
                                    N4 * 32 + (b - N4) * 24, BLOCK_N)


def _store_one(fmt: KVFormat, x: torch.Tensor, loc: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor | None,
               tensor: int, bits: tuple[int, ...], block_n: int) -> None:
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
        FMT=kind, D=d, N4=n4, NB=nb, BLOCK_N=block_n, **STORE_COMPILE_OPTIONS)


def store_kv(fmt: KVFormat, planes: dict[str, torch.Tensor], loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             block_n: int = 16) -> None:
    """Quantize k, v [N, H_kv, D] and write them into planes[...][loc]. loc: int32/int64 [N] slot ids.
    Mutates planes in place; every byte of the N slots' rows is written."""
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
    if kind == tables.FMT_BF16:
        _store_one(fmt, k, loc, planes["k"], None, rotation.K_TENSOR, (), block_n)
        _store_one(fmt, v, loc, planes["v"], None, rotation.V_TENSOR, (), block_n)
        return
    k_bits = getattr(fmt, "k_bits", ())
    v_bits = getattr(fmt, "v_bits", ())
    _store_one(fmt, k, loc, planes["k_codes"], planes["k_scales"], rotation.K_TENSOR, k_bits, block_n)
    _store_one(fmt, v, loc, planes["v_codes"], planes["v_scales"], rotation.V_TENSOR, v_bits, block_n)
