"""Launcher-side checks shared by the kernels: planes must match the format's plane specs."""

from __future__ import annotations

import torch

from ..kvformats import KVFormat


def check_planes(fmt: KVFormat, planes: dict[str, torch.Tensor]) -> None:
    specs = fmt.plane_specs()
    assert set(planes) == set(specs), f"{fmt.name}: planes {sorted(planes)} != {sorted(specs)}"
    first = None
    for name, (dtype, tail) in specs.items():
        t = planes[name]
        assert t.dtype == dtype, f"{fmt.name}: plane {name} dtype {t.dtype}, expected {dtype}"
        assert t.dim() == 2 + len(tail) and tuple(t.shape[2:]) == tail, \
            f"{fmt.name}: plane {name} shape {tuple(t.shape)}, expected [slots, heads, *{tail}]"
        assert t.stride(-1) == 1, f"{fmt.name}: plane {name} last dim must be contiguous"
        if first is None:
            first = t
        assert t.shape[:2] == first.shape[:2] and t.device == first.device, f"{fmt.name}: plane {name} mismatched"
