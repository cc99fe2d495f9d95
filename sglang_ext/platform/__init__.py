"""The `sglang.srt.platforms` entry point (`portable_cpu`): the portable CPU and the portable GPU platform.

`activate()` is called by SGLang's platform discovery (and by our plugin, in every process). SGLang matches
`SGLANG_PLATFORM` against entry-point names, and a package with two platform entry points has its general plugins
skipped, so both platforms share the one entry point and `SGLANG_EXT_PLATFORM` picks between them:
  - `SGLANG_EXT_PLATFORM=portable_gpu`: the GPU platform (a CUDA or ROCm GPU must be visible to torch);
  - `SGLANG_EXT_PLATFORM=portable_cpu` or `SGLANG_PLATFORM=portable_cpu`: the CPU platform;
  - neither: the CPU platform on a host without CUDA/ROCm/XPU device, the GPU platform on a ROCm GPU that
    sgl-kernel is not built for (gfx1100 among them), else None (SGLang keeps its own platform).
Choosing the GPU platform installs its kernel-library guard (platform/gpu.py) in this process.
"""

import os

from sglang_ext.env import PLATFORM_CHOICE

PLATFORM_NAME = "portable_cpu"
PLATFORM_CLASS = "sglang_ext.platform.cpu.PortableCpuPlatform"
GPU_PLATFORM_NAME = "portable_gpu"
GPU_PLATFORM_CLASS = "sglang_ext.platform.gpu.PortableGpuPlatform"


def has_accelerator() -> bool:
    import torch

    if torch.cuda.is_available():  # CUDA and ROCm builds both answer here
        return True
    xpu = getattr(torch, "xpu", None)
    return bool(xpu is not None and xpu.is_available())


# ROCm architectures sgl-kernel's ROCm wheels are built for (its setup_rocm.py targets); any other ROCm GPU
# (RDNA3 gfx1100 among them) gets the portable GPU platform without being asked.
SGL_KERNEL_ROCM_ARCHS = frozenset({"gfx942", "gfx950"})


def rocm_arch() -> str | None:
    """The first GPU's gfx architecture under ROCm torch ("gfx1100"), else None."""
    import torch

    if getattr(torch.version, "hip", None) is None or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]


def rocm_without_sgl_kernel() -> bool:
    """True on a ROCm GPU whose architecture sgl-kernel is not built for."""
    arch = rocm_arch()
    return arch is not None and arch not in SGL_KERNEL_ROCM_ARCHS


def chosen_platform() -> str | None:
    """The platform name this process runs (`portable_cpu`, `portable_gpu`) or None (SGLang's own)."""
    choice = os.environ.get(PLATFORM_CHOICE)
    if choice not in (None, "", PLATFORM_NAME, GPU_PLATFORM_NAME):
        raise ValueError(f"{PLATFORM_CHOICE}={choice!r}: use {PLATFORM_NAME} or {GPU_PLATFORM_NAME}")
    if choice == GPU_PLATFORM_NAME:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError(f"{PLATFORM_CHOICE}={GPU_PLATFORM_NAME}: torch sees no CUDA or ROCm GPU")
        return GPU_PLATFORM_NAME
    if choice == PLATFORM_NAME or os.environ.get("SGLANG_PLATFORM") == PLATFORM_NAME:
        return PLATFORM_NAME
    if os.environ.get("SGLANG_USE_CPU_ENGINE", "0") == "1":
        return None  # the user asked for SGLang's own (AMX) CPU engine
    if not has_accelerator():
        return PLATFORM_NAME
    return GPU_PLATFORM_NAME if rocm_without_sgl_kernel() else None


def cpu_platform_active() -> bool:
    """True where the portable CPU platform runs this process (its hooks and torch ops apply)."""
    return chosen_platform() == PLATFORM_NAME


def gpu_platform_active() -> bool:
    """True where the portable GPU platform runs this process."""
    return chosen_platform() == GPU_PLATFORM_NAME


def activate() -> str | None:
    """The entry point SGLang calls: the chosen platform's class path, or None."""
    name = chosen_platform()
    if name == GPU_PLATFORM_NAME:
        from sglang_ext.platform.kernel_guard import install_kernel_library_guard

        install_kernel_library_guard()
        return GPU_PLATFORM_CLASS
    return PLATFORM_CLASS if name == PLATFORM_NAME else None
