"""HiCache host tier for a compressed KV pool: the same format's planes in host RAM.

SGLang's MHA host pool copies dense K/V rows and drops scales (upstream #36121). This pool keeps every plane
of the device pool's format (codes and scales) per token, so host RAM holds the format's bytes per token and
each device<->host move carries exactly those bytes. Host planes are one buffer, page-locked with cudaHostRegister
when the device pool is on CUDA. Moves: with `--hicache-io-backend kernel` on a GPU, one Triton launch per (layer,
plane) that reads or writes the page-locked host rows in place (`kernels/host_transfer.py`; on the CPU platform the
same kernel on CPU tensors when the server runs with TRITON_INTERPRET=1); otherwise (`direct`, and `kernel` on the
CPU platform without the interpreter) torch index copies (`kernels/host_pages.py`). Storage pages are the format's bytes in a
layout-independent order, keyed by `storage_format_tag` (the format and its geometry), never by layout.
"""

from __future__ import annotations

import logging

import torch

from sglang_ext import compat
from sglang_ext.hicache.buffer_info import CompressedMHABufferInfo
from sglang_ext.kernels import host_pages, host_transfer

logger = logging.getLogger(__name__)


class CompressedMHAHostPool(compat.HostKVCache):
    """Host pool of `kv_format` planes: {plane name: host tensor in `layout`} (see kernels/host_pages.py).

    Constructed by SGLang's host-pool assembly with the arguments of `MHATokenToKVPoolHost`.
    """

    # Marks a host pool class that runs on the portable CPU platform too (platform/host_pool.py).
    sglang_ext_host_pool = True

    def __init__(
        self,
        buffer_info: CompressedMHABufferInfo,
        host_to_device_ratio: float,
        host_size: int,
        page_size: int,
        layout: str,
        pin_memory: bool = True,
        device: str = "cpu",
        allocator_type: str = "default",
        *,
        device_capacity_tokens: int,
        start_layer: int,
        end_layer: int,
        draft_buffer_infos=(),
        write_back_staging=None,
        pool_label: str = "kv",
        head_group_num: int = 1,
        host_token_capacity: int | None = None,
    ):
        fmt = buffer_info.kv_format
        _check_drafts(buffer_info, draft_buffer_infos)
        if layout not in host_pages.HOST_LAYOUTS:
            raise ValueError(
                f"--kv-cache-dtype {fmt.name}: --hicache-mem-layout {layout!r} is not supported; use one of "
                f"{', '.join(host_pages.HOST_LAYOUTS)} (page_first becomes page_first_direct with --hicache-io-backend direct)"
            )
        self.kv_format = fmt
        # The target's layers, then one layer per packed MTP draft pool (SGLang's host layer target_layer_num + depth,
        # loaded with is_draft=True): the draft's KV pages travel with the target's.
        self.device_layer_planes: tuple[dict[str, torch.Tensor], ...] = (
            *buffer_info.layer_planes, *(plane for draft in draft_buffer_infos for plane in draft.layer_planes))
        self.head_num = buffer_info.head_num
        self.head_dim = buffer_info.head_dim
        self.v_head_dim = buffer_info.v_head_dim
        self.target_layer_num = len(buffer_info.layer_planes)
        self.layer_num = len(self.device_layer_planes)
        self.page_size = page_size
        self.plane_specs = fmt.plane_specs()
        # Identifies the page bytes in storage keys (SGLang appends it to the model name).
        self.storage_format_tag = f"sgx-{fmt.name}-v{fmt.revision}-h{self.head_num}-d{fmt.head_dim}-r{fmt.rotary_dim}-l{self.layer_num}"
        on_cuda = buffer_info.device.type == "cuda"
        super().__init__(
            dtype=buffer_info.dtype,
            device_capacity_tokens=device_capacity_tokens,
            size_per_token=self.get_size_per_token(),
            start_layer=start_layer,
            end_layer=end_layer,
            host_to_device_ratio=host_to_device_ratio,
            host_size=host_size,
            page_size=page_size,
            layout=layout,
            pin_memory=bool(pin_memory and on_cuda),
            device=device,
            allocator_type=allocator_type,
            pool_label=pool_label,
            host_token_capacity=host_token_capacity,
        )
        logger.info(
            "sglang-ext HiCache host pool: %s, layout %s, %d tokens, %d bytes per token (%d per token per KV head)",
            fmt.name,
            layout,
            self.size,
            self.size_per_token,
            fmt.bytes_per_token_head,
        )

    # -- sizing and storage ------------------------------------------------------------------------------

    def get_size_per_token(self) -> int:
        """Host bytes one token takes: every plane of every layer (codes and scales)."""
        return self.kv_format.bytes_per_token_head * self.head_num * self.layer_num

    def get_ksize_per_token(self) -> int:
        return sum(
            torch.empty((), dtype=dtype).element_size() * _prod(tail) * self.head_num * self.layer_num
            for name, (dtype, tail) in self.plane_specs.items()
            if name.startswith("k")
        )

    def init_kv_buffer(self) -> dict[str, torch.Tensor]:
        return host_pages.allocate_host_planes(
            self.plane_specs, self.layout, self.layer_num, self.size, self.page_size, self.head_num, pin=self.pin_memory
        )

    @property
    def host_planes(self) -> dict[str, torch.Tensor]:
        return self.kv_buffer

    def destroy(self) -> None:
        if getattr(self, "_destroyed", False):
            return
        self._destroyed = True
        if self.pin_memory and self.kv_buffer is not None:
            host_pages.unpin_host_planes(self.kv_buffer)
        self.kv_buffer = None

    # -- device <-> host -----------------------------------------------------------------------------------

    def _use_kernel(self, io_backend) -> bool:
        """`kernel` moves pages with the Triton kernel where it can run: device planes on a GPU with page-locked
        host planes, or CPU planes in a process that runs Triton under its interpreter (TRITON_INTERPRET=1 at
        start-up). Otherwise, and always with `direct`, torch index copies move the same bytes."""
        if io_backend != "kernel":
            return False
        plane = self.device_layer_planes[0][next(iter(self.plane_specs))]
        use = self.pin_memory if plane.is_cuda else plane.device.type == "cpu" and host_transfer.runs_on_cpu_tensors()
        if not getattr(self, "_kernel_choice_logged", False):
            self._kernel_choice_logged = True
            logger.info("sglang-ext HiCache host pool: --hicache-io-backend kernel moves pages with %s on %s tensors",
                        "the Triton copy kernel" if use else "torch index copies", plane.device.type)
        return use

    def load_to_device_per_layer(
        self, device_pool, host_indices, device_indices, layer_id, io_backend, *, is_draft: bool = False
    ) -> None:
        # As SGLang's MHA host pool: target layers by id; a packed draft layer only when the controller asks for it
        # (is_draft, layer_id = its host layer).
        if not 0 <= layer_id < (self.layer_num if is_draft else self.target_layer_num):
            return
        if self._use_kernel(io_backend):
            host_transfer.load_layer(self.host_planes, self.device_layer_planes[layer_id], self.layout, layer_id,
                                     host_indices, device_indices)
            return
        host_pages.load_layer(
            self.host_planes,
            self.device_layer_planes[layer_id],
            self.layout,
            layer_id,
            host_indices,
            device_indices,
            self.page_size,
        )

    def backup_from_device_all_layer(self, device_pool, host_indices, device_indices, io_backend) -> None:
        if self._use_kernel(io_backend):
            host_transfer.backup_layers(self.host_planes, list(self.device_layer_planes), self.layout, host_indices,
                                        device_indices)
            return
        host_pages.backup_layers(
            self.host_planes, list(self.device_layer_planes), self.layout, host_indices, device_indices, self.page_size
        )

    # -- pages for the storage tier ------------------------------------------------------------------------

    @property
    def page_nbytes(self) -> int:
        return host_pages.page_nbytes(self.plane_specs, self.layer_num, self.page_size, self.head_num)

    def get_data_page(self, index, flat: bool = True) -> torch.Tensor:
        return host_pages.page_bytes(self.host_planes, self.layout, int(index), self.page_size)

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros(self.page_nbytes, dtype=torch.uint8)

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        host_pages.set_page_bytes(self.host_planes, self.layout, int(index), self.page_size, data_page)

    def get_page_buffer_meta(self, indices):
        raise NotImplementedError(
            f"--kv-cache-dtype {self.kv_format.name}: zero-copy HiCache storage backends are not supported; "
            "use a backend on the generic page path (file, or any backend outside SGLang's zero-copy list)"
        )

    def is_stride_page_aligned(self, page_size_bytes: int = 4096) -> bool:
        return False


def _check_drafts(buffer_info: CompressedMHABufferInfo, draft_buffer_infos) -> None:
    """Packed MTP draft pools (NEXTN with --enable-hierarchical-cache) must hold one layer of the target's format
    and geometry each, as SGLang's MHA host pool requires of dense drafts."""
    fmt = buffer_info.kv_format
    for depth, draft in enumerate(draft_buffer_infos):
        draft_fmt = getattr(draft, "kv_format", None)
        if draft_fmt is None or (draft_fmt.name, draft_fmt.head_dim, draft_fmt.rotary_dim) != (
            fmt.name, fmt.head_dim, fmt.rotary_dim
        ):
            raise ValueError(
                f"--kv-cache-dtype {fmt.name} with --enable-hierarchical-cache: the MTP draft's KV pool is "
                f"{draft_fmt.name if draft_fmt is not None else 'dense'}; the host tier needs the draft in the "
                "target's format (leave --speculative-draft-kv-cache-dtype unset)"
            )
        geometry = (draft.head_num, draft.head_dim, draft.v_head_dim, len(draft.layer_planes))
        if geometry != (buffer_info.head_num, buffer_info.head_dim, buffer_info.v_head_dim, 1):
            raise ValueError(
                f"--kv-cache-dtype {fmt.name} with --enable-hierarchical-cache: packed MTP draft[{depth}] has "
                f"(heads, K width, V width, layers) = {geometry}, expected "
                f"{(buffer_info.head_num, buffer_info.head_dim, buffer_info.v_head_dim, 1)}"
            )


def _prod(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
