"""The device-pool description SGLang hands to HiCache, extended with a compressed pool's planes.

SGLang builds the host pool from `device_pool.get_device_pool_infos()[0].buffer_info` (an `MHABufferInfo`)
and picks its class with `get_mha_host_pool_cls(info)`. A compressed pool has no dense K/V buffers, so it
describes itself with this subclass: the format and the per-layer plane dicts travel with the info, and the
type is what `hooks.py` recognizes to answer with `CompressedMHAHostPool`.
"""

from __future__ import annotations

from typing import Any

import torch

from sglang_ext import compat


class CompressedMHABufferInfo(compat.MHABufferInfo, frozen=True, kw_only=True):
    # kv_format: sglang_ext.kvformats.base.KVFormat; layer_planes: one {plane name: [slots, H, *tail]} per layer
    kv_format: Any
    layer_planes: tuple


def compressed_buffer_info(pool) -> CompressedMHABufferInfo:
    """Describe a `CompressedMHATokenToKVPool` for HiCache (no dense buffers, no pointer tables)."""
    planes = tuple(pool.layer_planes_for_transfer())
    first = next(iter(planes[0].values())) if planes else None
    return CompressedMHABufferInfo(
        buffers=compat.KVBuffers(k=(), v=(), k_data_ptrs=None, v_data_ptrs=None, layout=compat.KVBufferLayout.NHD),
        page_size=pool.page_size,
        head_num=pool.head_num,
        head_dim=pool.head_dim,
        v_head_dim=pool.v_head_dim,
        dtype=pool.store_dtype,
        device=first.device if first is not None else torch.device(pool.device),
        kv_format=pool.kv_format,
        layer_planes=planes,
    )
