"""Memory sizing for the portable CPU platform.

SGLang sizes the KV pool as `mem_fraction_static * total - (memory already used) - weights`; its GPU default
fraction would hand most of system RAM to the KV pool (14 GB on a 24 GB machine, over a minute to allocate),
starving the OS, the page cache and the HiCache host tier. On CPU we default to a KV budget instead and
derive the fraction from it.
"""

import os
from pathlib import Path

import psutil

from sglang_ext.env import CPU_KV_BUDGET_GB

DEFAULT_KV_FRACTION_OF_AVAILABLE = 0.10  # of RAM available at start-up
DEFAULT_KV_CAP_BYTES = 2 << 30
ACTIVATION_RESERVE_BYTES = 1 << 30  # prefill activations, sampling buffers, allocator slack
# RAM the HiCache host tier must leave free. SGLang reserves 10 GiB, sized for GPU servers with hundreds of GB
# of RAM; on the CPU platform the "device" pool already lives in (budgeted) RAM, so 1 GiB of slack is enough.
HICACHE_HOST_RESERVE_BYTES = 1 << 30


def default_kv_budget_bytes() -> int:
    override = os.environ.get(CPU_KV_BUDGET_GB)
    if override:
        try:
            return int(float(override) * (1 << 30))
        except ValueError:
            raise ValueError(f"{CPU_KV_BUDGET_GB}={override!r} is not a number of GiB") from None
    available = psutil.virtual_memory().available
    return int(min(available * DEFAULT_KV_FRACTION_OF_AVAILABLE, DEFAULT_KV_CAP_BYTES))


def weight_bytes_estimate(model_path: str, dtype: str | None) -> int:
    """Bytes the weights take once loaded: checkpoint size, doubled when upcast to float32."""
    folder = Path(model_path)
    if not folder.is_dir():
        return 0
    stored = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    return stored * 2 if dtype in ("float32", "float") else stored


def mem_fraction_for_budget(kv_budget: int, weights: int) -> float:
    vm = psutil.virtual_memory()
    used = vm.total - vm.available
    fraction = (used + weights + kv_budget + ACTIVATION_RESERVE_BYTES) / vm.total
    return round(min(max(fraction, 0.05), 0.9), 3)
