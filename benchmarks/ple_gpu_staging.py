"""The SSD PLE store's GPU staging path against tables held in GPU memory and in pinned RAM.

Produces docs/benchmarks/ple.md, "H200 machine: GPU staging path vs tables in GPU memory and in pinned RAM"
(and docs/ple-on-ssd.md's GPU table). Time: not recorded; most of it writes the
4 GiB table.

Runs where there is a CUDA GPU and no SGLang (the H200 machine): only core modules (`sglang_ext.ple`) are
imported. On a machine without a GPU it runs the CPU paths (store on CPU vs an in-RAM table), which is how
the script is tested before it is sent to the GPU machine.

Per batch shape (decode: 16 rows x batch; prefill: 8192 tokens x 16 rows), ids uniform over the table:

- `ssd` (`PleTableStore`, device cuda): ids on the GPU -> host, unique, pread into pinned staging, copy to the
  GPU on a side stream, restore order on the GPU. Cold: the file's pages dropped with
  `posix_fadvise(POSIX_FADV_DONTNEED)` right before each timed gather; warm: the same rows read once with
  `os.pread` just before.
- `gpu`: the whole table in GPU memory, `index_select` (the in-HBM baseline).
- `pinned_uva`: the whole table in pinned host RAM, read by a Triton kernel through its host pointer, one
  program per row (what SGLang's `--ple-offload-backend pinned` does; `_gather_ple_embedding_from_pinned_kernel`).
- `pinned_copy`: the whole table in pinned host RAM, rows gathered on the host into pinned staging, then one
  copy to the GPU (the store's path without the disk).
- CPU fallback: `ssd` on device cpu and `ram` (`index_select` on an in-RAM table).

Latency is wall clock from the call to `torch.cuda.synchronize()` returning (ids already on the device),
median and p99 over the steps. Every output is compared with the bytes the file was written with
(`table_file.pattern_rows`); exit status 1 if any row differs.

    python benchmarks/ple_gpu_staging.py --table-gb 4 --path /tmp/ple/table.safetensors --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from sglang_ext.ple.bench import (  # noqa: E402
    PREFILL_TOKENS, ROWS_PER_TOKEN, TENSOR_NAME, count_mismatches, drop_page_cache, ensure_table, warm_rows)
from sglang_ext.ple.layout import TableLayout  # noqa: E402
from sglang_ext.ple.store import PleStoreConfig, PleTableStore  # noqa: E402


def _uva_gather_kernel():
    """A Triton kernel that reads rows through a pinned host pointer (int64), as SGLang's pinned backend."""
    import triton
    import triton.language as tl

    @triton.jit
    def gather_rows_from_host(table_addr, ids_ptr, out_ptr, row_elems, BLOCK: tl.constexpr):
        r = tl.program_id(0)
        row = tl.load(ids_ptr + r).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        mask = offs < row_elems
        base = table_addr.to(tl.int64).to(tl.pointer_type(tl.bfloat16))
        values = tl.load(base + row * row_elems + offs, mask=mask)
        tl.store(out_ptr + r.to(tl.int64) * row_elems + offs, values, mask=mask)

    def launch(table: torch.Tensor, ids: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        assert table.is_pinned() and table.dtype == torch.bfloat16 and table.is_contiguous()
        assert ids.is_cuda and ids.dtype == torch.int64 and out.is_cuda and out.is_contiguous()
        assert out.shape == (ids.numel(), table.shape[1])
        gather_rows_from_host[(ids.numel(),)](table.data_ptr(), ids, out, table.shape[1],
                                              BLOCK=triton.next_power_of_2(table.shape[1]))
        return out

    return launch


def load_table(path: str, layout: TableLayout, pinned: bool) -> torch.Tensor:
    """The whole table read from the file into host memory ([num_rows, dim] bf16)."""
    seg = layout.segments[0]
    table = torch.empty((layout.num_rows, layout.dim), dtype=torch.bfloat16, pin_memory=pinned)
    raw = table.view(torch.uint8).view(-1).numpy()
    with open(path, "rb", buffering=0) as f:
        f.seek(seg.file_offset)
        step = 256 << 20
        for a in range(0, raw.shape[0], step):
            view = memoryview(raw[a : a + step])
            got = 0
            while got < len(view):
                n = f.readinto(view[got:])
                if not n:
                    raise EOFError(f"{path}: short read at {seg.file_offset + a + got}")
                got += n
    return table


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_method(name, fn, path, layout, shapes, steps, temps, device, seed, results) -> int:
    """Run `fn(ids_on_device) -> out` over shapes x temps; append result dicts; return mismatched rows."""
    bad = 0
    gen = torch.Generator().manual_seed(seed)
    for label, shape in shapes:
        for temp in temps:
            n = steps[label.split()[0]] if temp != "cold" else max(2, steps[label.split()[0]] // 5)
            lat = []
            for i in range(n + 1):  # the first one warms the code path and is not timed
                ids = torch.randint(0, layout.num_rows, shape, generator=gen)
                ids_dev = ids.to(device)
                if temp == "warm":
                    warm_rows(path, layout, ids)
                elif temp == "cold":
                    drop_page_cache(path)
                sync(device)
                t0 = time.perf_counter()
                out = fn(ids_dev)
                sync(device)
                if i:
                    lat.append((time.perf_counter() - t0) * 1e3)
                bad += count_mismatches(ids, out, layout.row_bytes, seed)
            r = dict(method=name, shape=label, rows=shape[0] * shape[1], page_cache=temp, steps=n,
                     p50_ms=float(np.percentile(lat, 50)), p99_ms=float(np.percentile(lat, 99)),
                     min_ms=float(min(lat)))
            results.append(r)
            print(f"{name:>16} {label:>14} {temp:>5} {r['rows']:>7} {n:>4} {r['p50_ms']:>9.3f} {r['p99_ms']:>9.3f}",
                  flush=True)
    return bad


def machine_info(path: str) -> dict:
    info = dict(host=platform.node(), torch=torch.__version__, python=platform.python_version(),
                cpus=os.cpu_count(), loadavg=os.getloadavg())
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    st = os.statvfs(os.path.dirname(os.path.abspath(path)))
    info["disk_free_gib"] = st.f_bavail * st.f_frsize / 2**30
    for cmd in (["df", "-T", os.path.dirname(os.path.abspath(path))], ["lsblk", "-o", "NAME,SIZE,ROTA,TYPE,MODEL"]):
        try:
            info[cmd[0]] = subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError) as e:
            info[cmd[0]] = f"unavailable: {e}"
    return info


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--table-gb", type=float, default=4)
    p.add_argument("--path", required=True, help="table file (built once, reused when it matches)")
    p.add_argument("--dim", type=int, default=160)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--threads", type=int, nargs="+", default=[8, 16])
    p.add_argument("--decode-steps", type=int, default=50)
    p.add_argument("--prefill-steps", type=int, default=5)
    p.add_argument("--json", default=None, help="write machine info and every result here")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    row_bytes = args.dim * 2
    num_rows = int(args.table_gb * (1 << 30)) // row_bytes
    t0 = time.perf_counter()
    ensure_table(args.path, num_rows, args.dim, args.seed)
    build_s = time.perf_counter() - t0
    layout = TableLayout.from_safetensors(args.path, TENSOR_NAME, expected_dim=args.dim, expected_dtype=torch.bfloat16)
    info = machine_info(args.path)
    info.update(table_gib=layout.nbytes / 2**30, rows=layout.num_rows, row_bytes=layout.row_bytes,
                table_build_s=build_s, device=str(device))
    print(json.dumps({k: v for k, v in info.items() if k not in ("df", "lsblk")}))
    print(info["df"], info["lsblk"], sep="\n")

    shapes = [(f"decode b{b}", (b, ROWS_PER_TOKEN)) for b in args.batches]
    shapes.append((f"prefill {PREFILL_TOKENS}", (PREFILL_TOKENS, ROWS_PER_TOKEN)))
    steps = {"decode": args.decode_steps, "prefill": args.prefill_steps}
    results: list[dict] = []
    bad = 0
    print(f"{'method':>16} {'shape':>14} {'cache':>5} {'rows':>7} {'n':>4} {'p50 ms':>9} {'p99 ms':>9}")
    for threads in args.threads:
        config = PleStoreConfig(threads=threads, staging_rows=PREFILL_TOKENS * ROWS_PER_TOKEN, device=device.type)
        with PleTableStore(layout, config) as store:
            bad += time_method(f"ssd t{threads}", store.gather, args.path, layout, shapes, steps, ("cold", "warm"),
                               device, args.seed, results)

    host = load_table(args.path, layout, pinned=device.type == "cuda")
    if device.type == "cuda":
        table_gpu = host.to(device)
        bad += time_method("gpu", lambda ids: torch.index_select(table_gpu, 0, ids.reshape(-1)), args.path, layout,
                           shapes, steps, ("n/a",), device, args.seed, results)
        del table_gpu
        torch.cuda.empty_cache()
        try:
            uva = _uva_gather_kernel()
        except ImportError as e:
            print(f"pinned_uva: no Triton ({e})")
        else:
            def uva_gather(ids):
                flat = ids.reshape(-1)
                return uva(host, flat, torch.empty((flat.numel(), layout.dim), dtype=torch.bfloat16, device=device))

            bad += time_method("pinned_uva", uva_gather, args.path, layout, shapes, steps, ("n/a",), device,
                               args.seed, results)
        staging = torch.empty((PREFILL_TOKENS * ROWS_PER_TOKEN, layout.dim), dtype=torch.bfloat16, pin_memory=True)

        def pinned_copy(ids):
            flat = ids.reshape(-1).cpu()
            uniq, inverse = torch.unique(flat, return_inverse=True)
            rows = staging[: uniq.numel()]
            torch.index_select(host, 0, uniq, out=rows)
            return rows.to(device, non_blocking=True)[inverse.to(device, non_blocking=True)]

        bad += time_method("pinned_copy", pinned_copy, args.path, layout, shapes, steps, ("n/a",), device,
                           args.seed, results)
    else:
        bad += time_method("ram", lambda ids: torch.index_select(host, 0, ids.reshape(-1)), args.path, layout,
                           shapes, steps, ("n/a",), device, args.seed, results)
    info["loadavg_after"] = os.getloadavg()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(info=info, results=results, mismatched_rows=bad), f, indent=1)
    if bad:
        print(f"FAIL: {bad} gathered rows differ from the file's bytes", file=sys.stderr)
        return 1
    print("all gathered rows match the file's bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
