"""A byte-budgeted cache of hot table rows, vectorised so a 131k-row prefill batch costs a few numpy ops.

Policy: direct-mapped. Row r may live only in slot `hash(r) % num_slots`; a miss that is read from disk
replaces whatever the slot held. This is LRU with associativity 1: the most recently read row of each slot
wins. It needs no per-row Python bookkeeping (an OrderedDict LRU costs ~1 us per row, 0.1 s per 8k-token
prefill), and hashed n-gram ids are already spread uniformly over the table, so conflicts are as rare as in
any hash table of the same load. The budget is exact: `num_slots * (row_bytes + 8)` bytes (data + tag).
numpy rather than torch: on a small shared CPU torch's intra-op threads made these ops 10-30x slower.
"""

from __future__ import annotations

import numpy as np

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


class HotRowCache:
    def __init__(self, budget_bytes: int, row_bytes: int) -> None:
        self.row_bytes = row_bytes
        self.num_slots = max(0, int(budget_bytes) // (row_bytes + 8))
        # tags: [num_slots] int64, -1 = empty; data: [num_slots, row_bytes] uint8
        self.tags = np.full((self.num_slots,), -1, dtype=np.int64)
        self.data = np.empty((self.num_slots, row_bytes), dtype=np.uint8)
        self.hits = 0
        self.lookups = 0

    @property
    def nbytes(self) -> int:
        return self.num_slots * (self.row_bytes + 8)

    def _slots(self, rows: np.ndarray) -> np.ndarray:
        x = rows.astype(np.uint64)
        with np.errstate(over="ignore"):
            x = (x ^ (x >> np.uint64(31))) * _M1
            x = (x ^ (x >> np.uint64(29))) * _M2
            x = x ^ (x >> np.uint64(32))
        return (x % np.uint64(self.num_slots)).astype(np.int64)

    def lookup(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """rows: [n] int64 unique. Returns (hit mask [n] bool, slot per row [n] int64)."""
        if self.num_slots == 0:
            return np.zeros(rows.shape, dtype=bool), np.zeros(rows.shape, dtype=np.int64)
        slots = self._slots(rows)
        hit = self.tags[slots] == rows
        self.lookups += rows.shape[0]
        self.hits += int(hit.sum())
        return hit, slots

    def insert(self, rows: np.ndarray, slots: np.ndarray, data: np.ndarray) -> None:
        """Store `data[i]` ([n, row_bytes] uint8) as row `rows[i]` in `slots[i]`; the first row per slot wins."""
        if self.num_slots == 0 or rows.shape[0] == 0:
            return
        uniq_slots, first = np.unique(slots, return_index=True)
        self.tags[uniq_slots] = rows[first]
        self.data[uniq_slots] = data[first]
