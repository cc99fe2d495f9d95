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
    # --- compressed HiCache host tier and storage tier (sglang_ext/hicache) ---
    # Host pool base class and the device-pool description the host pool is built from.
    "HostKVCache": "sglang.srt.mem_cache.pool_host.base:HostKVCache",
    "MHABufferInfo": "sglang.srt.mem_cache.device_pool_info:MHABufferInfo",
    "KVBuffers": "sglang.srt.mem_cache.device_pool_info:KVBuffers",
    "KVBufferLayout": "sglang.srt.mem_cache.device_pool_info:KVBufferLayout",
    # Storage interface (public to storage backends) and the file backend we subclass.
    "HiCacheStorage": "sglang.srt.mem_cache.hicache_storage:HiCacheStorage",
    "HiCacheStorageExtraInfo": "sglang.srt.mem_cache.hicache_storage:HiCacheStorageExtraInfo",
    "HiCacheFile": "sglang.srt.mem_cache.hicache_storage:HiCacheFile",
    "maybe_wrap_storage_failure_injector": (
        "sglang.srt.mem_cache.hicache_storage:_maybe_wrap_hicache_storage_failure_injector"
    ),
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
# --- compressed HiCache (sglang_ext/hicache) ---
# Builds every HiCache storage backend (classmethod: cls, backend_name, storage_config, mem_pool_host).
HOOK_CREATE_STORAGE_BACKEND = "sglang.srt.mem_cache.storage.backend_factory.StorageBackendFactory.create_backend"
# Backends the cache controller drives through zero-copy batch_get_v1/batch_set_v1 (host memory addressed by
# pointers, `cache_controller.py` attach_storage_backend), plus "dynamic" with extra_config interface_v1.
ZERO_COPY_STORAGE_BACKENDS = ("hf3fs", "mooncake", "npu_memcache", "eic", "nixl", "simm", "mori", "tensorcast", "seaweedfs")
# Resolves the parsed server arguments once, in the launcher, before anything is loaded: start-up checks run here.
HOOK_SERVER_ARGS_RESOLVE = "sglang.srt.server_args.ServerArgs.resolve_once"


def set_hicache_host_memory_reserve(nbytes: int) -> None:
    """SGLang keeps 10 GiB of host RAM out of reach of the HiCache host pool (a module constant read at each
    sizing call, `pool_host/base.py`). Sized for GPU servers; the CPU platform lowers it."""
    module = importlib.import_module("sglang.srt.mem_cache.pool_host.base")
    if not hasattr(module, "HICACHE_HOST_MEMORY_RESERVE_BYTES"):
        raise RuntimeError("sglang internals changed: pool_host.base.HICACHE_HOST_MEMORY_RESERVE_BYTES is gone")
    module.HICACHE_HOST_MEMORY_RESERVE_BYTES = nbytes


def hicache_file_storage_dir(storage_config, default: str) -> str:
    """The directory HiCacheFile stores pages in (its own precedence: env, extra_config, default)."""
    from sglang.srt.environ import envs

    return (
        envs.SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR.get()
        or (storage_config.extra_config or {}).get("file_storage_path")
        or default
    )


def anchor_host_pool(mem_pool_host):
    """The KV host pool behind what the cache controller holds (a HostPoolGroup or the pool itself), and the
    number of host pools that share its storage keys (1 unless the model has side pools: Mamba, SWA, ...)."""
    entries = getattr(mem_pool_host, "entries", None)
    if entries is None:
        return mem_pool_host, 1
    return mem_pool_host.anchor_entry.host_pool, len(entries)


def __getattr__(name: str):
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = target.split(":")
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value
