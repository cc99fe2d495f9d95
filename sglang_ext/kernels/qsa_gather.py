"""Selected-slot K/V gathers of qwen4_exp's QSA sparse attention on a GPU, reading a compressed KV layer.

SGLang's GPU sparse attention never reads the pool in place: it first packs the K/V rows a batch needs into
model-dtype buffers, then runs its dense kernels on those. These are the two packers, with the same contracts,
reading a layer's planes (int8 codes + per-row scales) and writing the dequantized values, cast to the buffers'
dtype:

- `gather_selected_kv` (decode / verify; SGLang's `qwen_sparse_kv_extraction_compact_triton`): the slots each
  query row selected, packed at `cu_k[b]`, compact or page-strided with zero fill. One launch, no host sync,
  sizes from its arguments only (it runs inside CUDA graphs).
- `pack_prefill_kv` (extend with a cached prefix; SGLang's `pack_qsa_prefill_kv`): every token of each
  request's context, packed back to back.

Formats whose stored K/V are in a rotated basis (octave) are not served here: SGLang's kernels compute q . k with
plain q, so the packed rows must be plain values.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..kvformats import KVFormat
from .checks import check_planes
from .decode import LUT_SELECT, attention_planes, layout
from .dequant import dequantize_rotated
from .tiles import kv_block, kv_scale

GATHER_BLOCK_N = 16  # selected columns per program (one KV head, 64-dim blocks in turn)


def check_gather_format(fmt: KVFormat) -> None:
    if fmt.rotated:
        raise NotImplementedError(
            f"{fmt.name}: QSA's GPU K/V gathers need plain values; this format stores K/V in a rotated basis")


@triton.jit
def _gather_selected_kernel(k_codes, k_scales, v_codes, v_scales, req_to_token, req_indices, indices, seq_lens, cu_k,
                            out_k, out_v, topk, pad_cols, req_stride, idx_stride,
                            stride_kc_slot, stride_kc_head, stride_ks_slot, stride_ks_head,
                            stride_vc_slot, stride_vc_head, stride_vs_slot, stride_vs_head,
                            stride_ok_n, stride_ok_h, stride_ov_n, stride_ov_h,
                            FMT: tl.constexpr, K_N4: tl.constexpr, V_N4: tl.constexpr, NB: tl.constexpr,
                            BLOCK_N: tl.constexpr, LUT: tl.constexpr, ZERO_FILL: tl.constexpr):
    # program (request row, KV head, column block): SGLang's _compact_kv with the rows read from the planes
    batch, head, block = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    cols = block * BLOCK_N + tl.arange(0, BLOCK_N)
    length = tl.load(seq_lens + batch)
    req = tl.load(req_indices + batch).to(tl.int64)
    pack_start = tl.load(cu_k + batch)
    valid_count = tl.load(cu_k + batch + 1) - pack_start
    positions = tl.load(indices + batch * idx_stride + cols, mask=cols < topk, other=-1)
    valid = (cols < valid_count) & (positions >= 0) & (positions < length)
    slot = tl.load(req_to_token + req * req_stride + tl.where(valid, positions, 0), mask=valid, other=0).to(tl.int64)
    if ZERO_FILL:
        store_mask = cols < pad_cols  # the page-aligned stride: zeros past the valid rows
    else:
        store_mask = valid
    head64 = head.to(tl.int64)
    dst = (pack_start + cols).to(tl.int64)
    offs = tl.arange(0, 64)
    k_row = slot * stride_kc_slot + head64 * stride_kc_head
    k_srow = slot * stride_ks_slot + head64 * stride_ks_head
    v_row = slot * stride_vc_slot + head64 * stride_vc_head
    v_srow = slot * stride_vs_slot + head64 * stride_vs_head
    k_dst = dst * stride_ok_n + head64 * stride_ok_h
    v_dst = dst * stride_ov_n + head64 * stride_ov_h
    for b in tl.static_range(NB):
        xk = kv_block(FMT, k_codes, k_row, valid, b, K_N4, BLOCK_N, LUT).to(tl.float32)
        xv = kv_block(FMT, v_codes, v_row, valid, b, V_N4, BLOCK_N, LUT).to(tl.float32)
        if FMT != 0:
            xk = xk * kv_scale(FMT, k_scales, k_srow, valid, b)[:, None]
            xv = xv * kv_scale(FMT, v_scales, v_srow, valid, b)[:, None]
        xk = tl.where(valid[:, None], xk, 0.0)
        xv = tl.where(valid[:, None], xv, 0.0)
        tl.store(out_k + k_dst[:, None] + b * 64 + offs[None, :], xk.to(out_k.dtype.element_ty),
                 mask=store_mask[:, None])
        tl.store(out_v + v_dst[:, None] + b * 64 + offs[None, :], xv.to(out_v.dtype.element_ty),
                 mask=store_mask[:, None])


def gather_selected_kv(fmt: KVFormat, planes: dict[str, torch.Tensor], req_to_token: torch.Tensor,
                       req_indices: torch.Tensor, indices: torch.Tensor, seq_lens: torch.Tensor, cu_k: torch.Tensor,
                       out_k: torch.Tensor, out_v: torch.Tensor, batch: int, topk: int,
                       zero_fill_cols: int = 0) -> None:
    """SGLang's `qwen_sparse_kv_extraction_compact_triton` on a compressed layer.

    Row b (request req_to_token[req_indices[b]], length seq_lens[b]) selected the logical positions
    indices[b, :topk] (-1 = none; valid entries first). Column c < cu_k[b+1] - cu_k[b] whose position is in
    [0, length) writes out_k / out_v [cu_k[b] + c, head] with the K / V stored at that position's slot. With
    zero_fill_cols > 0 the columns [0, zero_fill_cols) of each row are all written, zeros where not valid;
    otherwise only valid columns are written. out_k / out_v: [rows, kv_heads, head_dim], any float dtype,
    unit stride in head_dim."""
    check_planes(fmt, planes)
    check_gather_format(fmt)
    heads = next(iter(planes.values())).shape[1]
    d = fmt.head_dim
    assert out_k.shape[1:] == (heads, d) and out_v.shape[1:] == (heads, d), (out_k.shape, out_v.shape, heads, d)
    assert out_k.stride(-1) == 1 and out_v.stride(-1) == 1, (out_k.stride(), out_v.stride())
    num_cols = zero_fill_cols if zero_fill_cols > 0 else topk
    if batch == 0 or num_cols == 0:
        return
    kind, k_n4, v_n4 = layout(fmt)
    kc, ks, vc, vs = attention_planes(fmt, planes)
    _gather_selected_kernel[(batch, heads, triton.cdiv(num_cols, GATHER_BLOCK_N))](
        kc, ks, vc, vs, req_to_token, req_indices, indices, seq_lens, cu_k, out_k, out_v, topk, num_cols,
        req_to_token.stride(0), indices.stride(0),
        kc.stride(0), kc.stride(1), ks.stride(0), ks.stride(1), vc.stride(0), vc.stride(1), vs.stride(0), vs.stride(1),
        out_k.stride(0), out_k.stride(1), out_v.stride(0), out_v.stride(1),
        FMT=kind, K_N4=k_n4, V_N4=v_n4, NB=d // 64, BLOCK_N=GATHER_BLOCK_N, LUT=LUT_SELECT,
        ZERO_FILL=zero_fill_cols > 0)


def prefill_slots(req_to_token: torch.Tensor, req_indices: torch.Tensor, cu_k: torch.Tensor,
                  total_k: int) -> torch.Tensor:
    """int64 [total_k]: row cu_k[b] + t is req_to_token[req_indices[b], t] (no host sync)."""
    dev = req_to_token.device
    cu = cu_k.to(device=dev, dtype=torch.long)
    lens = cu[1:] - cu[:-1]
    batch_of = torch.repeat_interleave(torch.arange(lens.numel(), device=dev), lens, output_size=total_k)
    pos = torch.arange(total_k, device=dev) - cu[:-1][batch_of]
    return req_to_token[req_indices.to(device=dev, dtype=torch.long)[batch_of], pos].long()


def pack_prefill_kv(fmt: KVFormat, planes: dict[str, torch.Tensor], req_to_token: torch.Tensor,
                    req_indices: torch.Tensor, cu_k: torch.Tensor, total_k: int,
                    output_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's `pack_qsa_prefill_kv` on a compressed layer: (packed_k, packed_v) [total_k, kv_heads, head_dim]
    in output_dtype, row cu_k[b] + t the K / V of request req_indices[b]'s token t."""
    check_planes(fmt, planes)
    check_gather_format(fmt)
    heads = next(iter(planes.values())).shape[1]
    dev = next(iter(planes.values())).device
    packed_k = torch.empty((total_k, heads, fmt.head_dim), dtype=output_dtype, device=dev)
    packed_v = torch.empty_like(packed_k)
    if total_k:
        slots = prefill_slots(req_to_token, req_indices, cu_k, total_k)
        dequantize_rotated(fmt, planes, slots, packed_k, packed_v, lut=LUT_SELECT)  # not rotated: plain values
    return packed_k, packed_v
