"""`python -m sglang_ext.ple bench`: gather latency and RSS of the PLE store on this machine's disk.

Builds (once) a synthetic table file of `--table-gb` GiB, then times decode-shaped gathers (16 rows x batch)
and prefill-shaped gathers (8192 tokens x 16 rows), cold and warm, and checks every gathered row against the
bytes the file was written with (`table_file.pattern_rows`). Exit status 1 if any row differs.

"Cold" means: before each timed gather the file's pages are dropped from the page cache with
`posix_fadvise(POSIX_FADV_DONTNEED)` (and the mmap reader's mappings with `MADV_DONTNEED` first, since mapped
pages cannot be dropped). It does not empty the drive's own cache, nor a host cache under a VM's virtual disk.
"Warm" means: the rows were read once with plain `os.pread` just before (so they are in the page cache but
not in the store's hot-row cache), then the gather is timed. Ids are uniform over the table, as hashed n-gram
ids are, so the hot-row cache rarely hits here; its hit rate is printed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

from sglang_ext.env import ext_home
from sglang_ext.ple.layout import PleTableError, TableLayout, read_safetensors_header
from sglang_ext.ple.store import PleStoreConfig, PleTableStore
from sglang_ext.ple.table_file import PATTERN_SEED_KEY, pattern_rows, write_table_file

ROWS_PER_TOKEN = 16
PREFILL_TOKENS = 8192
TENSOR_NAME = "ngram_table"


def status_kib(field: str) -> int:
    """A `Vm*` field of /proc/self/status in KiB (VmRSS: now, VmHWM: peak)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def reset_peak_rss() -> None:
    """Make VmHWM restart from the current RSS (Linux: write 5 to /proc/self/clear_refs)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def drop_page_cache(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def ensure_table(path: str, num_rows: int, dim: int, seed: int) -> None:
    """Build the table unless `path` already holds exactly this one (same shape, dtype and pattern seed)."""
    if os.path.exists(path):
        try:
            entries, meta = read_safetensors_header(path)
            e = entries.get(TENSOR_NAME)
            same_table = e and e.shape == (num_rows, dim) and e.dtype == torch.bfloat16
            if same_table and meta.get(PATTERN_SEED_KEY) == str(seed):
                return
        except PleTableError:
            pass
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_table_file(path, num_rows, dim, torch.bfloat16, tensor_name=TENSOR_NAME, seed=seed, progress=True)


def warm_rows(path: str, layout: TableLayout, ids: torch.Tensor) -> None:
    """Bring the rows at `ids` into the page cache without going through the store."""
    offset = layout.segments[0].file_offset
    fd = os.open(path, os.O_RDONLY)
    try:
        for r in np.unique(ids.numpy()).tolist():
            os.pread(fd, layout.row_bytes, offset + r * layout.row_bytes)
    finally:
        os.close(fd)


def count_mismatches(ids: torch.Tensor, out: torch.Tensor, row_bytes: int, seed: int) -> int:
    """Rows of `out` whose bytes differ from the file's pattern; checked in slices to keep the bench's own RSS
    small next to the store's."""
    flat_ids = ids.reshape(-1)
    got = out.reshape(flat_ids.numel(), -1).view(torch.uint8)
    bad = 0
    for a in range(0, flat_ids.numel(), 8192):
        want = pattern_rows(flat_ids[a : a + 8192], row_bytes, seed)
        bad += int((got[a : a + 8192].cpu() != want).any(dim=1).sum())
    return bad


def _percentile(xs: list[float], q: float) -> float:
    return float(np.percentile(np.array(xs), q)) if xs else float("nan")


def run_bench(args: argparse.Namespace) -> int:
    row_bytes = args.dim * 2
    num_rows = int(args.table_gb * (1 << 30)) // row_bytes
    path = args.path or str(ext_home() / "ple" / f"bench_{args.table_gb:g}GiB_d{args.dim}.safetensors")
    ensure_table(path, num_rows, args.dim, args.seed)
    layout = TableLayout.from_safetensors(path, TENSOR_NAME, expected_dim=args.dim, expected_dtype=torch.bfloat16)

    budget = args.budget_mb << 20
    cache = budget if args.reader == "pread" else budget // 2
    config = PleStoreConfig(reader=args.reader, threads=args.threads, cache_bytes=cache if args.cache else 0,
                            mmap_rss_bytes=budget - cache if args.reader == "mmap" else 64 << 20,
                            staging_rows=PREFILL_TOKENS * ROWS_PER_TOKEN, device=args.device)
    # Touch every code path once before the baseline, so lazily mapped library pages (libtorch is large) are not
    # counted as the store's memory.
    with PleTableStore(layout, PleStoreConfig(reader=args.reader, threads=args.threads, staging_rows=64,
                                              cache_bytes=1 << 16, device=args.device)) as warmup:
        probe = torch.arange(0, num_rows, max(1, num_rows // 200))
        warm_rows(path, layout, probe)
        count_mismatches(probe, warmup.gather(probe), row_bytes, args.seed)
    reset_peak_rss()
    rss_before_kib = status_kib("VmRSS")
    gen = torch.Generator().manual_seed(args.seed)
    shapes = {"decode": (args.batch, ROWS_PER_TOKEN), "prefill": (PREFILL_TOKENS, ROWS_PER_TOKEN)}
    steps = {"decode": args.decode_steps, "prefill": args.prefill_steps}
    mismatches = 0
    results = []
    with PleTableStore(layout, config) as store:
        for kind, shape in shapes.items():
            for temp in ("cold", "warm"):
                lat = []
                n = steps[kind] if temp == "warm" else max(1, steps[kind] // 4)
                for _ in range(n):
                    ids = torch.randint(0, num_rows, shape, generator=gen)
                    if temp == "warm":
                        warm_rows(path, layout, ids)
                    else:
                        if args.reader == "mmap":
                            store._reader.trim()
                        drop_page_cache(path)
                    t0 = time.perf_counter()
                    out = store.gather(ids)
                    if out.is_cuda:
                        torch.cuda.synchronize()
                    lat.append((time.perf_counter() - t0) * 1e3)
                    mismatches += count_mismatches(ids, out, row_bytes, args.seed)
                results.append((kind, temp, shape, n, _percentile(lat, 50), _percentile(lat, 99)))
        hit_rate = store.cache_hit_rate
        store_bound = store.resident_bytes
    peak_kib = status_kib("VmHWM")
    print(f"table {path}: {num_rows} rows x {row_bytes} B = {layout.nbytes / 2**30:.2f} GiB; reader={args.reader} "
          f"threads={args.threads} budget={args.budget_mb} MiB (hot cache {config.cache_bytes >> 20} MiB) "
          f"staging={config.staging_rows * row_bytes / 2**20:.0f} MiB device={args.device}")
    print(f"{'shape':>8} {'cache':>5} {'rows':>7} {'n':>4} {'p50 ms':>9} {'p99 ms':>9}")
    for kind, temp, shape, n, p50, p99 in results:
        print(f"{kind:>8} {temp:>5} {shape[0] * shape[1]:>7} {n:>4} {p50:>9.2f} {p99:>9.2f}")
    print(f"RSS before store {rss_before_kib / 1024:.0f} MiB, peak {peak_kib / 1024:.0f} MiB "
          f"(+{(peak_kib - rss_before_kib) / 1024:.0f} MiB; store bound {store_bound / 2**20:.0f} MiB = hot cache + "
          f"miss buffer + staging; the bench adds the {PREFILL_TOKENS * ROWS_PER_TOKEN * row_bytes / 2**20:.0f} MiB "
          f"prefill output, ~100 B per id of temporaries and its own verification)")
    print(f"hot-row cache hit rate {hit_rate:.3f}")
    if mismatches:
        print(f"FAIL: {mismatches} gathered rows differ from the file's bytes", file=sys.stderr)
        return 1
    print("all gathered rows match the file's bytes")
    return 0


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="gather latency and RSS of the SSD PLE store on this machine's disk")
    p.add_argument("--table-gb", type=float, required=True, help="table size in GiB (built once, reused)")
    p.add_argument("--budget-mb", type=int, required=True, help="host memory budget of the store besides staging")
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--path", default=None,
                   help="table file (default: $SGLANG_EXT_HOME/ple/bench_<G>GiB_d<dim>.safetensors)")
    p.add_argument("--reader", choices=("pread", "mmap"), default="pread")
    p.add_argument("--dim", type=int, default=160, help="bf16 elements per row (qwen4_exp: 160)")
    p.add_argument("--batch", type=int, default=64, help="decode batch size (rows per step = 16 x batch)")
    p.add_argument("--decode-steps", type=int, default=200)
    p.add_argument("--prefill-steps", type=int, default=8)
    p.add_argument("--no-cache", dest="cache", action="store_false", help="no hot-row cache (budget unused)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run_bench)
