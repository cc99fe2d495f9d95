"""Resident memory stays under the store's budget while gathering from a table ~100x larger than it.

Each case runs in a fresh subprocess, which reads its own VmRSS/VmHWM from /proc/self/status, so pytest's
state and earlier tests do not pollute the figure. The table is a 3 GiB sparse file: the rows the check
reads back are written with the synthetic pattern, the rest are holes that read as zeros, so the test costs
no disk space or write time. Reading holes still goes through the page cache, and through an mmap they are
mapped like any page, which is what the control case demonstrates.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from sglang_ext.ple.table_file import pattern_rows, safetensors_header

ROW_DIM = 160  # bf16, 320-byte rows as in qwen4_exp
TABLE_BYTES = 3 << 30
SLACK_MIB = 16  # transient numpy temporaries of one gather (~100 B per id) + allocator rounding

BATCH_IDS = 2048 * 16

_CHILD = r"""
import json, sys
import numpy as np, torch
from sglang_ext.ple import PleStoreConfig, PleTableStore, TableLayout
from sglang_ext.ple.bench import reset_peak_rss, status_kib
from sglang_ext.ple.table_file import pattern_rows

path, reader, cache_bytes, mmap_rss, written = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
written = torch.from_numpy(np.load(written))
BATCH_IDS = written.numel()
layout = TableLayout.from_safetensors(path, "table")
g = torch.Generator().manual_seed(1)
batches = [torch.randint(0, layout.num_rows, (BATCH_IDS // 16, 16), generator=g) for _ in range(4)]
batches[0] = written[: BATCH_IDS].reshape(BATCH_IDS // 16, 16)
out = torch.zeros(BATCH_IDS // 16, 16, 160, dtype=torch.bfloat16)
# Expected bytes computed before the measurement starts, so the check itself adds nothing to the peak.
wants = [torch.where(torch.isin(ids.reshape(-1), written).unsqueeze(1), pattern_rows(ids.reshape(-1), 320),
                     torch.zeros(1, 320, dtype=torch.uint8)).numpy() for ids in batches]
reset_peak_rss()
base = status_kib("VmRSS")
store = PleTableStore(layout, PleStoreConfig(reader=reader, threads=4, cache_bytes=cache_bytes, staging_rows=16384,
                                             mmap_rss_bytes=mmap_rss))
bad = 0
got = out.reshape(-1, 160).view(torch.uint8).numpy()
for ids, want in zip(batches, wants):
    store.gather(ids, out=out)
    bad += sum(int((got[a : a + 1024] != want[a : a + 1024]).any(axis=1).sum()) for a in range(0, len(want), 1024))
mapped = mmap_rss if reader == "mmap" else 0
print(json.dumps({"peak_growth": (status_kib("VmHWM") - base) * 1024, "bound": store.resident_bytes,
                  "bound_unmapped": store.resident_bytes - mapped, "bad": bad, "rows_read": store.rows_read}))
"""


@pytest.fixture(scope="module")
def sparse_table(tmp_path_factory):
    d = tmp_path_factory.mktemp("ple_rss")
    path = str(d / "big.safetensors")
    num_rows = TABLE_BYTES // (ROW_DIM * 2)
    header = safetensors_header([("table", torch.bfloat16, (num_rows, ROW_DIM))], {})
    written = torch.unique(torch.randint(0, num_rows, (BATCH_IDS,), generator=torch.Generator().manual_seed(7)))
    written = torch.cat([written, written[: BATCH_IDS - written.numel()]])  # exactly one batch of ids
    data = pattern_rows(written, 320).numpy()
    with open(path, "wb") as f:
        f.write(header)
        f.truncate(len(header) + num_rows * 320)
        for row, bytes_ in zip(written.tolist(), data):
            os.pwrite(f.fileno(), bytes_.tobytes(), len(header) + row * 320)
    written_path = str(d / "written.npy")
    import numpy as np

    np.save(written_path, written.numpy())
    return path, written_path


def run_child(path: str, written: str, reader: str, cache_bytes: int, mmap_rss: int) -> dict:
    proc = subprocess.run([sys.executable, "-c", _CHILD, path, reader, str(cache_bytes), str(mmap_rss), written],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("reader,cache_bytes,mmap_rss", [("pread", 8 << 20, 0), ("mmap", 0, 8 << 20)])
def test_rss_bounded_by_budget(sparse_table, reader, cache_bytes, mmap_rss):
    path, written = sparse_table
    r = run_child(path, written, reader, cache_bytes, mmap_rss)
    assert r["bad"] == 0, f"{r['bad']} gathered rows differ from the file"
    limit = r["bound"] + (SLACK_MIB << 20)
    assert r["peak_growth"] <= limit, (
        f"{reader}: RSS grew {r['peak_growth'] / 2**20:.1f} MiB while reading {r['rows_read']} rows of a "
        f"{TABLE_BYTES >> 30} GiB table; store bound {r['bound'] / 2**20:.1f} MiB + {SLACK_MIB} MiB slack")


def test_control_untrimmed_mmap_exceeds_the_bound(sparse_table):
    """Without trimming, the same reads through an mmap grow RSS far past the bound: the check above can fail."""
    path, written = sparse_table
    r = run_child(path, written, "mmap", 0, 64 << 30)
    assert r["bad"] == 0, f"{r['bad']} gathered rows differ from the file"
    limit = r["bound_unmapped"] + ((SLACK_MIB + 64) << 20)
    assert r["peak_growth"] > limit, (
        f"untrimmed mmap grew RSS by only {r['peak_growth'] / 2**20:.1f} MiB; expected > {limit / 2**20:.1f} MiB")
