"""Host-side constants the kernels read: codebook levels, decision thresholds and rotation matrices, built
from the format's spec (kvformats) and cached per device."""

from __future__ import annotations

import functools

import torch

from ..kvformats import KVFormat, rotation
from ..kvformats.codebook import LEVELS, thresholds

FMT_BF16, FMT_INT8, FMT_OCTAVE = 0, 1, 2
# Offsets into the combined tables: 4-bit entries first, then 3-bit.
LEVEL_OFF = {4: 0, 3: 16}
THRESH_OFF = {4: 0, 3: 15}


def format_kind(fmt: KVFormat) -> int:
    if fmt.name == "bf16":
        return FMT_BF16
    if fmt.name == "int8":
        return FMT_INT8
    if fmt.name.startswith("octave"):
        return FMT_OCTAVE
    raise ValueError(f"no Triton kernels for KV format {fmt.name!r}")


def leading_4bit_blocks(bits: tuple[int, ...]) -> int:
    """The kernels' layout descriptor: blocks 0..n4-1 are 4-bit, the rest 3-bit (true of every octave layout,
    since the rotary dims come first)."""
    n4 = sum(1 for b in bits if b == 4)
    if tuple(bits) != (4,) * n4 + (3,) * (len(bits) - n4):
        raise ValueError(f"unsupported block bit layout {bits}: 4-bit blocks must come first")
    return n4


@functools.cache
def level_table(device: torch.device) -> torch.Tensor:
    """float32 [24]: 4-bit levels at 0..15, 3-bit levels at 16..23 (the exact float32 values the reference uses)."""
    return torch.tensor(LEVELS[4] + LEVELS[3], dtype=torch.float32, device=device)


@functools.cache
def threshold_table(device: torch.device) -> torch.Tensor:
    """float32 [22]: 4-bit thresholds at 0..14, 3-bit thresholds at 15..21."""
    return torch.tensor(thresholds(4) + thresholds(3), dtype=torch.float32, device=device)


@functools.cache
def sign_table(tensor: int, num_blocks: int, device: torch.device) -> torch.Tensor:
    """float32 [num_blocks, 64] of +-1."""
    return rotation.signs(tensor, num_blocks, device).contiguous()


@functools.cache
def rotation_matrices(tensor: int, num_blocks: int, inverse: bool, device: torch.device) -> torch.Tensor:
    """float32 [num_blocks, 64, 64] M_b with out_row = in_row @ M_b per block.

    forward (y = R x, R = H diag(s) / 8):      M[i, j] = s[i] * H[i, j] / 8
    inverse (x = R^T y = diag(s) H y / 8):     M[i, j] = H[i, j] * s[j] / 8
    """
    h = rotation.hadamard_matrix(dtype=torch.float64) / 8.0
    s = rotation.signs(tensor, num_blocks).to(torch.float64)
    if inverse:
        m = h[None, :, :] * s[:, None, :]
    else:
        m = s[:, :, None] * h[None, :, :]
    return m.to(dtype=torch.float32, device=device).contiguous()


@functools.cache
def identity_placeholder(device: torch.device) -> torch.Tensor:
    """A 1-element float32 tensor passed where a kernel's pointer argument is unused."""
    return torch.zeros(1, dtype=torch.float32, device=device)
