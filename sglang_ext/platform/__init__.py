"""The `sglang.srt.platforms` entry point: the portable CPU platform.

`activate()` is called by SGLang's platform discovery. It returns the platform class path only when this
host has no CUDA/ROCm/XPU device (so on a GPU host SGLang keeps its own platform), or when the user forces it
with `SGLANG_PLATFORM=portable_cpu`.
"""

import os

PLATFORM_NAME = "portable_cpu"
PLATFORM_CLASS = "sglang_ext.platform.cpu.PortableCpuPlatform"


def has_accelerator() -> bool:
    import torch

    if torch.cuda.is_available():  # CUDA and ROCm builds both answer here
        return True
    xpu = getattr(torch, "xpu", None)
    return bool(xpu is not None and xpu.is_available())


def activate() -> str | None:
    if os.environ.get("SGLANG_PLATFORM") == PLATFORM_NAME:
        return PLATFORM_CLASS
    if os.environ.get("SGLANG_USE_CPU_ENGINE", "0") == "1":
        return None  # the user asked for SGLang's own (AMX) CPU engine
    if has_accelerator():
        return None
    return PLATFORM_CLASS
