"""Block rotation of rows in Triton: out[r, 64b:64b+64] = x[r, 64b:64b+64] @ M_b (tables.rotation_matrices).

Used to rotate queries (and extend's new K/V) into the octave basis and to un-rotate attention outputs, once
per call; attention itself never leaves the rotated basis. Not bit-exact with the reference's butterfly (it
is a float32 matmul); the store kernel, which must be bit-exact, uses the butterfly instead.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import tables


@triton.jit
def _rotate_rows_kernel(x_ptr, out_ptr, mat_ptr, num_rows, rows_per_outer, stride_x_outer, stride_x_inner,
                        stride_o_outer, stride_o_inner, NB: tl.constexpr, BLOCK_R: tl.constexpr):
    # x, out: [outer, inner, NB * 64] viewed as rows r = outer * rows_per_outer + inner
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    mask = rows < num_rows
    outer = (rows // rows_per_outer).to(tl.int64)
    inner = (rows % rows_per_outer).to(tl.int64)
    x_row = outer * stride_x_outer + inner * stride_x_inner
    o_row = outer * stride_o_outer + inner * stride_o_inner
    offs = tl.arange(0, 64)
    for b in tl.static_range(NB):
        x = tl.load(x_ptr + x_row[:, None] + b * 64 + offs[None, :], mask=mask[:, None], other=0.0).to(tl.float32)
        m = tl.load(mat_ptr + b * 4096 + offs[:, None] * 64 + offs[None, :])
        y = tl.dot(x, m, input_precision="ieee")
        tl.store(out_ptr + o_row[:, None] + b * 64 + offs[None, :], y.to(out_ptr.dtype.element_ty),
                 mask=mask[:, None])


def rotate_rows(x: torch.Tensor, out: torch.Tensor, tensor: int, inverse: bool) -> torch.Tensor:
    """x, out: [A, B, D] with unit stride in D (any float dtypes). Writes out; returns it."""
    assert x.dim() == 3 and out.shape == x.shape, (x.shape, out.shape)
    assert x.stride(-1) == 1 and out.stride(-1) == 1, "last dim must be contiguous"
    a, b, d = x.shape
    assert d % 64 == 0, d
    nb = d // 64
    mats = tables.rotation_matrices(tensor, nb, inverse, x.device)
    rows = a * b
    if rows == 0:
        return out
    block_r = 16
    _rotate_rows_kernel[(triton.cdiv(rows, block_r),)](
        x, out, mats, rows, b, x.stride(0), x.stride(1), out.stride(0), out.stride(1), NB=nb, BLOCK_R=block_r)
    return out
