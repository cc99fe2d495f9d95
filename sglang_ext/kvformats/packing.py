"""Bit packing of one 64-dim block of codes (reference; the Triton kernels implement the same layout).

4-bit block = 32 bytes: dim i lives in byte i // 2, even i in the low nibble, odd i in the high nibble.
3-bit block = 24 bytes: a 2-bit plane (16 bytes; dim i in byte i // 4 at bit 2 * (i % 4), the code's two
low bits) followed by a 1-bit plane (8 bytes; dim i in byte i // 8 at bit i % 8, the code's high bit).
"""

from __future__ import annotations

import torch

BLOCK = 64
BLOCK_BYTES = {3: 24, 4: 32}


def pack_block(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """codes [..., 64] integer in [0, 2**bits) -> uint8 [..., BLOCK_BYTES[bits]]."""
    c = codes.to(torch.int32)
    if bits == 4:
        pairs = c.reshape(*c.shape[:-1], 32, 2)
        return (pairs[..., 0] | (pairs[..., 1] << 4)).to(torch.uint8)
    if bits == 3:
        low = (c & 3).reshape(*c.shape[:-1], 16, 4)
        plane2 = low[..., 0] | (low[..., 1] << 2) | (low[..., 2] << 4) | (low[..., 3] << 6)
        high = (c >> 2).reshape(*c.shape[:-1], 8, 8)
        plane1 = torch.zeros_like(high[..., 0])
        for r in range(8):
            plane1 |= high[..., r] << r
        return torch.cat([plane2, plane1], dim=-1).to(torch.uint8)
    raise ValueError(f"bits must be 3 or 4, got {bits}")


def unpack_block(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 [..., BLOCK_BYTES[bits]] -> int64 codes [..., 64]."""
    p = packed.to(torch.int64)
    if bits == 4:
        return torch.stack([p & 15, p >> 4], dim=-1).reshape(*p.shape[:-1], BLOCK)
    if bits == 3:
        plane2, plane1 = p[..., :16], p[..., 16:24]
        low = torch.stack([(plane2 >> (2 * r)) & 3 for r in range(4)], dim=-1).reshape(*p.shape[:-1], BLOCK)
        high = torch.stack([(plane1 >> r) & 1 for r in range(8)], dim=-1).reshape(*p.shape[:-1], BLOCK)
        return low | (high << 2)
    raise ValueError(f"bits must be 3 or 4, got {bits}")
