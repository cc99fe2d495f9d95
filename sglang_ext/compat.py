"""Every SGLang 0.5.23 name sglang-ext depends on, in one place.

Public extension points (plugin loader, platform base classes) and private internals (hook targets, pool
classes) are all reached through this module, so a SGLang version bump is one file to read. Names are
resolved lazily (PEP 562): importing SGLang's memory-pool modules while SGLang is still choosing its
platform would re-enter platform discovery.
"""

import importlib

SGLANG_VERSION = "0.5.23"

# name -> "module:attribute", resolved on first access.
_LAZY = {
    # Plugin machinery (public).
    "HookRegistry": "sglang.srt.plugins.hook_registry:HookRegistry",
    "HookType": "sglang.srt.plugins.hook_registry:HookType",
    # Platform base classes (public extension point for out-of-tree platforms).
    "SRTPlatform": "sglang.srt.platforms.interface:SRTPlatform",
    "PlatformCapabilities": "sglang.srt.platforms.interface:PlatformCapabilities",
    "PlatformEnum": "sglang.srt.platforms.device_mixin:PlatformEnum",
    "CpuDeviceMixin": "sglang.srt.platforms.cpu:CpuDeviceMixin",  # CPU device ops: psutil memory, gloo
    # Internal: base class of the CPU HiCache host pool.
    "MHATokenToKVPoolHost": "sglang.srt.mem_cache.pool_host.mha:MHATokenToKVPoolHost",
}

# Hook targets (dotted paths into SGLang internals).
# Picks the HiCache host pool class for an MHA device pool; the CPU platform answers with its own pool.
HOOK_GET_MHA_HOST_POOL_CLS = "sglang.srt.mem_cache.pool_host.mha.get_mha_host_pool_cls"
# Argument parser construction and parsing (pp/server_args.py adds --pp-layer-partition; kvcache/ extends
# --kv-cache-dtype).
HOOK_SERVER_ARGS_ADD_CLI_ARGS = "sglang.srt.server_args.ServerArgs.add_cli_args"  # staticmethod (parser)
HOOK_SERVER_ARGS_FROM_CLI_ARGS = "sglang.srt.server_args.ServerArgs.from_cli_args"  # classmethod (cls, namespace)
# Read by sglang.srt.distributed.utils.get_pp_indices in every PP rank.
ENV_PP_LAYER_PARTITION = "SGLANG_PP_LAYER_PARTITION"
# Llama-family model (tied embeddings under PP): module with ParallelLMHead, add_prefix, get_parallel,
# default_weight_loader; its __init__ and load_weights; the checkpoint name of the tied matrix.
LLAMA_MODULE = "sglang.srt.models.llama"
HOOK_LLAMA_INIT = "sglang.srt.models.llama.LlamaForCausalLM.__init__"
HOOK_LLAMA_LOAD_WEIGHTS = "sglang.srt.models.llama.LlamaForCausalLM.load_weights"
LLAMA_EMBED_WEIGHT_NAME = "model.embed_tokens.weight"
# Resolves the parsed server arguments once, in the launcher, before anything is loaded: start-up checks run here.
HOOK_SERVER_ARGS_RESOLVE = "sglang.srt.server_args.ServerArgs.resolve_once"


# --- Agent sessions: session retention (sglang_ext/sessions/) -----------------------------------------------
# Public registry of radix-cache factories (`--radix-cache-backend <name>`), and the builder of SGLang's default
# UnifiedRadixCache that our factory calls with its own cache class.
_LAZY.update({
    "register_radix_cache_backend": "sglang.srt.mem_cache.registry:register_radix_cache_backend",
    "registered_radix_cache_backends": "sglang.srt.mem_cache.registry:registered_radix_cache_backends",
    "create_unified_radix_cache": "sglang.srt.mem_cache.registry:create_unified_radix_cache",
    "UnifiedRadixCache": "sglang.srt.mem_cache.unified_radix_cache:UnifiedRadixCache",
    # SGLang's node access counter (stored as `last_access_time` on every radix node).
    "get_and_increase_time_counter": "sglang.srt.mem_cache.unified_cache.components.base:get_and_increase_time_counter",
})
# The pure-Python TreeCore: its eviction walks read `tree_core.eviction_strategy.get_priority(node)` for device
# leaves and host leaves (`unified_cache/components/full.py`); the Rust TreeCore orders eviction natively.
TREE_CORE_BACKEND_PYTHON = "python"
# UnifiedRadixCache internals the retention cache overrides: the eviction walk behind `evict` and
# `evict_for_alloc`, and the step that evicts one device leaf (demote if backed up, else drop).
URC_EVICT_WALK = "_evict"  # (self, params, available_size_targets=None, *, allocation_reclaim_satisfied=None)
URC_EVICT_DEVICE_LEAF = "_evict_device_leaf"  # (self, node_id, tracker) -> Optional[BackupKV]


def set_hicache_host_memory_reserve(nbytes: int) -> None:
    """SGLang keeps 10 GiB of host RAM out of reach of the HiCache host pool (a module constant read at each
    sizing call, `pool_host/base.py`). Sized for GPU servers; the CPU platform lowers it."""
    module = importlib.import_module("sglang.srt.mem_cache.pool_host.base")
    if not hasattr(module, "HICACHE_HOST_MEMORY_RESERVE_BYTES"):
        raise RuntimeError("sglang internals changed: pool_host.base.HICACHE_HOST_MEMORY_RESERVE_BYTES is gone")
    module.HICACHE_HOST_MEMORY_RESERVE_BYTES = nbytes


def __getattr__(name: str):
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = target.split(":")
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value
