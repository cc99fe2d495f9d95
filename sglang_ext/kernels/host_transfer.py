"""Triton row copies between the HiCache host tier and the device pool, for any KV format's planes.

One plane row is one token slot of one layer: [H, *tail] of the plane's dtype, moved as opaque words (codes and
scales alike), so the same kernel moves bf16, int8 and octave planes. The host plane is page-locked
(`host_pages.allocate_host_planes(pin=True)`, one cudaHostRegister): on a GPU the kernel reads or writes it in
place through unified virtual addressing, so a load or backup is one launch per (layer, plane), with no staging
copy and no pageable round trip. On CPU tensors (the Triton interpreter) the same code runs as a plain gather.

Host slot s of a layer sits at `(s // page) * page_stride + (s % page) * row_stride + layer_offset` words, which
covers the three host layouts of `host_pages` (layer_first and page_first with page = 1). `host_pages.py` is the
spec: tests compare the two under TRITON_INTERPRET=1, and a CPU-platform server with `--hicache-io-backend kernel`
started with TRITON_INTERPRET=1 moves its pages through this kernel on CPU tensors (`hicache/host_pool.py`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

_WORDS = (torch.int64, torch.int32, torch.int16, torch.uint8)


@triton.jit
def _copy_rows_kernel(src_ptr, dst_ptr, src_idx_ptr, dst_idx_ptr, n_rows,
                      src_page, src_page_stride, src_row_stride, src_base,
                      dst_page, dst_page_stride, dst_row_stride, dst_base,
                      ROW_WORDS: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    live = r < n_rows
    s = tl.load(src_idx_ptr + r, mask=live, other=0).to(tl.int64)
    d = tl.load(dst_idx_ptr + r, mask=live, other=0).to(tl.int64)
    src_off = src_base + (s // src_page) * src_page_stride + (s % src_page) * src_row_stride
    dst_off = dst_base + (d // dst_page) * dst_page_stride + (d % dst_page) * dst_row_stride
    for start in tl.static_range(0, ROW_WORDS, BLOCK):
        w = start + tl.arange(0, BLOCK)
        m = live[:, None] & (w < ROW_WORDS)[None, :]
        x = tl.load(src_ptr + src_off[:, None] + w[None, :], mask=m)
        tl.store(dst_ptr + dst_off[:, None] + w[None, :], x, mask=m)


def runs_on_cpu_tensors() -> bool:
    """Whether the copy kernel runs under Triton's interpreter, i.e. on CPU tensors (triton.jit chose the
    interpreter because TRITON_INTERPRET was set when this module was imported). Otherwise it needs GPU planes."""
    return isinstance(_copy_rows_kernel, InterpretedFunction)


def word_dtype(*byte_counts: int) -> torch.dtype:
    """The widest integer word that divides every row size, stride and offset given (in bytes)."""
    for dt in _WORDS:
        size = torch.empty((), dtype=dt).element_size()
        if all(n % size == 0 for n in byte_counts):
            return dt
    raise AssertionError("uint8 divides everything")


class RowSpace:
    """Where slot s's row lies in a flat plane buffer: `base + (s // page) * page_stride + (s % page) * row_stride`
    bytes. `flat` is the whole plane buffer as uint8 (contiguous)."""

    def __init__(self, flat: torch.Tensor, page: int, page_stride: int, row_stride: int, base: int):
        assert flat.dtype == torch.uint8 and flat.dim() == 1 and flat.is_contiguous()
        self.flat, self.page, self.page_stride, self.row_stride, self.base = flat, page, page_stride, row_stride, base

    def byte_counts(self) -> tuple[int, ...]:
        return self.page_stride, self.row_stride, self.base, self.flat.data_ptr(), self.flat.numel()


def device_rows(plane: torch.Tensor) -> RowSpace:
    """A device plane [slots, H, *tail] (contiguous): slot s at s * row bytes."""
    assert plane.is_contiguous(), "device plane must be contiguous"
    row = plane[0].numel() * plane.element_size()
    return RowSpace(plane.view(-1).view(torch.uint8), 1, row, row, 0)


def host_rows(plane: torch.Tensor, layout: str, layer: int) -> RowSpace:
    """One layer of a host plane in `layout` (host_pages.HOST_LAYOUTS), as byte offsets into the whole plane."""
    assert plane.is_contiguous(), "host plane must be contiguous"
    es = plane.element_size()
    flat = plane.view(-1).view(torch.uint8)
    if layout == "layer_first":  # [layers, slots, H, *tail]
        row = plane[0, 0].numel() * es
        return RowSpace(flat, 1, row, row, layer * plane.stride(0) * es)
    if layout == "page_first":  # [slots, layers, H, *tail]
        return RowSpace(flat, 1, plane.stride(0) * es, plane.stride(0) * es, layer * plane.stride(1) * es)
    if layout == "page_first_direct":  # [pages, layers, page_size, H, *tail]
        return RowSpace(flat, plane.shape[2], plane.stride(0) * es, plane.stride(2) * es, layer * plane.stride(1) * es)
    raise ValueError(f"host layout {layout!r}")


def copy_rows(src: RowSpace, dst: RowSpace, src_slots: torch.Tensor, dst_slots: torch.Tensor, row_bytes: int) -> None:
    """dst row dst_slots[i] = src row src_slots[i], row_bytes each. The index tensors live where the kernel runs
    (the device of whichever side is on the GPU, or CPU under the interpreter)."""
    n = src_slots.numel()
    assert dst_slots.numel() == n, f"{n} source slots, {dst_slots.numel()} destination slots"
    if n == 0:
        return
    wdt = word_dtype(row_bytes, *src.byte_counts(), *dst.byte_counts())
    ws = torch.empty((), dtype=wdt).element_size()
    row_words = row_bytes // ws
    block = min(triton.next_power_of_2(row_words), 256)
    rows = max(1, min(64, 2048 // block))
    grid = (triton.cdiv(n, rows),)
    _copy_rows_kernel[grid](
        src.flat.view(wdt), dst.flat.view(wdt), src_slots, dst_slots, n,
        src.page, src.page_stride // ws, src.row_stride // ws, src.base // ws,
        dst.page, dst.page_stride // ws, dst.row_stride // ws, dst.base // ws,
        ROW_WORDS=row_words, ROWS=rows, BLOCK=block,
    )


def row_bytes_of(device_plane: torch.Tensor) -> int:
    return device_plane[0].numel() * device_plane.element_size()


def load_layer(host_planes: dict[str, torch.Tensor], device_planes: dict[str, torch.Tensor], layout: str, layer: int,
               host_indices: torch.Tensor, device_indices: torch.Tensor) -> None:
    """Host -> device for one layer, one launch per plane (same contract as host_pages.load_layer)."""
    for name, dst in device_planes.items():
        idx_dev = dst.device
        copy_rows(host_rows(host_planes[name], layout, layer), device_rows(dst),
                  host_indices.to(idx_dev, torch.int64), device_indices.to(idx_dev, torch.int64), row_bytes_of(dst))


def backup_layers(host_planes: dict[str, torch.Tensor], device_layer_planes: list[dict[str, torch.Tensor]],
                  layout: str, host_indices: torch.Tensor, device_indices: torch.Tensor) -> None:
    """Device -> host for every layer (same contract as host_pages.backup_layers); waits for the copies."""
    hidx = didx = None
    for layer, planes in enumerate(device_layer_planes):
        for name, src in planes.items():
            if hidx is None:
                hidx = host_indices.to(src.device, torch.int64)
                didx = device_indices.to(src.device, torch.int64)
            copy_rows(device_rows(src), host_rows(host_planes[name], layout, layer), didx, hidx, row_bytes_of(src))
    if device_layer_planes and next(iter(device_layer_planes[0].values())).is_cuda:
        torch.cuda.current_stream().synchronize()
