"""Triton kernels for speculative decoding's KV slot bookkeeping. The torch ops in
`sglang_ext/spec/cache_loc_ops.py` are the spec (tests compare the two under TRITON_INTERPRET=1)."""

import torch
import triton
import triton.language as tl


@triton.jit
def _assign_extend_cache_locs_kernel(req_ptr, table_ptr, start_ptr, end_ptr, out_ptr, out_start_ptr,
                                     stride_table, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    start = tl.load(start_ptr + b).to(tl.int64)
    end = tl.load(end_ptr + b).to(tl.int64)
    row = tl.load(req_ptr + b).to(tl.int64)
    out_start = tl.load(out_start_ptr + b).to(tl.int64)
    for off in range(0, end - start, BLOCK):
        i = off + tl.arange(0, BLOCK)
        keep = i < end - start
        slot = tl.load(table_ptr + row * stride_table + start + i, mask=keep)
        tl.store(out_ptr + out_start + i, slot.to(tl.int64), mask=keep)


def assign_extend_cache_locs(req_pool_indices, req_to_token, start_offset, end_offset) -> torch.Tensor:
    """Same contract as sglang_ext.spec.cache_loc_ops.assign_extend_cache_locs."""
    assert req_to_token.stride(1) == 1
    lengths = (end_offset - start_offset).long()
    out_start = torch.cumsum(lengths, 0) - lengths
    out = torch.empty(int(lengths.sum()), dtype=torch.int64, device=req_to_token.device)
    bs = req_pool_indices.numel()
    if bs and out.numel():
        _assign_extend_cache_locs_kernel[(bs,)](req_pool_indices, req_to_token, start_offset, end_offset, out,
                                                out_start, stride_table=req_to_token.stride(0), BLOCK=32)
    return out


@triton.jit
def _fill_accept_out_cache_loc_kernel(accept_ptr, loc_ptr, out_ptr, SIZE_UPPER: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, SIZE_UPPER)
    before = tl.load(accept_ptr + offs, mask=offs < pid, other=-1)
    dst = tl.sum((before != -1).to(tl.int64))
    src = tl.load(accept_ptr + pid).to(tl.int64)
    if src > -1:
        tl.store(out_ptr + dst, tl.load(loc_ptr + src).to(tl.int64))


def fill_accept_out_cache_loc(accept_index, out_cache_loc, accept_out_cache_loc) -> None:
    """Same contract as sglang_ext.spec.cache_loc_ops.fill_accept_out_cache_loc (one program per entry, each
    counting the accepted entries before it: O(size^2) loads, size = bs * steps is small)."""
    assert accept_index.is_contiguous()
    size = accept_index.numel()
    if size:
        _fill_accept_out_cache_loc_kernel[(size,)](accept_index, out_cache_loc, accept_out_cache_loc,
                                                   SIZE_UPPER=triton.next_power_of_2(size))
