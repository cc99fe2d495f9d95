"""Synthetic PLE tables as safetensors files, for the benchmark and the tests.

Row r's bytes are a pure function of (r, seed) (`pattern_rows`), so a gather can be verified without a second
copy of the table in RAM and without trusting the reader under test. Writing is streamed in chunks, so
building a table larger than RAM is fine.
"""

from __future__ import annotations

import json
import os
import struct

import torch
from tqdm import tqdm

from sglang_ext.ple.layout import TORCH_TO_SAFETENSORS

PATTERN_SEED_KEY = "sglang_ext.ple.pattern_seed"

_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_M1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_M2 = 0x94D049BB133111EB - (1 << 64)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64 finaliser on int64 (wrapping), logical shifts emulated with masks."""
    x = x ^ ((x >> 30) & ((1 << 34) - 1))
    x = x * _M1
    x = x ^ ((x >> 27) & ((1 << 37) - 1))
    x = x * _M2
    return x ^ ((x >> 31) & ((1 << 33) - 1))


def pattern_rows(rows: torch.Tensor, row_bytes: int, seed: int = 0) -> torch.Tensor:
    """The synthetic bytes of table rows `rows` ([n] int64) -> [n, row_bytes] uint8."""
    words = -(-row_bytes // 8)
    idx = rows.to(torch.int64).view(-1, 1) * words + torch.arange(words, dtype=torch.int64)
    x = _mix(idx + (seed + 1) * _GOLDEN)
    return x.view(torch.uint8).view(rows.numel(), words * 8)[:, :row_bytes]


def safetensors_header(tensors: list[tuple[str, torch.dtype, tuple[int, ...]]], metadata: dict[str, str]) -> bytes:
    """The 8-byte length + JSON header for tensors laid out back to back in the given order."""
    header: dict = {"__metadata__": metadata}
    offset = 0
    for name, dtype, shape in tensors:
        nbytes = torch.empty(0, dtype=dtype).element_size()
        for d in shape:
            nbytes *= d
        header[name] = {"dtype": TORCH_TO_SAFETENSORS[dtype], "shape": list(shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data area starts 8-byte aligned
    return struct.pack("<Q", len(raw)) + raw


def write_table_file(
    path: str,
    num_rows: int,
    dim: int,
    dtype: torch.dtype = torch.bfloat16,
    *,
    tensor_name: str = "table",
    seed: int = 0,
    chunk_rows: int = 1 << 16,
    progress: bool = False,
) -> None:
    """Write a one-tensor safetensors file whose rows are `pattern_rows(r, row_bytes, seed)`.

    Written to `path + ".partial"` then renamed, so an interrupted build never leaves a file that looks done.
    """
    row_bytes = dim * torch.empty(0, dtype=dtype).element_size()
    header = safetensors_header([(tensor_name, dtype, (num_rows, dim))], {PATTERN_SEED_KEY: str(seed)})
    tmp = path + ".partial"
    bar = tqdm(total=num_rows * row_bytes, unit="B", unit_scale=True, desc=f"writing {os.path.basename(path)}",
               disable=not progress)
    with open(tmp, "wb") as f:
        f.write(header)
        for start in range(0, num_rows, chunk_rows):
            rows = torch.arange(start, min(start + chunk_rows, num_rows), dtype=torch.int64)
            data = pattern_rows(rows, row_bytes, seed)
            f.write(data.numpy().tobytes())
            bar.update(data.numel())
    bar.close()
    os.replace(tmp, path)


def write_table_tensors(path: str, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    """Write real tensors (in dict order) as one safetensors file; a tiny stand-in for a checkpoint shard."""
    specs = [(name, t.dtype, tuple(t.shape)) for name, t in tensors.items()]
    with open(path, "wb") as f:
        f.write(safetensors_header(specs, metadata or {}))
        for t in tensors.values():
            f.write(t.contiguous().view(torch.uint8).numpy().tobytes())
