"""HiCache host tier on the portable CPU platform.

SGLang's MHA host pool pins its buffer through CUDA and moves pages with CUDA/HIP/XPU kernels. On a CPU
"device" the device pool and the host pool are both plain RAM, so this pool allocates unpinned memory and
moves pages with torch index copies. SGLang exposes per-layer views of every layout (`k_data_refs[l]`):
  layer_first, page_first : [host_slots, head_num, head_dim]   (page_first: a strided view)
  page_first_direct       : [host_pages, page_size, head_num, head_dim]
(SGLang turns `page_first` into `page_first_direct` when the io backend is `direct`.)
"""

import torch

from sglang_ext import compat

SUPPORTED_LAYOUTS = ("layer_first", "page_first", "page_first_direct")
SUPPORTED_IO_BACKENDS = ("direct", "kernel")


class PortableMHAHostPool(compat.MHATokenToKVPoolHost):
    def __init__(self, *args, **kwargs):
        kwargs["pin_memory"] = False  # nothing to pin for: the "device" is host RAM
        layout = args[4] if len(args) > 4 else kwargs.get("layout")
        if layout not in SUPPORTED_LAYOUTS:
            raise ValueError(
                f"--hicache-mem-layout {layout!r} is not supported on the portable CPU platform; "
                f"use one of {', '.join(SUPPORTED_LAYOUTS)}"
            )
        super().__init__(*args, **kwargs)

    def _check_io_backend(self, io_backend: str) -> None:
        if io_backend not in SUPPORTED_IO_BACKENDS:
            raise ValueError(
                f"--hicache-io-backend {io_backend!r} is not supported on the portable CPU platform; "
                f"use one of {', '.join(SUPPORTED_IO_BACKENDS)} (both run torch index copies)"
            )

    def _host_index(self, host_indices: torch.Tensor):
        """Index into one layer's host view for a vector of host token slots."""
        host_indices = host_indices.to(torch.long)
        if self.layout == "page_first_direct":
            return host_indices // self.page_size, host_indices % self.page_size
        return (host_indices,)

    def load_to_device_per_layer(
        self, device_pool, host_indices, device_indices, layer_id, io_backend, *, is_draft: bool = False
    ):
        if not is_draft and not 0 <= layer_id < self.target_layer_num:
            return
        self._check_io_backend(io_backend)
        host = self._host_index(host_indices)
        device_indices = device_indices.to(torch.long)
        # device buffers: [device_slots, head_num, head_dim]
        self.device_k_buffers[layer_id][device_indices] = self.k_data_refs[layer_id][host]
        self.device_v_buffers[layer_id][device_indices] = self.v_data_refs[layer_id][host]

    def backup_from_device_all_layer(self, device_pool, host_indices, device_indices, io_backend):
        self._check_io_backend(io_backend)
        host = self._host_index(host_indices)
        device_indices = device_indices.to(torch.long)
        for layer_id in range(self.layer_num):
            self.k_data_refs[layer_id][host] = self.device_k_buffers[layer_id][device_indices]
            self.v_data_refs[layer_id][host] = self.device_v_buffers[layer_id][device_indices]


def host_pool_cls_for(original_get_cls, buffer_info):
    """AROUND hook for SGLang's `get_mha_host_pool_cls`: plain MHA pools get the portable host pool."""
    cls = original_get_cls(buffer_info)
    if cls is compat.MHATokenToKVPoolHost:
        return PortableMHAHostPool
    if getattr(cls, "sglang_ext_host_pool", False):  # sglang_ext.hicache's pools move pages with torch ops
        return cls
    raise NotImplementedError(
        f"HiCache host pool {cls.__name__} (scaled or asymmetric K/V) is not supported on the portable CPU platform"
    )
