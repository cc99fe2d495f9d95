"""Where a PLE table's rows live inside a checkpoint's safetensors shards.

A table is one logical `[num_rows, dim]` matrix whose rows may be spread over several safetensors tensors
(qwen4_exp stores each n-gram table as `...ngram_embedding.shard_{i}.weight`, rows concatenated in shard
order) and several shard files. The layout is read from the files' headers only; no tensor data is read and
nothing is rewritten. Pure Python + torch: never imports sglang.

safetensors file format: 8-byte little-endian header length N, then N bytes of JSON
`{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}`, then the data area;
`data_offsets` are relative to the start of the data area (byte 8 + N).
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from typing import Sequence

import torch

# safetensors dtype tag -> torch dtype (the ones an embedding table can have).
SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "U8": torch.uint8,
    "I8": torch.int8,
}
TORCH_TO_SAFETENSORS = {v: k for k, v in SAFETENSORS_DTYPES.items()}

# A header larger than this is not a safetensors file (the format caps it at 100 MB).
_MAX_HEADER_BYTES = 100 * 1024 * 1024


class PleTableError(ValueError):
    """A table cannot be served as configured: missing or truncated shard, wrong shape or dtype."""


@dataclass(frozen=True)
class TensorEntry:
    """One tensor in one safetensors file. `file_offset` is absolute (header included)."""

    path: str
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    file_offset: int
    nbytes: int


def read_safetensors_header(path: str) -> tuple[dict[str, TensorEntry], dict[str, str]]:
    """Parse one file's header. Returns (tensors by name, `__metadata__`).

    Raises PleTableError if the file is missing, is not safetensors, or is shorter than its header says
    (a truncated download or copy).
    """
    if not os.path.isfile(path):
        raise PleTableError(f"PLE table shard is missing: {path}")
    file_size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise PleTableError(f"PLE table shard {path} is {file_size} bytes: too short for a safetensors header")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > _MAX_HEADER_BYTES or 8 + header_len > file_size:
            raise PleTableError(
                f"PLE table shard {path}: header length {header_len} does not fit in a {file_size}-byte file "
                "(truncated, or not a safetensors file)"
            )
        raw = f.read(header_len)
    try:
        header = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise PleTableError(f"PLE table shard {path}: header is not valid JSON ({exc})") from exc
    metadata = header.pop("__metadata__", {}) or {}
    data_start = 8 + header_len
    entries: dict[str, TensorEntry] = {}
    for name, info in header.items():
        begin, end = (int(x) for x in info["data_offsets"])
        dtype = SAFETENSORS_DTYPES.get(info["dtype"])
        if dtype is None:
            # Not an embedding dtype we serve; keep it out rather than fail: other tensors share the file.
            continue
        shape = tuple(int(d) for d in info["shape"])
        entries[name] = TensorEntry(path, name, dtype, shape, data_start + begin, end - begin)
    max_end = max((e.file_offset + e.nbytes for e in entries.values()), default=data_start)
    if max_end > file_size:
        raise PleTableError(
            f"PLE table shard {path} is truncated: its header needs {max_end} bytes, the file has {file_size}"
        )
    return entries, metadata


def index_safetensors_dir(model_dir: str) -> dict[str, TensorEntry]:
    """All tensors of every `*.safetensors` file in `model_dir` (headers only), by tensor name.

    Uses `model.safetensors.index.json` when present so a shard listed there but absent on disk is reported
    by name instead of surfacing later as a missing tensor.
    """
    index_path = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.isfile(index_path):
        with open(index_path) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = sorted(n for n in os.listdir(model_dir) if n.endswith(".safetensors"))
    if not files:
        raise PleTableError(f"no safetensors files in {model_dir}")
    entries: dict[str, TensorEntry] = {}
    for name in files:
        entries.update(read_safetensors_header(os.path.join(model_dir, name))[0])
    return entries


@dataclass(frozen=True)
class TableSegment:
    """Rows [row_start, row_start + num_rows) of the table, stored contiguously at `file_offset` in `path`."""

    path: str
    file_offset: int
    row_start: int
    num_rows: int


@dataclass(frozen=True)
class TableLayout:
    """A `[num_rows, dim]` table of `dtype` as a list of contiguous segments, in row order, no gaps."""

    segments: tuple[TableSegment, ...]
    num_rows: int
    dim: int
    dtype: torch.dtype

    @property
    def row_bytes(self) -> int:
        return self.dim * torch.empty(0, dtype=self.dtype).element_size()

    @property
    def nbytes(self) -> int:
        return self.num_rows * self.row_bytes

    @classmethod
    def from_entries(
        cls,
        entries: Sequence[TensorEntry],
        *,
        expected_rows: int | None = None,
        expected_dim: int | None = None,
        expected_dtype: torch.dtype | None = None,
    ) -> "TableLayout":
        """Concatenate 2-D tensors along rows, in the given order.

        `expected_*` come from the model config; any mismatch raises PleTableError naming both values. The
        table may have fewer rows in the checkpoint than `expected_rows` only if the caller passes None.
        """
        if not entries:
            raise PleTableError("PLE table has no tensors")
        first = entries[0]
        dim, dtype = (first.shape[1] if len(first.shape) == 2 else -1), first.dtype
        segments = []
        row = 0
        for e in entries:
            if len(e.shape) != 2:
                raise PleTableError(f"PLE table tensor {e.name} in {e.path} has shape {list(e.shape)}, expected 2-D")
            if e.shape[1] != dim or e.dtype != dtype:
                raise PleTableError(
                    f"PLE table tensor {e.name} is {list(e.shape)} {e.dtype}; the table's first tensor "
                    f"{first.name} is [*, {dim}] {dtype}"
                )
            segments.append(TableSegment(e.path, e.file_offset, row, e.shape[0]))
            row += e.shape[0]
        layout = cls(tuple(segments), row, dim, dtype)
        if expected_dtype is not None and dtype != expected_dtype:
            raise PleTableError(
                f"PLE table {first.name} is {dtype} in the checkpoint, the model expects {expected_dtype}")
        if expected_dim is not None and dim != expected_dim:
            raise PleTableError(f"PLE table {first.name} has rows of {dim} elements, the model expects {expected_dim}")
        if expected_rows is not None and row != expected_rows:
            raise PleTableError(
                f"PLE table {first.name}...: {row} rows in {len(entries)} tensor(s), the model expects {expected_rows}"
            )
        return layout

    @classmethod
    def from_safetensors(
        cls,
        path: str,
        tensor_name: str,
        *,
        expected_rows: int | None = None,
        expected_dim: int | None = None,
        expected_dtype: torch.dtype | None = None,
    ) -> "TableLayout":
        """A table that is one tensor of one file."""
        entries, _ = read_safetensors_header(path)
        if tensor_name not in entries:
            raise PleTableError(f"tensor {tensor_name!r} not found in {path}")
        return cls.from_entries(
            [entries[tensor_name]], expected_rows=expected_rows, expected_dim=expected_dim,
            expected_dtype=expected_dtype)
