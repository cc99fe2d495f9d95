"""Decode tokens/s of the tiny Gemma 3n served on the CPU platform, per-layer table in RAM vs on SSD.

Produces docs/benchmarks/ple.md, "Decode tokens/s of the tiny Gemma 3n served on the CPU platform". Time: about 25
minutes for `--backends pinned ssd pinned` on 2 CPU cores.

One `python -m sglang.launch_server` at a time (the tests' `ServerProcess`), float32, radix cache off, for each
backend in `--backends` (`pinned`: SGLang's own in-RAM table; `ssd`: `--ple-offload-backend ssd`). Decode rate
of a batch of B identical-length requests sent together:

    decode tok/s = B * (N - 1) / (T(N tokens) - T(1 token))

where T is the wall time of the whole batch (sent concurrently, `ignore_eos`), so prefill, HTTP and
tokenisation cancel out. Each figure is the median of `--repeats` pairs. On a shared machine wall time mostly
measures the other jobs, so the same difference is also taken of the CPU time (user + system) of all the
server's processes: CPU ms per decode token, which contention inflates far less (it leaves out time spent
waiting for the disk, which the wall-clock rate includes).

Page cache: "warm" is the state after start-up. "cold": a thread of this script calls
`posix_fadvise(POSIX_FADV_DONTNEED)` on every safetensors file of the checkpoint every `--drop-every-ms`
while the requests run, so the rows each step reads are (almost always) no longer in the page cache. The same
thread also runs for the RAM backend, whose table does not come from the file, to show its CPU cost alone.
Dropping the whole machine's caches (`/proc/sys/vm/drop_caches`) is not used: the machine is shared.

RSS: after the runs, the resident set of every process of the server (the scheduler holds the model).

`--store-only`: no server; the per-step cost the SSD backend adds, measured in this process on the same
checkpoint: `PleTableStore.gather` (the glue's default configuration) of B token ids from the file, cold
(pages dropped before each gather) and warm, against `F.embedding` on the table loaded in RAM (float32, as
served). A decode step of batch B reads B rows, so step_time / (step_time + gather_ms) bounds the decode rate
ratio SSD / RAM for a measured step time.

    python benchmarks/ple_gemma3n_decode.py --work /tmp/ple-decode --backends pinned ssd pinned
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "ple")]

from server import ServerProcess  # noqa: E402
from tiny_gemma3n import build_tiny_gemma3n  # noqa: E402

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ", "Once upon a time, in a small village,",
           "The weather today is", "import numpy as np\n", "My favourite book is", "In 1969, the first",
           "The recipe calls for"]
FLAGS = ["--dtype", "float32", "--max-total-tokens", "4096", "--disable-radix-cache"]


class PageCacheDropper:
    """While active, drops the files' page-cache pages every `period_s` (a daemon thread)."""

    def __init__(self, paths: list[str], period_s: float) -> None:
        self.paths, self.period_s = paths, period_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.drops = 0

    def _loop(self) -> None:
        fds = [os.open(p, os.O_RDONLY) for p in self.paths]
        try:
            while not self._stop.is_set():
                for fd in fds:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                self.drops += 1
                self._stop.wait(self.period_s)
        finally:
            for fd in fds:
                os.close(fd)

    def __enter__(self) -> "PageCacheDropper":
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def server_cpu_s(server: ServerProcess) -> float:
    """User + system CPU seconds used so far by the server's processes (children included)."""
    root = psutil.Process(server.proc.pid)
    total = 0.0
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def batch_wall_s(server: ServerProcess, batch: int, new_tokens: int) -> tuple[float, float]:
    """(wall seconds, server CPU seconds) of `batch` concurrent requests of `new_tokens` tokens each."""
    body = lambda p: {"text": p, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0.0,  # noqa: E731
                                                     "ignore_eos": True}}

    def one(prompt: str) -> int:
        r = requests.post(f"{server.url}/generate", json=body(prompt), timeout=600)
        r.raise_for_status()
        return int(r.json()["meta_info"]["completion_tokens"])

    with ThreadPoolExecutor(batch) as pool:
        cpu0 = server_cpu_s(server)
        t0 = time.perf_counter()
        counts = list(pool.map(one, PROMPTS[:batch]))
        wall = time.perf_counter() - t0
        cpu = server_cpu_s(server) - cpu0
    if counts != [new_tokens] * batch:
        raise RuntimeError(f"asked for {new_tokens} tokens per request, got {counts}")
    return wall, cpu


def decode_tps(server: ServerProcess, batch: int, new_tokens: int, repeats: int) -> dict:
    """Median decode tokens/s (wall) and server CPU ms per decode token over `repeats` pairs."""
    rates, cpu_ms = [], []
    for _ in range(repeats):
        wall_one, cpu_one = batch_wall_s(server, batch, 1)
        wall_all, cpu_all = batch_wall_s(server, batch, new_tokens)
        tokens = batch * (new_tokens - 1)
        rates.append(tokens / (wall_all - wall_one))
        cpu_ms.append(1e3 * (cpu_all - cpu_one) / tokens)
    return dict(tok_s=statistics.median(rates), runs=rates, cpu_ms_per_token=statistics.median(cpu_ms),
                cpu_runs=cpu_ms)


def server_rss_mib(server: ServerProcess) -> dict[str, float]:
    root = psutil.Process(server.proc.pid)
    out = {}
    for p in [root, *root.children(recursive=True)]:
        try:
            name = " ".join(p.cmdline()[:3])[-60:] if p.pid == root.pid else p.name()
            out[f"{p.pid} {name}"] = p.memory_info().rss / 2**20
        except psutil.NoSuchProcess:
            pass
    return out


def store_only(model: Path, batches: list[int], reps: int) -> list[dict]:
    import numpy as np
    import torch
    import torch.nn.functional as F

    from sglang_ext.ple import PleTableStore, TableLayout, index_safetensors_dir
    from sglang_ext.ple.bench import drop_page_cache

    (entry,) = [e for n, e in index_safetensors_dir(str(model)).items() if n.endswith("embed_tokens_per_layer.weight")]
    layout = TableLayout.from_entries([entry])
    table = torch.from_numpy(np.fromfile(entry.path, dtype=np.uint8, count=entry.nbytes, offset=entry.file_offset))
    table = table.view(entry.dtype).view(entry.shape).float()  # what the RAM backend serves in float32
    gen = torch.Generator().manual_seed(0)
    out = []
    with PleTableStore(layout) as store:
        for batch in batches:
            for case in ("ram", "ssd warm", "ssd cold"):
                lat = []
                for _ in range(reps):
                    ids = torch.randint(0, layout.num_rows, (batch,), generator=gen)
                    if case == "ssd warm":
                        store.gather(ids)
                    elif case == "ssd cold":
                        drop_page_cache(entry.path)
                    t0 = time.perf_counter()
                    rows = F.embedding(ids, table) if case == "ram" else store.gather(ids).float()
                    lat.append((time.perf_counter() - t0) * 1e3)
                    if case != "ram" and not torch.equal(rows, F.embedding(ids, table)):
                        raise RuntimeError(f"{case}: rows differ from the table's")
                r = dict(case=case, batch=batch, reps=reps, p50_ms=float(np.percentile(lat, 50)),
                         p99_ms=float(np.percentile(lat, 99)), load1=os.getloadavg()[0])
                out.append(r)
                print(f"store-only {case:>8} batch {batch}: p50 {r['p50_ms']:.3f} ms, p99 {r['p99_ms']:.3f} ms "
                      f"({reps} gathers, load {r['load1']:.1f})", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default="/tmp/ple-decode", help="where the tiny checkpoint is written")
    ap.add_argument("--backends", nargs="+", default=["pinned", "ssd"])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--drop-every-ms", type=float, default=2.0)
    ap.add_argument("--store-only", action="store_true", help="time the gathers in this process, no server")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the `finally` that stops the server

    from sglang_ext.models import prepare

    model = Path(args.work) / "tiny_gemma3n"
    if not (model / "model.safetensors").is_file():
        build_tiny_gemma3n(model, Path(prepare()))
    if args.store_only:
        results = store_only(model, args.batches, args.repeats)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
        return 0
    shards = sorted(glob.glob(str(model / "*.safetensors")))
    results = []
    for backend in args.backends:
        server = ServerProcess(str(model), [*FLAGS, "--ple-offload-backend", backend], name=f"gemma3n-{backend}")
        server.start()
        try:
            served_from_file = "served from" in server.log_text()
            if served_from_file != (backend == "ssd"):
                raise RuntimeError(f"{backend}: SSD store log line present={served_from_file}")
            batch_wall_s(server, 1, 8)  # warm-up
            for cache in ("warm", "cold"):
                for batch in args.batches:
                    load0 = os.getloadavg()[0]
                    if cache == "cold":
                        with PageCacheDropper(shards, args.drop_every_ms / 1e3) as dropper:
                            m = decode_tps(server, batch, args.new_tokens, args.repeats)
                        drops = dropper.drops
                    else:
                        m = decode_tps(server, batch, args.new_tokens, args.repeats)
                        drops = 0
                    r = dict(backend=backend, page_cache=cache, batch=batch, **m, drops=drops, load1_before=load0,
                             load1_after=os.getloadavg()[0])
                    results.append(r)
                    print(f"{backend:>7} {cache:>5} batch {batch}: {m['tok_s']:7.1f} tok/s (runs "
                          f"{', '.join(f'{x:.1f}' for x in m['runs'])}); server CPU {m['cpu_ms_per_token']:.1f} "
                          f"ms/token (runs {', '.join(f'{x:.1f}' for x in m['cpu_runs'])}); load "
                          f"{load0:.1f}->{r['load1_after']:.1f}; drops {drops}", flush=True)
            rss = server_rss_mib(server)
            results.append(dict(backend=backend, rss_mib=rss))
            print(f"{backend:>7} RSS MiB: " + "; ".join(f"{k}: {v:.0f}" for k, v in rss.items()), flush=True)
        finally:
            server.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
