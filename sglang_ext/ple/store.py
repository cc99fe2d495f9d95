"""SSD-resident PLE / n-gram embedding table: gather rows of a table that stays in the checkpoint's files.

Per gather (one batch):
  1. ids -> int64 on the host; bounds-checked; sorted unique with inverse (numpy's, see gather): each row
     read once, in file order.
  2. Rows held by the hot-row cache (if any) come from RAM; the rest are read by the row reader
     (`readers.py`, bounded thread pool) into a staging buffer allocated once (pinned when the target is a
     CUDA device; a stable address, so nothing is allocated per step).
  3. CUDA: staging -> device on a side stream, the caller's stream waits on it. CPU: no copy.
  4. `unique_rows[inverse]` restores the caller's order and duplicates.
Batches with more unique rows than the staging capacity are done in capacity-sized chunks.

Resident memory: hot cache (`cache_bytes`) + staging (`staging_rows * row_bytes`, plus the same again on the
device) + the reader's own (`pread`: nothing; `mmap`: at most `mmap_rss_bytes` of mapped pages). It does not
depend on the table size. Pure torch/numpy: never imports sglang.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import torch

from sglang_ext.ple.hot_cache import HotRowCache
from sglang_ext.ple.layout import TableLayout
from sglang_ext.ple.readers import READERS, make_reader

# Unique rows per hot-cache lookup/insert round.
_CACHE_BLOCK_ROWS = 16384


@dataclass(frozen=True)
class PleStoreConfig:
    """How a table is served. Validated on construction."""

    reader: str = "pread"
    threads: int = 8
    cache_bytes: int = 0
    # Unique rows per staging chunk. 131072 rows = one 8k-token prefill at 16 rows per token.
    staging_rows: int = 131072
    # Only for reader="mmap": mapped pages kept before MADV_DONTNEED.
    mmap_rss_bytes: int = 64 << 20
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.reader not in READERS:
            raise ValueError(f"unknown PLE row reader {self.reader!r}; choose from {READERS}")
        if not 1 <= self.threads <= 256:
            raise ValueError(f"threads must be in [1, 256], got {self.threads}")
        if self.cache_bytes < 0:
            raise ValueError(f"cache_bytes must be >= 0, got {self.cache_bytes}")
        if self.staging_rows < 1:
            raise ValueError(f"staging_rows must be >= 1, got {self.staging_rows}")
        if torch.device(self.device).type not in ("cpu", "cuda"):
            raise ValueError(f"PLE store device must be cpu or cuda (ROCm is cuda to torch), got {self.device}")


class PleTableStore:
    """Read-only row gathers from a `TableLayout`. One gather at a time (a lock serialises callers)."""

    def __init__(self, layout: TableLayout, config: PleStoreConfig = PleStoreConfig()) -> None:
        self.layout = layout
        self.config = config
        self.device = torch.device(config.device)
        self.num_rows, self.dim, self.dtype = layout.num_rows, layout.dim, layout.dtype
        self.row_bytes = layout.row_bytes
        self._reader = make_reader(config.reader, layout, config.threads, config.mmap_rss_bytes)
        self._cache = HotRowCache(config.cache_bytes, self.row_bytes) if config.cache_bytes else None
        if self._cache is not None:
            self._miss_buf = np.empty((_CACHE_BLOCK_ROWS, self.row_bytes), dtype=np.uint8)
        cuda = self.device.type == "cuda"
        # staging: [staging_rows, row_bytes] uint8, allocated once; pinned for async H2D.
        self._staging = torch.empty((config.staging_rows, self.row_bytes), dtype=torch.uint8, pin_memory=cuda)
        self._staging_np = self._staging.numpy()
        if cuda:
            self._device_rows = torch.empty((config.staging_rows, self.row_bytes), dtype=torch.uint8,
                                            device=self.device)
            self._copy_stream = torch.cuda.Stream(device=self.device)
        self._lock = threading.Lock()
        self.rows_read = 0
        self.rows_requested = 0

    @property
    def resident_bytes(self) -> int:
        """Host bytes this store can hold whatever the table size: hot cache (+ its miss buffer) + staging
        (+ the mmap reader's mapped pages, at most `mmap_rss_bytes`)."""
        mapped = self.config.mmap_rss_bytes if self.config.reader == "mmap" else 0
        cache = self._cache.nbytes + self._miss_buf.nbytes if self._cache else 0
        return cache + self._staging.numel() + mapped

    def gather(self, ids: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows of the table at `ids`.

        ids: any shape, integer, any device; every value in [0, num_rows) (else IndexError).
        out: optional [*ids.shape, dim] of the table dtype on the store's device; filled in place.
        Returns out (or a new tensor) = table[ids], bit-identical to the file's bytes.
        """
        shape = (*ids.shape, self.dim)
        if out is None:
            out = torch.empty(shape, dtype=self.dtype, device=self.device)
        elif tuple(out.shape) != shape or out.dtype != self.dtype or out.device != self.device:
            raise ValueError(f"out is {list(out.shape)} {out.dtype} {out.device}, expected {list(shape)} {self.dtype} "
                             f"{self.device}")
        flat = ids.reshape(-1).to(device="cpu", dtype=torch.int64)
        if flat.numel() == 0:
            return out
        flat_np = flat.numpy()
        lo, hi = int(flat_np.min()), int(flat_np.max())
        if lo < 0 or hi >= self.num_rows:
            raise IndexError(f"PLE row ids span [{lo}, {hi}], the table has {self.num_rows} rows")
        # numpy's sort-based unique: 4-7 ms for 131k ids on one core, where torch.unique under a loaded
        # 2-core box took 170-200 ms with its intra-op threads (docs/benchmarks/ple.md).
        uniq, inverse = np.unique(flat_np, return_inverse=True)
        inverse = inverse.reshape(-1)
        out_bytes = out.view(-1, self.dim).view(torch.uint8)  # [N, row_bytes]
        with self._lock:
            self.rows_requested += flat.numel()
            cap = self.config.staging_rows
            if uniq.shape[0] <= cap:
                self._fill_chunk(uniq, inverse, out_bytes)
            else:
                for a in range(0, uniq.shape[0], cap):
                    b = min(a + cap, uniq.shape[0])
                    sel = (inverse >= a) & (inverse < b)
                    self._fill_chunk(uniq[a:b], inverse[sel] - a, out_bytes, sel)
        return out

    def _fill_chunk(self, rows: np.ndarray, inverse: np.ndarray, out_bytes: torch.Tensor,
                    select: np.ndarray | None = None) -> None:
        """Stage `rows` (sorted unique, <= staging_rows), then out_bytes[select] = staged[inverse]."""
        n = rows.shape[0]
        staged = self._staging_np[:n]
        if self._cache is None:
            self._reader.read_rows(rows, staged)
            self.rows_read += n
        else:
            # In blocks, so the cache's temporaries stay bounded by the block, not the batch.
            for a in range(0, n, _CACHE_BLOCK_ROWS):
                block, dst = rows[a : a + _CACHE_BLOCK_ROWS], staged[a : a + _CACHE_BLOCK_ROWS]
                hit, slots = self._cache.lookup(block)
                hit_idx, miss_idx = np.flatnonzero(hit), np.flatnonzero(~hit)
                dst[hit_idx] = self._cache.data[slots[hit_idx]]
                m = miss_idx.shape[0]
                if m:
                    buf = self._miss_buf[:m]
                    self._reader.read_rows(block[miss_idx], buf)
                    dst[miss_idx] = buf
                    self._cache.insert(block[miss_idx], slots[miss_idx], buf)
                self.rows_read += m
        if self.device.type == "cuda":
            dev = self._device_rows[:n]
            with torch.cuda.stream(self._copy_stream):
                dev.copy_(self._staging[:n], non_blocking=True)
            torch.cuda.current_stream(self.device).wait_stream(self._copy_stream)
            # The pinned staging buffer is reused by the next chunk: wait until this copy has read it.
            self._copy_stream.synchronize()
            index = torch.from_numpy(inverse).to(self.device, non_blocking=True)
            if select is None:
                torch.index_select(dev, 0, index, out=out_bytes)
            else:
                out_bytes[torch.from_numpy(select).to(self.device)] = dev[index]
        elif select is None:
            np.take(staged, inverse, axis=0, out=out_bytes.numpy(), mode="clip")  # "raise" buffers out
        else:
            out_bytes.numpy()[select] = staged[inverse]

    @property
    def cache_hit_rate(self) -> float:
        c = self._cache
        return c.hits / c.lookups if c and c.lookups else 0.0

    def close(self) -> None:
        with self._lock:
            self._reader.close()

    def __enter__(self) -> "PleTableStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
