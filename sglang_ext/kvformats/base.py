"""What a KV cache format is: per (token, KV head) byte layout, reference quantize / dequantize.

A format's storage is a dict of named planes; each plane is a tensor [num_slots, num_kv_heads, *tail]
(`plane_specs()` gives dtype and tail). The pool owns the tensors; kernels and the reference read and write
rows of them. The torch code here is the spec the Triton kernels are tested against.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

SUPPORTED_HEAD_DIMS = (64, 128, 256)


class KVFormat(ABC):
    name: str = ""
    # True when attention runs in a rotated basis: the kernels rotate q with rotate_k, accumulate V in V's
    # rotated basis and un-rotate the output with unrotate_v.
    rotated: bool = False
    # What stored bytes mean: bumped when the same bytes would decode differently (octave: codebook.REVISION).
    # Storage keys carry it, so pages of another revision are misses, never misread.
    revision: int = 1

    def __init__(self, head_dim: int, rotary_dim: int | None = None):
        if head_dim not in SUPPORTED_HEAD_DIMS:
            raise ValueError(
                f"{self.name}: head_dim {head_dim} is not supported; supported head_dim: {SUPPORTED_HEAD_DIMS}"
            )
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if not 0 < rotary_dim <= head_dim:
            raise ValueError(f"{self.name}: rotary_dim must be in (0, head_dim={head_dim}], got {rotary_dim}")
        self.head_dim = head_dim
        self.rotary_dim = rotary_dim

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, head_dim={self.head_dim}, rotary_dim={self.rotary_dim})"

    @abstractmethod
    def plane_specs(self) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        """Plane name -> (dtype, tail shape). A plane is [num_slots, num_kv_heads, *tail]."""

    @property
    def bytes_per_token_head(self) -> int:
        """Bytes one token occupies per KV head, K and V together, scales included."""
        total = 0
        for dtype, tail in self.plane_specs().values():
            n = 1
            for t in tail:
                n *= t
            total += n * torch.empty((), dtype=dtype).element_size()
        return total

    @property
    def bits_per_element(self) -> float:
        """Average stored bits per K or V element, scales included."""
        return self.bytes_per_token_head * 8 / (2 * self.head_dim)

    def describe_bits(self) -> str:
        """Short human description of the bit allocation, for the CLI table."""
        return f"{self.bits_per_element:.2f}"

    def allocate(self, num_slots: int, num_kv_heads: int, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        """Zero-filled planes for num_slots slots."""
        return {
            name: torch.zeros((num_slots, num_kv_heads, *tail), dtype=dtype, device=device)
            for name, (dtype, tail) in self.plane_specs().items()
        }

    @abstractmethod
    def quantize(self, k: torch.Tensor, v: torch.Tensor) -> dict[str, torch.Tensor]:
        """k, v [N, H, D] any float dtype -> planes for those N tokens (new tensors)."""

    @abstractmethod
    def dequantize(self, planes: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Planes of N tokens -> (k, v) float32 [N, H, D] in the original (unrotated) basis."""

    def dequantize_rotated_kv(self, planes: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Planes of N tokens -> (k, v) float32 [N, H, D] in the attention basis (k in rotate_k's, v in
        rotate_v's): what attention needs when it rotates q once and un-rotates its output once, instead of
        un-rotating every row. The original basis unless `rotated`."""
        return self.dequantize(planes)

    def rotate_k(self, x: torch.Tensor) -> torch.Tensor:
        """The basis attention scores are computed in (identity unless `rotated`). float32 out."""
        return x.to(torch.float32)

    def rotate_v(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.float32)

    def unrotate_v(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.float32)

    def check_kv(self, k: torch.Tensor, v: torch.Tensor) -> None:
        if k.dim() != 3 or k.shape != v.shape or k.shape[-1] != self.head_dim:
            raise ValueError(f"{self.name}: k, v must both be [N, H, {self.head_dim}], got {tuple(k.shape)}, {tuple(v.shape)}")
        if not (k.is_floating_point() and v.is_floating_point()):
            raise ValueError(f"{self.name}: k, v must be floating point, got {k.dtype}, {v.dtype}")
