"""Row readers: copy a sorted set of table rows from the shard files into a caller's staging buffer.

Two implementations, chosen by name (`make_reader`):

- `pread` (default): `os.preadv` straight into the staging buffer, one call per run of consecutive rows. The
  file is never mapped, so the page cache stays the kernel's and none of it counts in the process RSS.
  Two passes per block of rows: the calling thread first reads every run with `RWF_NOWAIT`, which succeeds
  only for data already in the page cache (a warm row costs ~1 us of Python; threads would only fight over
  the GIL) and, on a miss, starts the kernel's read of that page without waiting for it; the runs that would
  block then go to the thread pool, whose blocking reads overlap on the device.
- `mmap`: read-only shared mappings with `MADV_RANDOM`; rows are copied by numpy fancy indexing on worker
  threads. Every page touched, plus the kernel's fault-around neighbours (up to 64 KiB per fault, measured:
  131k random rows mapped the whole 0.5 GiB test file), is mapped into the process and counts in its RSS, so
  the reader works in blocks small enough for `rss_budget_bytes` and drops the mappings' pages with
  `MADV_DONTNEED` (the page cache keeps the data) between blocks.

Rows are processed in blocks so that per-call Python/numpy temporaries are bounded by the block, not the
batch. Which reader is faster, cold and warm: docs/benchmarks/ple.md.
"""

from __future__ import annotations

import mmap
import os
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from sglang_ext.ple.layout import PleTableError, TableLayout

_FAULT_AROUND_BYTES = 64 * 1024
_TRIM_SLICE_BYTES = 1 << 30  # one madvise over a huge mapping holds mmap_lock for its whole range
_PREAD_BLOCK_ROWS = 16384


class RowReader(ABC):
    """Reads rows of one `TableLayout`. One caller at a time (the store serialises gathers)."""

    block_rows: int = _PREAD_BLOCK_ROWS

    def __init__(self, layout: TableLayout, threads: int) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.layout = layout
        self.row_bytes = layout.row_bytes
        self.threads = threads
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ple-read") if threads > 1 else None
        self._paths = sorted({s.path for s in layout.segments})
        path_index = {p: i for i, p in enumerate(self._paths)}
        # Per segment, for vectorised row -> (file, offset) translation.
        self._seg_row_start = np.array([s.row_start for s in layout.segments], dtype=np.int64)
        self._seg_file = np.array([path_index[s.path] for s in layout.segments], dtype=np.int64)
        self._seg_offset = np.array([s.file_offset for s in layout.segments], dtype=np.int64)

    def read_rows(self, rows: np.ndarray, dest: np.ndarray) -> None:
        """Fill `dest[i]` with the bytes of table row `rows[i]`.

        rows: [n] int64, sorted ascending, unique, all in [0, num_rows) (the store checks).
        dest: [n, row_bytes] uint8, C-contiguous; written in place.
        """
        for a in range(0, rows.shape[0], self.block_rows):
            block = rows[a : a + self.block_rows]
            seg = np.searchsorted(self._seg_row_start, block, side="right") - 1
            offsets = self._seg_offset[seg] + (block - self._seg_row_start[seg]) * self.row_bytes
            self._read_block(seg, offsets, dest[a : a + self.block_rows])

    @abstractmethod
    def _read_block(self, seg: np.ndarray, offsets: np.ndarray, dest: np.ndarray) -> None:
        """Read the rows at absolute `offsets` (in segments `seg`) into `dest`, same order."""

    def _run_parallel(self, fn, items: list) -> None:
        """fn(items[i::parts]) on up to `threads` workers (inline when one part)."""
        parts = min(self.threads, len(items))
        if parts <= 1 or self._pool is None:
            fn(items)
            return
        for f in [self._pool.submit(fn, items[i::parts]) for i in range(parts)]:
            f.result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class PreadRowReader(RowReader):
    def __init__(self, layout: TableLayout, threads: int) -> None:
        super().__init__(layout, threads)
        self._fds = [os.open(p, os.O_RDONLY) for p in self._paths]
        for fd in self._fds:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no readahead around each row
        self._nowait = getattr(os, "RWF_NOWAIT", 0)
        self.blocking_runs = 0  # runs that missed the page cache, for benchmarks

    def _read_block(self, seg, offsets, dest) -> None:
        rb = self.row_bytes
        files = self._seg_file[seg]
        n = offsets.shape[0]
        # A run breaks where the next row is not the next bytes of the same file.
        breaks = np.flatnonzero((offsets[1:] != offsets[:-1] + rb) | (files[1:] != files[:-1])) + 1
        starts = np.concatenate(([0], breaks))
        runs = list(zip(starts.tolist(), np.concatenate((breaks, [n])).tolist(), offsets[starts].tolist(),
                        files[starts].tolist()))
        view = memoryview(dest.reshape(-1))
        if self._nowait:
            runs = self._read_runs(runs, view, self._nowait)
        self.blocking_runs += len(runs)
        self._run_parallel(lambda part: self._read_runs(part, view, 0), runs)

    def _read_runs(self, runs: list, view: memoryview, flags: int) -> list:
        """Read (first, end, offset, file) runs into `view`; with RWF_NOWAIT, return the runs that would block."""
        rb = self.row_bytes
        blocked = []
        for a, b, off, fi in runs:
            want = (b - a) * rb
            got = 0
            while got < want:
                try:
                    more = os.preadv(self._fds[fi], [view[a * rb + got : b * rb]], off + got, flags)
                except BlockingIOError:
                    more = -1
                if more <= 0:
                    if flags:
                        done = got // rb
                        blocked.append((a + done, b, off + done * rb, fi))
                        break
                    raise PleTableError(f"{self._paths[fi]}: read past end of file at offset {off + got}")
                got += more
        return blocked

    def close(self) -> None:
        super().close()
        for fd in self._fds:
            os.close(fd)
        self._fds = []


class MmapRowReader(RowReader):
    def __init__(self, layout: TableLayout, threads: int, rss_budget_bytes: int) -> None:
        super().__init__(layout, threads)
        self._maps = []
        for p in self._paths:
            with open(p, "rb") as f:
                m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            m.madvise(mmap.MADV_RANDOM)
            self._maps.append(m)
        self._seg_views = [
            np.frombuffer(self._maps[self._paths.index(s.path)], dtype=np.uint8, count=s.num_rows * self.row_bytes,
                          offset=s.file_offset).reshape(s.num_rows, self.row_bytes)
            for s in layout.segments
        ]
        # Worst case per row: its own pages plus one fault-around window.
        per_row = max(-(-self.row_bytes // mmap.PAGESIZE) * mmap.PAGESIZE, _FAULT_AROUND_BYTES)
        self.block_rows = max(1, int(rss_budget_bytes) // per_row)
        self.trims = 0

    def read_rows(self, rows: np.ndarray, dest: np.ndarray) -> None:
        for a in range(0, rows.shape[0], self.block_rows):
            super().read_rows(rows[a : a + self.block_rows], dest[a : a + self.block_rows])
            self.trim()

    def _read_block(self, seg, offsets, dest) -> None:
        breaks = np.flatnonzero(seg[1:] != seg[:-1]) + 1
        starts = np.concatenate(([0], breaks)).tolist()
        ends = np.concatenate((breaks, [seg.shape[0]])).tolist()
        pieces = []
        for a, b in zip(starts, ends):
            s = int(seg[a])
            local = (offsets[a:b] - self._seg_offset[s]) // self.row_bytes
            # Split big pieces so every worker gets a share.
            step = max(64, -(-(b - a) // self.threads))
            pieces += [(s, local[i : i + step], a + i) for i in range(0, b - a, step)]

        def copy(part: list) -> None:
            for s, local, at in part:
                np.take(self._seg_views[s], local, axis=0, out=dest[at : at + local.shape[0]], mode="clip")

        self._run_parallel(copy, pieces)

    def trim(self) -> None:
        """Unmap every resident page of every mapping (`MADV_DONTNEED`); the page cache keeps the data."""
        for m in self._maps:
            for start in range(0, len(m), _TRIM_SLICE_BYTES):
                m.madvise(mmap.MADV_DONTNEED, start, min(_TRIM_SLICE_BYTES, len(m) - start))
        self.trims += 1

    def close(self) -> None:
        super().close()
        self._seg_views = []
        for m in self._maps:
            m.close()
        self._maps = []


READERS = ("pread", "mmap")


def make_reader(name: str, layout: TableLayout, threads: int, rss_budget_bytes: int) -> RowReader:
    """Build the reader called `name` (one of READERS)."""
    if name == "pread":
        return PreadRowReader(layout, threads)
    if name == "mmap":
        return MmapRowReader(layout, threads, rss_budget_bytes)
    raise ValueError(f"unknown PLE row reader {name!r}; choose from {READERS}")
