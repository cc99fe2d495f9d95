"""Host-tier storage of a KV format's planes and the page moves between device and host. Pure torch (core).

The HiCache host tier keeps the same planes as the device pool (codes and scales of one format), in one of
three host layouts. For a plane whose device rows are [num_slots, H, *tail]:
  layer_first       : [layers, host_slots, H, *tail]
  page_first        : [host_slots, layers, H, *tail]            (all layers of a token together)
  page_first_direct : [host_pages, layers, page_size, H, *tail]  (all layers of a page together)
`host_layer_view` gives the per-layer [host_slots, H, *tail] (or [host_pages, page_size, H, *tail]) view;
moves are index copies, so they run on CPU tensors and, with pinned host planes, on CUDA device planes too
(gather on the host side, one non-blocking copy, scatter on the device side). Only the CPU path has been run
in this project's CI.

A page serialized for the storage tier (`page_bytes`) is layout-independent: for each plane in the format's
plane order, its rows as [layers, page_size, H, *tail], as raw bytes. Two hosts with different layouts read
each other's pages; the storage key names the format, not the layout.
"""

from __future__ import annotations

import torch

HOST_LAYOUTS = ("layer_first", "page_first", "page_first_direct")

# plane name -> (dtype, tail shape), as KVFormat.plane_specs() returns it.
PlaneSpecs = dict[str, tuple[torch.dtype, tuple[int, ...]]]


def check_layout(layout: str) -> None:
    if layout not in HOST_LAYOUTS:
        raise ValueError(f"host layout {layout!r} is not supported for compressed KV; supported: {', '.join(HOST_LAYOUTS)}")


_PLANE_ALIGN = 64  # bytes; each plane starts on a cache line inside the one host buffer


def allocate_host_planes(
    specs: PlaneSpecs, layout: str, num_layers: int, num_slots: int, page_size: int, num_heads: int, *, pin: bool
) -> dict[str, torch.Tensor]:
    """Uninitialized host planes for `num_slots` token slots (a multiple of page_size) of every layer.

    All planes are views into one host byte buffer. pin=True page-locks that buffer with one cudaHostRegister
    (torch's pinned allocator would round a large pool up to a power of two); `unpin_host_planes` undoes it.
    """
    check_layout(layout)
    if num_slots % page_size:
        raise ValueError(f"host slots {num_slots} must be a multiple of page_size {page_size}")
    shapes, offsets, total = {}, {}, 0
    for name, (dtype, tail) in specs.items():
        if layout == "layer_first":
            shape = (num_layers, num_slots, num_heads, *tail)
        elif layout == "page_first":
            shape = (num_slots, num_layers, num_heads, *tail)
        else:
            shape = (num_slots // page_size, num_layers, page_size, num_heads, *tail)
        shapes[name] = shape
        offsets[name] = total
        nbytes = torch.empty((), dtype=dtype).element_size()
        for d in shape:
            nbytes *= d
        total += -(-nbytes // _PLANE_ALIGN) * _PLANE_ALIGN
    buffer = torch.empty(total, dtype=torch.uint8, device="cpu")
    if pin and total:
        rc = int(torch.cuda.cudart().cudaHostRegister(buffer.data_ptr(), total, 0))
        if rc != 0:
            raise RuntimeError(f"cudaHostRegister of the {total / 1e9:.2f} GB HiCache host planes failed (rc={rc})")
    planes = {}
    for name, (dtype, _) in specs.items():
        n = 1
        for d in shapes[name]:
            n *= d
        n *= torch.empty((), dtype=dtype).element_size()
        planes[name] = buffer[offsets[name] : offsets[name] + n].view(dtype).view(shapes[name])
    return planes


def unpin_host_planes(planes: dict[str, torch.Tensor]) -> None:
    """Undo allocate_host_planes(pin=True): unregister the buffer the planes share."""
    if planes:
        base = next(iter(planes.values())).untyped_storage().data_ptr()
        torch.cuda.cudart().cudaHostUnregister(base)


def host_layer_view(plane: torch.Tensor, layout: str, layer: int) -> torch.Tensor:
    """One layer of a host plane (a view, no copy)."""
    if layout == "layer_first":
        return plane[layer]
    return plane[:, layer]


def _host_index(layout: str, host_indices: torch.Tensor, page_size: int) -> tuple[torch.Tensor, ...]:
    idx = host_indices.to(device="cpu", dtype=torch.long)
    if layout == "page_first_direct":
        return idx // page_size, idx % page_size
    return (idx,)


def _to_device(rows: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type == "cpu":
        return rows
    return rows.pin_memory().to(device, non_blocking=True)


def load_layer(
    host_planes: dict[str, torch.Tensor],
    device_planes: dict[str, torch.Tensor],
    layout: str,
    layer: int,
    host_indices: torch.Tensor,
    device_indices: torch.Tensor,
    page_size: int,
) -> None:
    """Host -> device for one layer: device_planes[name][device_indices[i]] = host row host_indices[i].

    device_planes: {name: [device_slots, H, *tail]} (mutated); host_planes are read only.
    """
    hidx = _host_index(layout, host_indices, page_size)
    for name, dst in device_planes.items():
        rows = host_layer_view(host_planes[name], layout, layer)[hidx]
        didx = device_indices.to(device=dst.device, dtype=torch.long)
        dst[didx] = _to_device(rows, dst.device)


def backup_layers(
    host_planes: dict[str, torch.Tensor],
    device_layer_planes: list[dict[str, torch.Tensor]],
    layout: str,
    host_indices: torch.Tensor,
    device_indices: torch.Tensor,
    page_size: int,
) -> None:
    """Device -> host for every layer: host row host_indices[i] = device slot device_indices[i].

    host_planes are mutated; device planes are read only. Waits for the device copies to finish.
    """
    hidx = _host_index(layout, host_indices, page_size)
    for layer, planes in enumerate(device_layer_planes):
        for name, src in planes.items():
            didx = device_indices.to(device=src.device, dtype=torch.long)
            rows = src[didx]
            if rows.device.type != "cpu":
                rows = rows.to("cpu")
            host_layer_view(host_planes[name], layout, layer)[hidx] = rows


def _page_of(plane: torch.Tensor, layout: str, index: int, page_size: int) -> torch.Tensor:
    """The page that starts at host slot `index` as a [layers, page_size, H, *tail] view."""
    if index % page_size:
        raise ValueError(f"host slot {index} is not at a page start (page_size {page_size})")
    if layout == "layer_first":
        return plane[:, index : index + page_size]
    if layout == "page_first":
        return plane[index : index + page_size].transpose(0, 1)
    return plane[index // page_size]


def page_nbytes(specs: PlaneSpecs, num_layers: int, page_size: int, num_heads: int) -> int:
    total = 0
    for dtype, tail in specs.values():
        n = num_layers * page_size * num_heads * torch.empty((), dtype=dtype).element_size()
        for t in tail:
            n *= t
        total += n
    return total


def page_bytes(host_planes: dict[str, torch.Tensor], layout: str, index: int, page_size: int) -> torch.Tensor:
    """The page at host slot `index` as a new flat uint8 tensor, layout-independent (see module doc)."""
    parts = [_page_of(p, layout, index, page_size).contiguous().view(torch.uint8).flatten() for p in host_planes.values()]
    return torch.cat(parts)


def set_page_bytes(host_planes: dict[str, torch.Tensor], layout: str, index: int, page_size: int, data: torch.Tensor) -> None:
    """Inverse of `page_bytes`: write the flat uint8 `data` into the page at host slot `index`."""
    data = data.view(torch.uint8).flatten()
    offset = 0
    for plane in host_planes.values():
        dst = _page_of(plane, layout, index, page_size)
        n = dst.numel() * dst.element_size()
        if offset + n > data.numel():
            raise ValueError(f"page data has {data.numel()} bytes, the format's page needs more than {offset + n}")
        chunk = data[offset : offset + n]
        if chunk.storage_offset() % plane.element_size():
            chunk = chunk.clone()  # a dtype view needs an aligned start
        src = chunk.view(plane.dtype).view(dst.shape)
        dst.copy_(src)
        offset += n
    if offset != data.numel():
        raise ValueError(f"page data has {data.numel()} bytes, the format's page has {offset}")
