"""Deliberately broken variants of a format's planes, for proving the lossy thresholds catch real bugs."""

from __future__ import annotations

import torch

from sglang_ext.kvformats import KVFormat, rotation


def dropped_k_scale(fmt: KVFormat, planes: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """K's first scale lost (read as 0): int8's per-row scale, octave's block-0 scale."""
    p = dict(planes)
    p["k_scales"] = planes["k_scales"].clone()
    p["k_scales"][..., 0] = 0
    return p


def dropped_v_scale(fmt: KVFormat, planes: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    p = dict(planes)
    p["v_scales"] = planes["v_scales"].clone()
    p["v_scales"][..., 0] = 0
    return p


def _flip(planes: dict[str, torch.Tensor], name: str, col: slice, bit: int) -> dict[str, torch.Tensor]:
    p = dict(planes)
    t = planes[name].clone()
    raw = t.view(torch.uint8)
    raw[..., col] ^= 1 << bit
    p[name] = t
    return p


def misplaced_k_bit(fmt: KVFormat, planes: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One bit position packed wrong in every K code byte of block 0: octave 4-bit: bit 3 (the low nibble's
    top bit: the sign of every even dim); int8: bit 6."""
    return _flip(planes, "k_codes", slice(0, 32 if fmt.rotated else None), 3 if fmt.rotated else 6)


def misplaced_v_bit(fmt: KVFormat, planes: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Same for V: 4-bit blocks as above; 3-bit blocks: bit 0 of the 1-bit plane (the sign of dim 0 mod 8)."""
    if not fmt.rotated:
        return _flip(planes, "v_codes", slice(None), 6)
    if fmt.v_bits[0] == 4:
        return _flip(planes, "v_codes", slice(0, 32), 3)
    return _flip(planes, "v_codes", slice(16, 24), 0)


def missing_rotation(fmt: KVFormat, k: torch.Tensor, v: torch.Tensor) -> dict[str, torch.Tensor]:
    """Planes written by a store that skipped the rotation (octave only)."""
    saved = rotation.rotate
    try:
        rotation.rotate = lambda x, tensor: x.to(torch.float32)
        return fmt.quantize(k, v)
    finally:
        rotation.rotate = saved


PLANE_MUTATIONS = {
    "dropped_k_scale": dropped_k_scale,
    "dropped_v_scale": dropped_v_scale,
    "misplaced_k_bit": misplaced_k_bit,
    "misplaced_v_bit": misplaced_v_bit,
}
