"""Dequantize the K/V of given slots. Two launchers over one kernel, both reading only those slots:

- `dequantize_tokens` (fallbacks, debugging): float32 [N, H, D] in the original basis (un-rotated).
- `dequantize_rotated` (extend's prefix scratch, extend.py): into caller-given buffers of any float dtype
  (bf16 on a GPU), in the format's attention basis (octave: K's rotated basis for K, V's for V; what the
  attention kernels compute in), for a range of KV heads, with the row count optionally read on the device
  (kv_indptr[B]) so that no host sync is needed and padding past it in kv_indices is never read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..kvformats import KVFormat, rotation
from .checks import check_planes
from .decode import LUT_PTX, LUT_SELECT, attention_planes, layout
from .device import device_info
from .rotate import rotate_rows
from .tiles import kv_block, kv_scale

ROTATED_BLOCK_N = 64  # tokens per program of dequantize_rotated (one KV head, 64-dim blocks in turn)


@triton.jit
def _dequant_kernel(codes, scales, loc_ptr, out_ptr, num_tokens, limit_ptr, head_base, stride_c_slot, stride_c_head,
                    stride_s_slot, stride_s_head, stride_o_n, stride_o_h,
                    FMT: tl.constexpr, N4: tl.constexpr, NB: tl.constexpr, BLOCK_N: tl.constexpr,
                    LUT: tl.constexpr, LIMIT_FROM_PTR: tl.constexpr):
    # program (token block, head): out[rows, head] = values of KV head head_base + head at slots loc[rows], for
    # rows < num_tokens (and < *limit_ptr with LIMIT_FROM_PTR); stored in out's dtype
    head = tl.program_id(1)
    n = num_tokens
    if LIMIT_FROM_PTR:
        n = tl.minimum(n, tl.load(limit_ptr))
    if tl.program_id(0) * BLOCK_N < n:
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_n = rows < n
        slot = tl.load(loc_ptr + rows, mask=mask_n, other=0).to(tl.int64)
        src_head = (head_base + head).to(tl.int64)
        row = slot * stride_c_slot + src_head * stride_c_head
        srow = slot * stride_s_slot + src_head * stride_s_head
        out_row = rows.to(tl.int64) * stride_o_n + head * stride_o_h
        offs = tl.arange(0, 64)
        for b in tl.static_range(NB):
            x = kv_block(FMT, codes, row, mask_n, b, N4, BLOCK_N, LUT).to(tl.float32)
            if FMT != 0:
                x = x * kv_scale(FMT, scales, srow, mask_n, b)[:, None]
            tl.store(out_ptr + out_row[:, None] + b * 64 + offs[None, :], x.to(out_ptr.dtype.element_ty),
                     mask=mask_n[:, None])


def dequantize_tokens(fmt: KVFormat, planes: dict[str, torch.Tensor], loc: torch.Tensor,
                      block_n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """loc int32/int64 [N] -> (k, v) float32 [N, H, D], original (unrotated) basis."""
    check_planes(fmt, planes)
    assert loc.dim() == 1 and loc.dtype in (torch.int32, torch.int64), (loc.shape, loc.dtype)
    h = next(iter(planes.values())).shape[1]
    n, d, dev = loc.shape[0], fmt.head_dim, loc.device
    kind, k_n4, v_n4 = layout(fmt)
    kc, ks, vc, vs = attention_planes(fmt, planes)
    result = []
    for codes, scales, n4, tensor in ((kc, ks, k_n4, rotation.K_TENSOR), (vc, vs, v_n4, rotation.V_TENSOR)):
        out = torch.empty(n, h, d, dtype=torch.float32, device=dev)
        if n:
            _dequant_kernel[(triton.cdiv(n, block_n), h)](
                codes, scales, loc, out, n, loc, 0, codes.stride(0), codes.stride(1),
                scales.stride(0), scales.stride(1), out.stride(0), out.stride(1),
                FMT=kind, N4=n4, NB=d // 64, BLOCK_N=block_n, LUT=LUT_SELECT, LIMIT_FROM_PTR=False)
            if fmt.rotated:
                out = rotate_rows(out, torch.empty_like(out), tensor, True)
        result.append(out)
    return result[0], result[1]


def dequantize_rotated(fmt: KVFormat, planes: dict[str, torch.Tensor], loc: torch.Tensor, k_out: torch.Tensor,
                       v_out: torch.Tensor, head_base: int = 0, limit: torch.Tensor | None = None,
                       lut: int | None = None, block_n: int = ROTATED_BLOCK_N) -> None:
    """k_out / v_out [N, Hc, D] (float dtype, unit stride in D; N <= loc's length), row i <- the K / V of KV heads
    head_base .. head_base + Hc - 1 at slot loc[i], in the attention basis (not un-rotated), scales applied, cast
    to the buffers' dtype. limit: an int tensor whose first element (read on the device) caps the rows written
    (extend passes kv_indptr[B:]); rows from there on are neither read from loc nor written. lut: the octave
    level decode (None: the PTX lookup for bf16 buffers on an NVIDIA GPU, else the select tree)."""
    check_planes(fmt, planes)
    n, hc, d = k_out.shape
    assert v_out.shape == k_out.shape and d == fmt.head_dim, (k_out.shape, v_out.shape, fmt.head_dim)
    assert k_out.stride(-1) == 1 and v_out.stride(-1) == 1, (k_out.stride(), v_out.stride())
    assert loc.dim() == 1 and loc.shape[0] >= n and loc.dtype in (torch.int32, torch.int64), (loc.shape, loc.dtype)
    h = next(iter(planes.values())).shape[1]
    assert 0 <= head_base and head_base + hc <= h, (head_base, hc, h)
    if n == 0 or hc == 0:
        return
    kind, k_n4, v_n4 = layout(fmt)
    if lut is None:
        lut = LUT_PTX if k_out.dtype == torch.bfloat16 and device_info(k_out.device).nvidia else LUT_SELECT
    kc, ks, vc, vs = attention_planes(fmt, planes)
    for codes, scales, n4, out in ((kc, ks, k_n4, k_out), (vc, vs, v_n4, v_out)):
        _dequant_kernel[(triton.cdiv(n, block_n), hc)](
            codes, scales, loc, out, n, limit if limit is not None else loc, head_base, codes.stride(0),
            codes.stride(1), scales.stride(0), scales.stride(1), out.stride(0), out.stride(1),
            FMT=kind, N4=n4, NB=d // 64, BLOCK_N=block_n, LUT=lut, LIMIT_FROM_PTR=limit is not None)
