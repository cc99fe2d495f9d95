"""HiCache host <-> device page moves on a GPU: the Triton in-place path (kernels/host_transfer.py, what
`--hicache-io-backend kernel` runs) against the torch path (kernels/host_pages.py, `direct`), per KV format and
host layout. Checks every moved byte (both paths against the source rows) and reports time and GB/s.

Produces docs/benchmarks/agent-sessions.md, "On a GPU: host <-> device moves", and the GPU figures of
docs/kv-formats.md, "HiCache with compressed formats". Time: not recorded (one process, no
server).

    python benchmarks/hicache_transfer_gpu.py --out results/     # needs CUDA; no SGLang import

Shape: a 48-layer model with 8 KV heads of head_dim 128 (rotary 128); a session of --tokens tokens moves from
device slots to host slots (backup, all layers) and back to other device slots (load, layer by layer, as
SGLang's layer-wise load does). Host planes are page-locked (one cudaHostRegister), as the host pool makes them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from sglang_ext.kernels import host_pages, host_transfer  # noqa: E402
from sglang_ext.kvformats import get_format  # noqa: E402

FORMATS = ("bf16", "int8", "octave_k3v4", "octave_k3v3")


def random_planes(fmt, slots: int, heads: int, layers: int, gen: torch.Generator) -> list[dict[str, torch.Tensor]]:
    out = []
    for _ in range(layers):
        planes = {}
        for name, (dtype, tail) in fmt.plane_specs().items():
            t = torch.empty((slots, heads, *tail), dtype=dtype, device="cuda")
            t.view(torch.uint8).copy_(torch.randint(0, 256, t.view(torch.uint8).shape, dtype=torch.uint8,
                                                    device="cuda", generator=gen))
            planes[name] = t
        out.append(planes)
    return out


def timed(fn, reps: int) -> float:
    """Median wall seconds of fn() over reps, GPU synchronized around each call."""
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def run(fmt_name: str, layout: str, tokens: int, layers: int, heads: int, head_dim: int, page: int, reps: int) -> dict:
    fmt = get_format(fmt_name, head_dim, head_dim)
    gen = torch.Generator(device="cuda").manual_seed(0)
    device_slots = 2 * tokens + page
    src = random_planes(fmt, device_slots, heads, layers, gen)
    dst = [{n: torch.zeros_like(p) for n, p in planes.items()} for planes in src]
    host = host_pages.allocate_host_planes(fmt.plane_specs(), layout, layers, 2 * tokens, page, heads, pin=True)
    device_idx = torch.randperm(tokens, generator=gen, device="cuda") + page  # scattered source slots
    host_idx = torch.arange(tokens, 2 * tokens).cuda()  # whole host pages
    back_to = torch.arange(tokens, 2 * tokens).cuda() + page
    moved_bytes = tokens * heads * fmt.bytes_per_token_head * layers

    def backup_kernel():
        host_transfer.backup_layers(host, src, layout, host_idx, device_idx)

    def load_kernel():
        for layer in range(layers):
            host_transfer.load_layer(host, dst[layer], layout, layer, host_idx, back_to)

    def backup_torch():
        host_pages.backup_layers(host, src, layout, host_idx.cpu(), device_idx, page)

    def load_torch():
        for layer in range(layers):
            host_pages.load_layer(host, dst[layer], layout, layer, host_idx.cpu(), back_to, page)

    def check(tag: str) -> bool:
        torch.cuda.synchronize()
        # Bytes, not values: random bit patterns include NaNs, which never compare equal as floats.
        return all(torch.equal(dst[l][n][back_to].view(torch.uint8), src[l][n][device_idx].view(torch.uint8))
                   for l in range(layers) for n in src[l])

    result = {"format": fmt_name, "layout": layout, "tokens": tokens, "layers": layers, "heads": heads,
              "head_dim": head_dim, "page": page, "bytes": moved_bytes}
    for path, backup, load in (("kernel", backup_kernel, load_kernel), ("torch", backup_torch, load_torch)):
        for planes in host.values():
            planes.view(torch.uint8).zero_()
        for planes in dst:
            for p in planes.values():
                p.zero_()
        backup()
        load()
        result[f"{path}_exact"] = check(path)
        result[f"{path}_backup_s"] = timed(backup, reps)
        result[f"{path}_load_s"] = timed(load, reps)
        result[f"{path}_backup_gbs"] = moved_bytes / result[f"{path}_backup_s"] / 1e9
        result[f"{path}_load_gbs"] = moved_bytes / result[f"{path}_load_s"] / 1e9
    host_pages.unpin_host_planes(host)
    return result


def copy_bandwidth(nbytes: int, reps: int) -> dict:
    """Plain pinned host <-> device copies of nbytes: what a single cudaMemcpy reaches here."""
    h = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    d = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    h2d = timed(lambda: d.copy_(h, non_blocking=True), reps)
    d2h = timed(lambda: h.copy_(d, non_blocking=True), reps)
    return {"bytes": nbytes, "h2d_gbs": nbytes / h2d / 1e9, "d2h_gbs": nbytes / d2h / 1e9}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--layouts", default=",".join(host_pages.HOST_LAYOUTS))
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    results = {"device": torch.cuda.get_device_name(), "copy": copy_bandwidth(1 << 30, a.reps), "runs": []}
    print(json.dumps(results["copy"]), flush=True)
    for fmt in a.formats.split(","):
        for layout in a.layouts.split(","):
            r = run(fmt, layout, a.tokens, a.layers, a.heads, a.head_dim, a.page, a.reps)
            results["runs"].append(r)
            print(f"{fmt:12s} {layout:18s} {r['bytes'] / 1e6:8.1f} MB  exact kernel/torch {r['kernel_exact']}/"
                  f"{r['torch_exact']}  backup {r['kernel_backup_gbs']:6.1f} / {r['torch_backup_gbs']:6.1f} GB/s  "
                  f"load {r['kernel_load_gbs']:6.1f} / {r['torch_load_gbs']:6.1f} GB/s", flush=True)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "hicache-transfer-gpu.json").write_text(json.dumps(results, indent=1))
    return 0 if all(r["kernel_exact"] and r["torch_exact"] for r in results["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
