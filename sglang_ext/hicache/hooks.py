"""Where the compressed HiCache tiers enter SGLang (registered in every SGLang process).

  host pool   `get_mha_host_pool_cls`: a compressed device pool (described by `CompressedMHABufferInfo`)
              gets `CompressedMHAHostPool`; anything else goes to SGLang (or the CPU platform's hook).
              On the CPU platform, hybrid models' recurrent states get `PortableMambaHostPool`
              (`build_mamba_host_pool`, mamba_host_pool.py).
  storage     `StorageBackendFactory.create_backend`: backends on SGLang's generic page path are wrapped in
              `VerifiedPageStorage` (format-keyed, checksummed pages), with the model name hashed and the
              file backend replaced by `PrivateHiCacheFile` (0600 files). For bf16/fp16 pools this is done
              where it is cheap: a plain MHA host pool on the generic path; zero-copy backends and models with
              side pools (SWA, ...) are left to SGLang. A compressed pool refuses zero-copy backends. Hybrid
              (Mamba / linear-attention) models are refused: SGLang's multi-pool storage path has neither
              format keys nor checksums.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time

from sglang_ext import compat, hook_chain

logger = logging.getLogger(__name__)


def _host_pool_cls(chosen, buffer_info, *args, **kwargs):
    # AFTER hook: SGLang (or the CPU platform's AROUND hook, which passes our classes through) has chosen a
    # dense pool class for this info; a compressed pool's info gets ours instead. None keeps SGLang's choice.
    from sglang_ext.hicache.buffer_info import CompressedMHABufferInfo

    if isinstance(buffer_info, CompressedMHABufferInfo):
        from sglang_ext.hicache.host_pool import CompressedMHAHostPool

        return CompressedMHAHostPool
    return None


def is_zero_copy_backend(backend_name: str, storage_config) -> bool:
    if backend_name in compat.ZERO_COPY_STORAGE_BACKENDS:
        return True
    extra = storage_config.extra_config or {}
    return backend_name == "dynamic" and bool(extra.get("interface_v1", 0))


def dense_namespace(pool) -> str | None:
    """Storage namespace of a plain dense MHA host pool (its flat page order depends on the host layout);
    None for host pools whose page bytes this package does not know."""
    from sglang_ext.platform.host_pool import PortableMHAHostPool

    if type(pool) not in (compat.MHATokenToKVPoolHost, PortableMHAHostPool):
        return None
    return f"dense-{str(pool.dtype).removeprefix('torch.')}-{pool.layout}-h{pool.head_num}-d{pool.head_dim}-l{pool.layer_num}-p{pool.page_size}"


def storage_namespace(pool) -> str | None:
    tag = getattr(pool, "storage_format_tag", None)
    if getattr(pool, "sglang_ext_host_pool", False):
        return f"{tag}-p{pool.page_size}"
    return dense_namespace(pool)


def shard_suffix(storage_config) -> str:
    """The rank's part of the storage namespace under tensor / pipeline parallelism ("" in one process): each
    rank stores its own KV heads (TP) or layers (PP) under the same SGLang page keys, and only some backends add
    the rank to their keys (the file backend does, in its file names). With the rank in the namespace, a page
    has another key on every rank whatever the backend, and a page another rank wrote fails its checksum."""
    tp, pp = storage_config.tp_size, storage_config.pp_size
    if tp == 1 and pp == 1:
        return ""
    return f"-tp{storage_config.tp_rank}of{tp}-pp{storage_config.pp_rank}of{pp}"


def hashed_model_name(model_name: str | None) -> str:
    """The model name as backends see it: a digest, so no file name or key carries the user's path."""
    return "m" + hashlib.blake2b((model_name or "").encode(), digest_size=10).hexdigest()


def load_page_hash() -> None:
    """Load (and on first use build, ~10 s) SGLang's C++ page-hash extension now, at start-up. SGLang loads it
    lazily in its storage threads; a /flush_cache that arrives while one of them is still compiling finds the
    thread busy, fails to stop it and takes the scheduler down ("Failed to stop HiCache storage threads
    cleanly"). Our test suite hit this when the extension was being rebuilt."""
    start = time.monotonic()
    logger.info("sglang-ext HiCache: loading SGLang's page-hash extension (built on first use)")
    compat.load_hicache_native_hash()
    logger.info("sglang-ext HiCache: page-hash extension ready in %.1f s", time.monotonic() - start)


HYBRID_STORAGE_REFUSAL = (
    "--hicache-storage-backend is not supported for hybrid (Mamba / linear-attention) models: SGLang's hybrid "
    "storage path (batch_get_v2 / batch_set_v2, one page set per pool) stores KV pages and recurrent states with "
    "no KV format in the key and no checksum; supported for hybrids: the host tier (--enable-hierarchical-cache "
    "without --hicache-storage-backend)"
)


def has_recurrent_state_pool(mem_pool_host) -> bool:
    """Whether the host pools the cache controller holds include SGLang's Mamba (recurrent state) host pool."""
    return any(isinstance(entry.host_pool, compat.MambaPoolHost) for entry in getattr(mem_pool_host, "entries", ()))


def _create_backend(original, cls, backend_name, storage_config, mem_pool_host, **kwargs):
    from sglang_ext.hicache.verified_storage import VerifiedPageStorage

    if has_recurrent_state_pool(mem_pool_host):
        raise ValueError(HYBRID_STORAGE_REFUSAL)
    load_page_hash()

    pool, pools_sharing_keys = compat.anchor_host_pool(mem_pool_host)
    compressed = getattr(pool, "sglang_ext_host_pool", False)
    namespace = storage_namespace(pool)
    if namespace is not None:
        namespace += shard_suffix(storage_config)
    if is_zero_copy_backend(backend_name, storage_config) or pools_sharing_keys != 1 or namespace is None:
        if compressed:
            raise ValueError(
                f"--kv-cache-dtype {pool.kv_format.name}: --hicache-storage-backend {backend_name} moves pages "
                "without our page checks (zero-copy); supported: file, and backends on SGLang's generic page "
                f"path (not {', '.join(compat.ZERO_COPY_STORAGE_BACKENDS)})"
            )
        return original(cls, backend_name, storage_config, mem_pool_host, **kwargs)
    config = dataclasses.replace(storage_config, model_name=hashed_model_name(storage_config.model_name))
    if backend_name == "file":
        from sglang_ext.hicache.file_storage import PrivateHiCacheFile

        inner = compat.maybe_wrap_storage_failure_injector(PrivateHiCacheFile(config))
    else:
        inner = original(cls, backend_name, config, mem_pool_host, **kwargs)
    logger.info("sglang-ext HiCache storage: backend %s, pages verified, namespace %s", backend_name, namespace)
    return VerifiedPageStorage(inner, namespace)


def register() -> list[str]:
    from sglang_ext.platform import cpu_platform_active

    hook_chain.register(compat.HOOK_GET_MHA_HOST_POOL_CLS, _host_pool_cls, compat.HookType.AFTER)
    hook_chain.register(compat.HOOK_CREATE_STORAGE_BACKEND, _create_backend, compat.HookType.AROUND)
    registered = ["hicache compressed host tier + verified storage pages"]
    if cpu_platform_active():
        from sglang_ext.hicache.mamba_host_pool import build_mamba_host_pool

        hook_chain.register(compat.HOOK_BUILD_MAMBA_HOST_POOL, build_mamba_host_pool, compat.HookType.REPLACE)
        registered.append("cpu hicache host pool for recurrent states (hybrid models)")
    return registered
