"""KV cache formats: registry. Core code: never imports sglang.

    fmt = get_format("octave_k3v4", head_dim=256, rotary_dim=64)
"""

from __future__ import annotations

from .base import SUPPORTED_HEAD_DIMS, KVFormat
from .bf16 import BF16Format
from .int8 import Int8Format
from .octave import OctaveFormat

FORMAT_NAMES = ("bf16", "int8", "octave_k3v4", "octave_k3v3")


def get_format(name: str, head_dim: int, rotary_dim: int | None = None) -> KVFormat:
    """The format `name` for a head of head_dim dims whose first rotary_dim dims carry RoPE (None = all)."""
    if name == "bf16":
        return BF16Format(head_dim, rotary_dim)
    if name == "int8":
        return Int8Format(head_dim, rotary_dim)
    if name == "octave_k3v4":
        return OctaveFormat(name, 4, head_dim, rotary_dim)
    if name == "octave_k3v3":
        return OctaveFormat(name, 3, head_dim, rotary_dim)
    raise ValueError(f"unknown KV format {name!r}; known formats: {', '.join(FORMAT_NAMES)}")


__all__ = ["FORMAT_NAMES", "SUPPORTED_HEAD_DIMS", "KVFormat", "get_format"]
