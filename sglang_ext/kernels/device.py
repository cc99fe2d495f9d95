"""What the kernels' launchers ask of a device, answered in one place and once per device.

Every launch decision that depends on the hardware (NVIDIA or AMD, compiled or interpreted, Hopper or not, how many
SMs) reads a `DeviceInfo` from `device_info(device)`; nothing queries torch.cuda per layer. Tests fake a device by
passing their own `DeviceInfo` to the planners (decode_plan.plan_decode's `info=`).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch


def interpreted() -> bool:
    """Whether Triton kernels run under the CPU interpreter (TRITON_INTERPRET set when the kernels were defined:
    triton.jit reads it at decoration, so it is fixed for the process)."""
    return _INTERPRETED


_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def rocm() -> bool:
    """Whether torch is a ROCm build (its "cuda" devices are AMD GPUs, driven through HIP)."""
    return torch.version.hip is not None


@dataclass(frozen=True)
class DeviceInfo:
    # vendor: "cuda" (NVIDIA), "hip" (AMD, ROCm torch) or "cpu" (CPU tensors: the interpreter, or no kernel at all)
    vendor: str
    # interpreted: Triton kernels run under TRITON_INTERPRET (never compiled; no warmup, no Gluon, no PTX)
    interpreted: bool
    # capability: (major, minor) compute capability on NVIDIA, None elsewhere
    capability: tuple[int, int] | None = None
    # sms: streaming multiprocessors (NVIDIA) or compute units (AMD); 0 on the CPU
    sms: int = 0

    @property
    def nvidia(self) -> bool:
        """Compiled kernels on an NVIDIA GPU: PTX inline assembly, Gluon mma.sync kernels, the CUDA occupancy API."""
        return self.vendor == "cuda" and not self.interpreted

    def at_least(self, major: int) -> bool:
        """An NVIDIA GPU of compute capability `major`.x or later (9: Hopper)."""
        return self.nvidia and self.capability is not None and self.capability[0] >= major

    @property
    def compiled_gpu(self) -> bool:
        """Compiled Triton kernels on a GPU (NVIDIA or AMD): tensor-core dots in 16-bit operands pay off."""
        return self.vendor in ("cuda", "hip") and not self.interpreted


CPU = DeviceInfo(vendor="cpu", interpreted=True)


def device_info(device: torch.device | str) -> DeviceInfo:
    """The facts of `device` (cached per device)."""
    device = torch.device(device)
    if device.type != "cuda":
        return DeviceInfo(vendor="cpu", interpreted=interpreted())
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _gpu_info(index)


@functools.cache
def _gpu_info(index: int) -> DeviceInfo:
    props = torch.cuda.get_device_properties(index)
    hip = rocm()
    return DeviceInfo(vendor="hip" if hip else "cuda", interpreted=interpreted(),
                      capability=None if hip else torch.cuda.get_device_capability(index),
                      sms=props.multi_processor_count)
