"""Total memory of the visible GPUs, read through NVML (no CUDA context is created). Never imports sglang."""

from __future__ import annotations

import os


def visible_gpu_memory_gib() -> tuple[float, ...] | None:
    """Total GiB of each GPU the process may use, in CUDA order; None when NVML (nvidia-ml-py) is missing,
    no GPU driver is loaded or CUDA_VISIBLE_DEVICES names devices by UUID/MIG id."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        count = pynvml.nvmlDeviceGetCount()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is None:
            indices = list(range(count))
        else:
            items = [v.strip() for v in visible.split(",") if v.strip()]
            if not all(v.isdigit() for v in items):
                return None
            indices = [int(v) for v in items if int(v) < count]
        sizes = tuple(
            pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).total / float(1 << 30) for i in indices
        )
        return sizes or None
    finally:
        pynvml.nvmlShutdown()
