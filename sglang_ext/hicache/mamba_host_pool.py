"""HiCache host tier for the recurrent states of hybrid models on the portable CPU platform.

SGLang keeps a hybrid model's Mamba / Gated DeltaNet states (conv windows and the recurrent matrix) in host RAM
through its own `MambaPoolHost`, beside the full-attention KV pages, under its hybrid cache controller. Off
CUDA / HIP / NPU that pool fails twice: it page-locks its buffers through CUDA, and its state moves call
transfer functions that exist only for those devices. On the CPU platform the "device" pool is host RAM too,
so this subclass allocates unpinned buffers and moves states with torch index copies; everything else (slot
allocation, storage pages, the controller's bookkeeping) is SGLang's.

Host layout (SGLang's page-first, the only layouts its Mamba host pool has):
  temporal_buffer  [host_slots, mamba_layers, 1, *ssm_state_shape]
  conv_buffer[i]   [host_slots, mamba_layers, 1, *conv_state_shape_i]
Device side, per layer: `temporal_layers[l]` [device_slots, *ssm_state_shape] (possibly a strided view).
"""

from __future__ import annotations

import logging

import torch

from sglang_ext import compat

logger = logging.getLogger(__name__)

SUPPORTED_LAYOUTS = ("page_first", "page_first_direct")
SUPPORTED_IO_BACKENDS = ("direct", "kernel")


def check_io_backend(io_backend: str) -> None:
    if io_backend not in SUPPORTED_IO_BACKENDS:
        raise ValueError(
            f"--hicache-io-backend {io_backend!r} is not supported for hybrid models on the portable CPU platform; "
            f"use one of {', '.join(SUPPORTED_IO_BACKENDS)} (both run torch index copies)"
        )


class PortableMambaHostPool(compat.MambaPoolHost):
    def __init__(self, buffer_info, host_to_device_ratio, host_size, **kwargs):
        layout = kwargs.get("layout", "layer_first")
        if layout not in SUPPORTED_LAYOUTS:
            raise ValueError(
                f"--hicache-mem-layout {layout!r} is not supported for hybrid models (SGLang's Mamba host pool is "
                f"page-first); use one of {', '.join(SUPPORTED_LAYOUTS)}"
            )
        kwargs["pin_memory"] = False  # nothing to pin for: the "device" is host RAM
        super().__init__(buffer_info, host_to_device_ratio, host_size, **kwargs)
        # Under tensor parallelism each rank logs its own pool: its share of the heads in the state shapes.
        logger.info(
            "sglang-ext HiCache Mamba host pool: %d slots, %d layers, recurrent state %s %s, conv state %s %s",
            self.size,
            self.temporal_buffer.shape[1],
            tuple(self.temporal_buffer.shape[3:]),
            self.temporal_dtype,
            [tuple(b.shape[3:]) for b in self.conv_buffer],
            self.conv_dtype,
        )

    @staticmethod
    def _copy_tensor_pf_lf(src, dst, src_indices, dst_indices, layer_id, num_layers, io_backend) -> None:
        """Host page-first `src` [host_slots, layers, 1, ...] -> one device layer `dst` [device_slots, ...]."""
        check_io_backend(io_backend)
        if src_indices.numel() == 0:
            return
        host = src_indices.to(device=src.device, dtype=torch.long)
        values = src[:, layer_id, 0].index_select(0, host)
        dst.index_copy_(0, dst_indices.to(device=dst.device, dtype=torch.long), values.to(dst.dtype))

    @staticmethod
    def _copy_tensor_all_layers_lf_pf(src_layers, dst, src_indices, dst_indices, num_layers, io_backend, src_ptrs,
                                      staging=None, can_use_jit=False) -> None:
        """Every device layer `src_layers[l]` [device_slots, ...] -> host page-first `dst` [host_slots, layers, 1, ...]."""
        check_io_backend(io_backend)
        if src_indices.numel() == 0:
            return
        host = dst_indices.to(device=dst.device, dtype=torch.long)
        for layer_id in range(num_layers):
            layer = src_layers[layer_id]
            values = layer.index_select(0, src_indices.to(device=layer.device, dtype=torch.long))
            dst[:, layer_id, 0].index_copy_(0, host, values.to(dst.dtype))


def build_mamba_host_pool(mamba_pool, pool_info, *, host_size, layout, mtp_draft_device_pools=()):
    """REPLACE for SGLang's `build_mamba_host_pool` on the portable CPU platform: the same pool, built with the
    same arguments, as `PortableMambaHostPool`."""
    draft_buffer_infos = []
    for draft_pool in mtp_draft_device_pools:
        (draft_info,) = draft_pool.get_device_pool_infos()
        draft_info.buffer_info.validate(layer_ids=draft_info.layer_ids)
        draft_buffer_infos.append(draft_info.buffer_info)
    capacity = mamba_pool.host_capacity_tokens
    if capacity is None:
        capacity = mamba_pool.size
    return PortableMambaHostPool(
        pool_info.buffer_info,
        compat.get_memory().hicache_ratio,
        host_size,
        device_capacity=capacity,
        mtp_draft_buffer_infos=draft_buffer_infos,
        allocator_type=compat.get_host_allocator_type(),
        layout=layout,
    )
