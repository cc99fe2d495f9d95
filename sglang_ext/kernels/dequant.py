"""Dequantize the K/V of given slots (for fallbacks and debugging): planes + loc[N] -> (k, v) float32
[N, H, D] in the original basis. Reads only those slots."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..kvformats import KVFormat, rotation
from .checks import check_planes
from .decode import LUT_SELECT, attention_planes, layout
from .rotate import rotate_rows
from .tiles import kv_block, kv_scale


@triton.jit
def _dequant_kernel(codes, scales, loc_ptr, out_ptr, num_tokens, stride_c_slot, stride_c_head,
                    stride_s_slot, stride_s_head, stride_o_n, stride_o_h,
                    FMT: tl.constexpr, N4: tl.constexpr, NB: tl.constexpr, BLOCK_N: tl.constexpr,
                    LUT: tl.constexpr):
    head = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = rows < num_tokens
    slot = tl.load(loc_ptr + rows, mask=mask_n, other=0).to(tl.int64)
    row = slot * stride_c_slot + head * stride_c_head
    srow = slot * stride_s_slot + head * stride_s_head
    out_row = rows.to(tl.int64) * stride_o_n + head * stride_o_h  # LUT: the select tree (exact float32 levels)
    offs = tl.arange(0, 64)
    for b in tl.static_range(NB):
        x = kv_block(FMT, codes, row, mask_n, b, N4, BLOCK_N, LUT)
        if FMT != 0:
            x = x * kv_scale(FMT, scales, srow, mask_n, b)[:, None]
        tl.store(out_ptr + out_row[:, None] + b * 64 + offs[None, :], x, mask=mask_n[:, None])


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
                codes, scales, loc, out, n, codes.stride(0), codes.stride(1),
                scales.stride(0), scales.stride(1), out.stride(0), out.stride(1),
                FMT=kind, N4=n4, NB=d // 64, BLOCK_N=block_n, LUT=LUT_SELECT)
            if fmt.rotated:
                out = rotate_rows(out, torch.empty_like(out), tensor, True)
        result.append(out)
    return result[0], result[1]
