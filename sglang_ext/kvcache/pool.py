"""The device KV pool for sglang-ext formats: one dict of format planes per layer instead of dense K/V.

Slots mean what they mean in SGLang's MHA pool (row i of every plane is token slot i; slot 0's page is the
padding page), so the allocator and the radix cache, which only deal in slot indices, work unchanged.
Nothing reads the pool as a dense [slots, H, D] tensor: `get_key_buffer` raises, and the attention backends
in this package read `layer_planes(layer_id)` at the slots a batch touches.
"""

from __future__ import annotations

import torch

from sglang_ext import compat
from sglang_ext.kvformats.base import KVFormat


class CompressedMHATokenToKVPool(compat.MHATokenToKVPool):
    """MHATokenToKVPool whose layer storage is `kv_format`'s planes.

    `layer_planes(layer_id)` -> {plane name: [size + page_size, head_num, *tail]}; the pool owns them.
    `set_kv_buffer` quantizes K/V into the planes (the Triton store kernel on CUDA, the format's torch
    quantize elsewhere). Checkpoint k_scale/v_scale are ignored: the formats carry their own scales.
    """

    def __init__(self, *args, kv_format: KVFormat, **kwargs):
        self.kv_format = kv_format
        self._layer_planes: list[dict[str, torch.Tensor]] = []
        self._no_slot_planes: dict[str, torch.Tensor] = {}
        super().__init__(*args, **kwargs)
        if self.head_dim != kv_format.head_dim or self.v_head_dim != kv_format.head_dim:
            raise ValueError(
                f"{kv_format.name}: pool head sizes (K {self.head_dim}, V {self.v_head_dim}) differ from the "
                f"format's head_dim {kv_format.head_dim}"
            )

    # -- storage -------------------------------------------------------------------------------------------

    def _create_buffers(self):
        if self.post_capture_active:
            raise NotImplementedError(f"--kv-cache-dtype {self.kv_format.name} does not support post-capture KV backing")
        if self.kv_cache_layout != "nhd":
            raise NotImplementedError(
                f"--kv-cache-dtype {self.kv_format.name} needs the NHD KV layout, got {self.kv_cache_layout!r}"
            )
        num_slots = self.size + self.page_size
        with self.memory_saver_adapter.region(compat.GPU_MEMORY_TYPE_KV_CACHE):
            self._layer_planes = [
                self.kv_format.allocate(num_slots, self.head_num, self.device) for _ in range(self.layer_num)
            ]
        # [0, head_num, *tail] per plane: the geometry every layer has, also where this pool holds no layer (a
        # pipeline stage of a hybrid model with only linear-attention layers), for per-batch plans.
        self._no_slot_planes = self.kv_format.allocate(0, self.head_num, self.device)
        # Dense-layout attributes of the parent stay empty; nothing may read them.
        self.k_buffer = []
        self.v_buffer = []
        self.k_scale_buffer = None
        self.v_scale_buffer = None
        self.native_k_scale_buffer = None
        self.native_v_scale_buffer = None
        self.dq_k_buffer = None
        self.dq_v_buffer = None
        self._kv_buffer_descs = self._build_kv_buffer_descs()
        self._init_data_ptrs_and_strides()

    def _build_kv_buffer_descs(self):
        # One descriptor per (plane, layer), in `_all_planes()` order: each row is one token slot.
        descs = []
        for layer, planes in enumerate(self._layer_planes):
            for name, plane in planes.items():
                row_bytes = plane[0].numel() * plane.element_size()
                descs.append(
                    compat.KvBufferDesc(f"{name}{layer}", tuple(plane.shape), row_bytes=row_bytes, tokens_per_row=1)
                )
        return descs

    def _all_planes(self) -> list[torch.Tensor]:
        return [plane for planes in self._layer_planes for plane in planes.values()]

    def _init_data_ptrs_and_strides(self):
        self.k_data_ptrs = None
        self.v_data_ptrs = None
        planes = self._all_planes()
        self.data_ptrs = torch.tensor([p.data_ptr() for p in planes], dtype=torch.uint64, device=self.device)
        self.data_strides = torch.tensor([p.stride(0) * p.element_size() for p in planes], device=self.device)

    def _init_kv_copy_and_warmup(self):
        # Slot moves (speculative decoding) copy plane rows with torch indexing; no tiled-copy kernel.
        self._kv_copy_config = None

    def _clear_buffers(self):
        self._layer_planes = []
        super()._clear_buffers()

    def get_kv_size_bytes(self):
        k_bytes = v_bytes = 0
        for planes in self._layer_planes:
            for name, plane in planes.items():
                nbytes = plane.numel() * plane.element_size()
                if name.startswith("k"):
                    k_bytes += nbytes
                else:
                    v_bytes += nbytes
        return k_bytes, v_bytes

    def _pd_registerable_tensors(self):
        return self._all_planes()

    # -- access --------------------------------------------------------------------------------------------

    def layer_planes(self, layer_id: int) -> dict[str, torch.Tensor]:
        """Planes of global layer `layer_id`: {name: [size + page_size, head_num, *tail]} (owned by the pool)."""
        if self.layer_transfer_counter is not None:
            self.layer_transfer_counter.wait_until(layer_id - self.start_layer)
        return self._layer_planes[layer_id - self.start_layer]

    def first_layer_planes(self) -> dict[str, torch.Tensor]:
        """Planes of the first layer held here (their shapes and dtypes are every layer's); a pool holding no layer
        gives planes of the same head count, tail and dtype with no slot."""
        return self._layer_planes[0] if self._layer_planes else self._no_slot_planes

    def layer_planes_for_transfer(self) -> list[dict[str, torch.Tensor]]:
        """Every layer's planes, for HiCache host moves (no wait on the layer-load counter)."""
        return list(self._layer_planes)

    def _mha_buffer_info(self):
        # HiCache builds its host pool from this description; its type selects sglang_ext.hicache's host pool.
        from sglang_ext.hicache.buffer_info import compressed_buffer_info

        return compressed_buffer_info(self)

    def _dense_read_error(self):
        return NotImplementedError(
            f"the {self.kv_format.name} KV pool has no dense K/V buffer; read it with layer_planes() through an "
            "sglang-ext attention backend (triton or torch_native)"
        )

    def _get_key_buffer(self, layer_id: int):
        raise self._dense_read_error()

    def _get_value_buffer(self, layer_id: int):
        raise self._dense_read_error()

    def get_cpu_copy(self, indices, mamba_indices=None, req_pool_index=None):
        return [{name: plane[indices].to("cpu") for name, plane in planes.items()} for planes in self._layer_planes]

    def load_cpu_copy(self, kv_cache_cpu, indices, mamba_indices=None, req_pool_index=None):
        for planes, saved in zip(self._layer_planes, kv_cache_cpu, strict=True):
            for name, plane in planes.items():
                plane[indices] = saved[name].to(plane.device)

    def set_kv_buffer(
        self,
        layer,
        loc_info,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale=None,
        v_scale=None,
        layer_id_override=None,
        dcp_kv_mask=None,
    ):
        """Quantize cache_k/cache_v [N, head_num, head_dim] into this layer's planes at slots `loc` [N]."""
        if dcp_kv_mask is not None:
            raise NotImplementedError(f"--kv-cache-dtype {self.kv_format.name} does not support decode context parallelism")
        loc, _, _ = compat.unwrap_write_loc(loc_info)
        self._check_physical_write_loc(loc_info, f"set_kv_buffer ({self.kv_format.name})")
        layer_id = layer_id_override if layer_id_override is not None else layer.layer_id
        planes = self._layer_planes[layer_id - self.start_layer]
        cache_k = cache_k.view(-1, self.head_num, self.head_dim)
        cache_v = cache_v.view(-1, self.head_num, self.v_head_dim)
        if planes[next(iter(planes))].is_cuda:
            from sglang_ext.kernels import store_kv

            store_kv(self.kv_format, planes, loc, cache_k, cache_v)
            return
        for name, rows in self.kv_format.quantize(cache_k, cache_v).items():
            planes[name][loc] = rows

    def _move_kv_cache_impl(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor):
        if tgt_loc.numel() == 0:
            return
        for plane in self._all_planes():
            plane[tgt_loc] = plane[src_loc]
