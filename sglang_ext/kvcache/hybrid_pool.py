"""Compressed KV inside SGLang's hybrid linear-attention pool (Gated DeltaNet / Mamba layers + full attention).

SGLang's `HybridLinearKVPool` keeps the recurrent and conv state in its Mamba pool and the full-attention layers'
K/V in a sub-pool (`full_kv_pool`) of the class `KVCacheConfigurator._hybrid_full_attention_pool_class` picks.
For an sglang-ext format that class is `CompressedMHATokenToKVPool` bound to the format (`full_pool_factory`), so
the sub-pool holds the format's planes for the full-attention layers only: its layer i is the i-th
full-attention layer of this rank. The Mamba pool is untouched. The hybrid pool already translates global layer
ids on writes (`set_kv_buffer`); `HybridCompressedPool` does the same for the attention backends' reads.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

from sglang_ext import compat
from sglang_ext.kvcache.pool import CompressedMHATokenToKVPool
from sglang_ext.kvformats.base import KVFormat


def full_pool_factory(kv_format: KVFormat) -> Callable[..., CompressedMHATokenToKVPool]:
    """What HybridLinearKVPool calls, with MHATokenToKVPool's keyword arguments, to build its full-attention
    sub-pool: a `CompressedMHATokenToKVPool` of `kv_format` (no alternate CUDA stream, as the dense build)."""
    return functools.partial(CompressedMHATokenToKVPool, kv_format=kv_format, enable_alt_stream=False)


class HybridCompressedPool:
    """The compressed full-attention planes of a `HybridLinearKVPool`, addressed by global layer id.

    The attention backends read and write through this; the hybrid pool (and its Mamba pool) stays SGLang's.
    """

    def __init__(self, hybrid):
        full = hybrid.full_kv_pool
        if not isinstance(full, CompressedMHATokenToKVPool):
            raise TypeError(f"the hybrid pool's full-attention pool is {type(full).__name__}, not a compressed pool")
        self.hybrid = hybrid
        self.full = full
        self.kv_format = full.kv_format
        self.head_num = full.head_num
        self.head_dim = full.head_dim
        self.v_head_dim = full.v_head_dim
        self._local = dict(hybrid.full_attention_layer_id_mapping)  # global layer id -> sub-pool layer

    def layer_planes(self, layer_id: int) -> dict[str, torch.Tensor]:
        """Planes of global (full-attention) layer `layer_id`: {name: [size + page_size, head_num, *tail]}."""
        local = self._local.get(layer_id)
        if local is None:
            raise ValueError(f"layer {layer_id} is not a full-attention layer of this pool ({sorted(self._local)})")
        counter = self.hybrid.layer_transfer_counter  # HiCache layer-wise loads wait at the hybrid level
        if counter is not None:
            counter.wait_until(layer_id - self.hybrid.start_layer)
        return self.full.layer_planes(local)

    def first_layer_planes(self) -> dict[str, torch.Tensor]:
        """Planes of the first full-attention layer held here (their shapes and dtypes are every layer's)."""
        return self.full.first_layer_planes()

    def set_kv_buffer(self, layer, loc_info, cache_k: torch.Tensor, cache_v: torch.Tensor) -> None:
        """Quantize K/V [N, head_num, head_dim] of global layer `layer.layer_id` into the planes at `loc_info`."""
        self.hybrid.set_kv_buffer(layer, loc_info, cache_k, cache_v)


def compressed_pool_of(pool) -> CompressedMHATokenToKVPool | HybridCompressedPool | None:
    """The compressed planes behind a model runner's `token_to_kv_pool`, or None when it holds no sglang-ext
    format (a dense pool, or a hybrid pool whose full-attention layers are dense)."""
    if isinstance(pool, CompressedMHATokenToKVPool):
        return pool
    if isinstance(pool, compat.HybridLinearKVPool) and isinstance(
        getattr(pool, "full_kv_pool", None), CompressedMHATokenToKVPool
    ):
        return HybridCompressedPool(pool)
    return None
