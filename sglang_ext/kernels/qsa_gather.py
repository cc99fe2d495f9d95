"""Selected-slot K/V gathers of qwen4_exp's QSA sparse attention on a GPU, reading a compressed KV layer.

SGLang's GPU sparse attention never reads the pool in place: it first packs the K/V rows a batch needs into
model-dtype buffers, then runs its dense kernels on those, computing q . k with plain q. These are the two
packers, with the same contracts, reading a layer's planes and writing the stored K/V as plain values, cast to
the buffers' dtype:

- `gather_selected_kv` (decode / verify; SGLang's `qwen_sparse_kv_extraction_compact_triton`): the slots each
  query row selected, packed at `cu_k[b]`, compact or page-strided with zero fill. One launch, no host sync,
  sizes from its arguments only (it runs inside CUDA graphs).
- `pack_prefill_kv` (extend with a cached prefix; SGLang's `pack_qsa_prefill_kv`): every token of each
  request's context, packed back to back (`dequantize_plain` at the context's slots, also what the no-prefix
  extend hands SGLang for the K/V it just stored).

int8: codes times the row's scale. octave (K/V stored in a rotated basis, kvformats/rotation.py): each 64-dim
block is dequantized in the rotated basis (Lloyd-Max level times the block's scale) and un-rotated in the same
kernel, x = R^T y = diag(signs) H64 y / 8. R is a signed Walsh-Hadamard transform, so un-rotating costs six
butterfly stages of adds (384 per block, as the store kernel's rotation) instead of a 64 x 64 float32 matmul
(4096 multiply-adds) or a second launch through a scratch buffer; and the
butterflies are the reference's own evaluation order (`rotation.unrotate`: the same pairs summed in the same
order, then the exact 0.125 and sign products), so the values are bit-exact with `fmt.dequantize` before the
cast to the buffers' dtype. The kernels are compiled without FMA contraction, which would fuse the scale product
into the first butterfly add (one rounding instead of two). As in the store kernel, a block lives in a 7-d
[rows, 2, 2, 2, 2, 2, 2] layout from its load on (each code read from its byte): no reshape or permute.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..kvformats import KVFormat, rotation
from . import tables
from .checks import check_planes
from .decode import LUT_SELECT, attention_planes, layout
from .dequant import dequantize_rotated
from .store import _bcast7, _bits7
from .tiles import kv_block, kv_scale, level_of

GATHER_BLOCK_N = 16  # selected columns per program (one KV head, 64-dim blocks in turn)
PLAIN_BLOCK_N = 32  # slots per program of dequantize_plain's octave kernel
# no FMA contraction: the octave un-rotation must round like rotation.unrotate (module docstring)
GATHER_COMPILE_OPTIONS = {"enable_fp_fusion": False}


@triton.jit
def _butterfly(u, odd, AXIS: tl.constexpr):
    """One Walsh-Hadamard stage along a size-2 axis (store.py's `_butterfly`, with the dims' parity precomputed):
    the element whose index bit is 0 gets a + b, the other a - b, each one rounding, as rotation.fwht64."""
    total = tl.sum(u, axis=AXIS, keep_dims=True)
    diff = tl.sum(tl.where(odd, -u, u), axis=AXIS, keep_dims=True)
    return tl.where(odd, diff, total)


@triton.jit
def _octave_plain_block(codes, scales, sign_ptr, row, srow, valid, dim, b: tl.constexpr, N4: tl.constexpr):
    """Block b of each row in the original basis: float32 [BLOCK_N, 2, 2, 2, 2, 2, 2] (axis k + 1 = bit 5 - k of
    the dim inside the block; dim = that index, _bits7(32, 16, 8, 4, 2, 1)), 0 where not valid. row / srow:
    int64 [BLOCK_N] element offsets of the rows' codes / scales; blocks 0..N4-1 are 4-bit (32 bytes), the rest
    3-bit (24 bytes), packed as packing.py says."""
    row7 = _bcast7(row)
    m7 = _bcast7(valid)
    if b < N4:  # byte i // 2, odd dims in the high nibble
        byte = tl.load(codes + row7 + b * 32 + (dim >> 1), mask=m7, other=0).to(tl.int32)
        y = level_of((byte >> ((dim & 1) * 4)) & 15, 4)
    else:  # a 2-bit plane (byte i // 4, bits 2 * (i % 4)), then a 1-bit plane (byte 16 + i // 8, bit i % 8)
        off = N4 * 32 + (b - N4) * 24
        p2 = tl.load(codes + row7 + off + (dim >> 2), mask=m7, other=0).to(tl.int32)
        p1 = tl.load(codes + row7 + off + 16 + (dim >> 3), mask=m7, other=0).to(tl.int32)
        y = level_of(((p2 >> ((dim & 3) * 2)) & 3) | (((p1 >> (dim & 7)) & 1) << 2), 3)
    y = y * _bcast7(tl.load(scales + srow + b, mask=valid, other=0.0).to(tl.float32))  # rotated basis
    # R^T y = diag(signs) H64 y / 8: rotation.fwht64's pairs in its order (bit 0 of the index first)
    y = _butterfly(y, (dim & 1) != 0, 6)
    y = _butterfly(y, (dim & 2) != 0, 5)
    y = _butterfly(y, (dim & 4) != 0, 4)
    y = _butterfly(y, (dim & 8) != 0, 3)
    y = _butterfly(y, (dim & 16) != 0, 2)
    y = _butterfly(y, (dim & 32) != 0, 1)
    x = y * 0.125 * tl.load(sign_ptr + b * 64 + dim)
    return tl.where(m7, x, 0.0)


@triton.jit
def _gather_selected_kernel(k_codes, k_scales, v_codes, v_scales, k_signs, v_signs, req_to_token, req_indices,
                            indices, seq_lens, cu_k, out_k, out_v, topk, pad_cols, req_stride, idx_stride,
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
    k_row = slot * stride_kc_slot + head64 * stride_kc_head
    k_srow = slot * stride_ks_slot + head64 * stride_ks_head
    v_row = slot * stride_vc_slot + head64 * stride_vc_head
    v_srow = slot * stride_vs_slot + head64 * stride_vs_head
    k_dst = dst * stride_ok_n + head64 * stride_ok_h
    v_dst = dst * stride_ov_n + head64 * stride_ov_h
    if FMT == 2:
        dim = _bits7(32, 16, 8, 4, 2, 1)
        m7 = _bcast7(store_mask)
        for b in tl.static_range(NB):
            xk = _octave_plain_block(k_codes, k_scales, k_signs, k_row, k_srow, valid, dim, b, K_N4)
            xv = _octave_plain_block(v_codes, v_scales, v_signs, v_row, v_srow, valid, dim, b, V_N4)
            tl.store(out_k + _bcast7(k_dst) + b * 64 + dim, xk.to(out_k.dtype.element_ty), mask=m7)
            tl.store(out_v + _bcast7(v_dst) + b * 64 + dim, xv.to(out_v.dtype.element_ty), mask=m7)
    else:
        offs = tl.arange(0, 64)
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


@triton.jit
def _octave_plain_kernel(k_codes, k_scales, v_codes, v_scales, k_signs, v_signs, loc_ptr, out_k, out_v, num_rows,
                         stride_kc_slot, stride_kc_head, stride_ks_slot, stride_ks_head,
                         stride_vc_slot, stride_vc_head, stride_vs_slot, stride_vs_head,
                         stride_ok_n, stride_ok_h, stride_ov_n, stride_ov_h,
                         K_N4: tl.constexpr, V_N4: tl.constexpr, NB: tl.constexpr, BLOCK_N: tl.constexpr):
    # program (row block, KV head): out_k / out_v [rows, head] = the plain K / V at slots loc[rows]
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    head = tl.program_id(1).to(tl.int64)
    valid = rows < num_rows
    slot = tl.load(loc_ptr + rows, mask=valid, other=0).to(tl.int64)
    rows64 = rows.to(tl.int64)
    k_dst = _bcast7(rows64 * stride_ok_n + head * stride_ok_h)
    v_dst = _bcast7(rows64 * stride_ov_n + head * stride_ov_h)
    dim = _bits7(32, 16, 8, 4, 2, 1)
    m7 = _bcast7(valid)
    for b in tl.static_range(NB):
        xk = _octave_plain_block(k_codes, k_scales, k_signs, slot * stride_kc_slot + head * stride_kc_head,
                                 slot * stride_ks_slot + head * stride_ks_head, valid, dim, b, K_N4)
        xv = _octave_plain_block(v_codes, v_scales, v_signs, slot * stride_vc_slot + head * stride_vc_head,
                                 slot * stride_vs_slot + head * stride_vs_head, valid, dim, b, V_N4)
        tl.store(out_k + k_dst + b * 64 + dim, xk.to(out_k.dtype.element_ty), mask=m7)
        tl.store(out_v + v_dst + b * 64 + dim, xv.to(out_v.dtype.element_ty), mask=m7)


def _sign_tables(fmt: KVFormat, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(K signs, V signs) float32 [NB, 64] for octave (cached per device: no copy inside a CUDA graph once
    warm), a placeholder otherwise."""
    if tables.format_kind(fmt) != tables.FMT_OCTAVE:
        ph = tables.identity_placeholder(device)
        return ph, ph
    nb = fmt.head_dim // 64
    return tables.sign_table(rotation.K_TENSOR, nb, device), tables.sign_table(rotation.V_TENSOR, nb, device)


def _check_out(fmt: KVFormat, heads: int, out_k: torch.Tensor, out_v: torch.Tensor) -> None:
    d = fmt.head_dim
    assert out_k.shape[1:] == (heads, d) and out_v.shape[1:] == (heads, d), (out_k.shape, out_v.shape, heads, d)
    assert out_k.stride(-1) == 1 and out_v.stride(-1) == 1, (out_k.stride(), out_v.stride())


def gather_selected_kv(fmt: KVFormat, planes: dict[str, torch.Tensor], req_to_token: torch.Tensor,
                       req_indices: torch.Tensor, indices: torch.Tensor, seq_lens: torch.Tensor, cu_k: torch.Tensor,
                       out_k: torch.Tensor, out_v: torch.Tensor, batch: int, topk: int,
                       zero_fill_cols: int = 0) -> None:
    """SGLang's `qwen_sparse_kv_extraction_compact_triton` on a compressed layer.

    Row b (request req_to_token[req_indices[b]], length seq_lens[b]) selected the logical positions
    indices[b, :topk] (-1 = none; valid entries first). Column c < cu_k[b+1] - cu_k[b] whose position is in
    [0, length) writes out_k / out_v [cu_k[b] + c, head] with the K / V stored at that position's slot, as plain
    values (octave: un-rotated). With zero_fill_cols > 0 the columns [0, zero_fill_cols) of each row are all
    written, zeros where not valid; otherwise only valid columns are written. out_k / out_v: [rows, kv_heads,
    head_dim], any float dtype, unit stride in head_dim."""
    check_planes(fmt, planes)
    heads = next(iter(planes.values())).shape[1]
    _check_out(fmt, heads, out_k, out_v)
    num_cols = zero_fill_cols if zero_fill_cols > 0 else topk
    if batch == 0 or num_cols == 0:
        return
    kind, k_n4, v_n4 = layout(fmt)
    kc, ks, vc, vs = attention_planes(fmt, planes)
    k_signs, v_signs = _sign_tables(fmt, out_k.device)
    _gather_selected_kernel[(batch, heads, triton.cdiv(num_cols, GATHER_BLOCK_N))](
        kc, ks, vc, vs, k_signs, v_signs, req_to_token, req_indices, indices, seq_lens, cu_k, out_k, out_v, topk,
        num_cols, req_to_token.stride(0), indices.stride(0),
        kc.stride(0), kc.stride(1), ks.stride(0), ks.stride(1), vc.stride(0), vc.stride(1), vs.stride(0), vs.stride(1),
        out_k.stride(0), out_k.stride(1), out_v.stride(0), out_v.stride(1),
        FMT=kind, K_N4=k_n4, V_N4=v_n4, NB=fmt.head_dim // 64, BLOCK_N=GATHER_BLOCK_N, LUT=LUT_SELECT,
        ZERO_FILL=zero_fill_cols > 0, **GATHER_COMPILE_OPTIONS)


def dequantize_plain(fmt: KVFormat, planes: dict[str, torch.Tensor], loc: torch.Tensor, k_out: torch.Tensor,
                     v_out: torch.Tensor) -> None:
    """k_out / v_out [N, kv_heads, head_dim] (any float dtype, unit stride in head_dim; N <= loc's length): row i
    <- the K / V stored at slot loc[i] as plain values (octave: un-rotated), cast to the buffers' dtype. No host
    sync."""
    check_planes(fmt, planes)
    heads = next(iter(planes.values())).shape[1]
    _check_out(fmt, heads, k_out, v_out)
    n = k_out.shape[0]
    assert v_out.shape[0] == n and loc.dim() == 1 and loc.shape[0] >= n, (k_out.shape, v_out.shape, loc.shape)
    if not fmt.rotated:
        dequantize_rotated(fmt, planes, loc, k_out, v_out, lut=LUT_SELECT)  # int8: stored in the plain basis
        return
    if n == 0:
        return
    _, k_n4, v_n4 = layout(fmt)
    kc, ks, vc, vs = attention_planes(fmt, planes)
    k_signs, v_signs = _sign_tables(fmt, k_out.device)
    _octave_plain_kernel[(triton.cdiv(n, PLAIN_BLOCK_N), heads)](
        kc, ks, vc, vs, k_signs, v_signs, loc, k_out, v_out, n,
        kc.stride(0), kc.stride(1), ks.stride(0), ks.stride(1), vc.stride(0), vc.stride(1), vs.stride(0), vs.stride(1),
        k_out.stride(0), k_out.stride(1), v_out.stride(0), v_out.stride(1),
        K_N4=k_n4, V_N4=v_n4, NB=fmt.head_dim // 64, BLOCK_N=PLAIN_BLOCK_N, **GATHER_COMPILE_OPTIONS)


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
    in output_dtype, row cu_k[b] + t the K / V of request req_indices[b]'s token t, as plain values."""
    check_planes(fmt, planes)
    heads = next(iter(planes.values())).shape[1]
    dev = next(iter(planes.values())).device
    packed_k = torch.empty((total_k, heads, fmt.head_dim), dtype=output_dtype, device=dev)
    packed_v = torch.empty_like(packed_k)
    if total_k:
        dequantize_plain(fmt, planes, prefill_slots(req_to_token, req_indices, cu_k, total_k), packed_k, packed_v)
    return packed_k, packed_v
