"""Start-up refusals for HiCache with a compressed KV pool; each names what is supported.

Called from `kvcache.support.check_supported` (before any allocation) when --enable-hierarchical-cache is on.
Reads only the server-args object (importing `compat` imports no SGLang module).
"""

from __future__ import annotations

from sglang_ext import compat
from sglang_ext.kernels.host_pages import HOST_LAYOUTS

SUPPORTED_IO_BACKENDS = ("direct", "kernel")
SUPPORTED_HOST_MEMORY_MODES = ("cache",)


def check_hicache_supported(fmt_name: str, server_args) -> None:
    flag = f"--kv-cache-dtype {fmt_name} with --enable-hierarchical-cache"
    layout = getattr(server_args, "hicache_mem_layout", "layer_first")
    if layout not in HOST_LAYOUTS:
        raise ValueError(f"{flag}: --hicache-mem-layout {layout!r} is not supported; use one of {', '.join(HOST_LAYOUTS)}")
    io_backend = getattr(server_args, "hicache_io_backend", "kernel")
    if io_backend not in SUPPORTED_IO_BACKENDS:
        raise ValueError(
            f"{flag}: --hicache-io-backend {io_backend!r} is not supported; use one of {', '.join(SUPPORTED_IO_BACKENDS)}"
        )
    mode = getattr(server_args, "hicache_host_memory_mode", "cache")
    if mode not in SUPPORTED_HOST_MEMORY_MODES:
        raise ValueError(f"{flag}: --hicache-host-memory-mode {mode!r} is not supported; use cache")
    backend = getattr(server_args, "hicache_storage_backend", None)
    if backend in compat.ZERO_COPY_STORAGE_BACKENDS:
        raise ValueError(
            f"{flag}: --hicache-storage-backend {backend} is a zero-copy backend, which moves pages without the "
            "format's page checks; supported: file, and backends on SGLang's generic page path"
        )
