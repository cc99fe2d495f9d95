"""Hooks that make SGLang's own code paths work on the portable CPU platform (installed from the plugin).

They are registered only when the portable CPU platform is the one that activates in this process, so on a
GPU host nothing here touches SGLang.
"""

from sglang_ext import compat
from sglang_ext.platform import activate
from sglang_ext.platform.host_pool import host_pool_cls_for
from sglang_ext.platform.memory import HICACHE_HOST_RESERVE_BYTES
from sglang_ext.platform.prefix_attention import run_sdpa_forward_extend
from sglang_ext.platform.seeded_sampling import murmur_hash32


def register() -> list[str]:
    if activate() is None:
        return []
    compat.HookRegistry.register(compat.HOOK_GET_MHA_HOST_POOL_CLS, host_pool_cls_for, compat.HookType.AROUND)
    compat.set_hicache_host_memory_reserve(HICACHE_HOST_RESERVE_BYTES)
    compat.HookRegistry.register(compat.HOOK_TORCH_NATIVE_SDPA_EXTEND, run_sdpa_forward_extend, compat.HookType.AROUND)
    compat.HookRegistry.register(compat.HOOK_MURMUR_HASH32, murmur_hash32, compat.HookType.REPLACE)
    return ["platform portable_cpu", "cpu hicache host pool (layer_first, page_first, page_first_direct)",
            "torch_native extend over a cached prefix attends the new rows only",
            "per-request sampling_seed (MurmurHash3 in torch)"]
