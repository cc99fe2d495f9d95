"""What reading a prefill's own new tokens back from the pool costs on a GPU (docs/kv-formats.md, "Same prompt,
same output"): extend attention with new_slots (the serving default: the new tokens were stored first and are
read back through the format) against the full-precision path (SGLANG_EXT_KV_EXTEND_NEW_TOKENS=full: k_extend /
v_extend), per compressed format, head_dim and prefix length; store_kv, which both paths run, is timed apart.

    python benchmarks/extend_pool_gpu.py --out /tmp/extend-pool.json      # one GPU process, no SGLang, ~1 min

Shapes: one request of NEW new tokens (default 4096, a prefill chunk) after a prefix of 0 / 4k / 28k tokens;
Llama-3-8B's attention at d128 (32 q / 8 KV heads) and a Qwen3.5-27B-like full-attention layer at d256 / rotary 64
(24 q / 4 KV heads); bf16 q / k / v as SGLang hands them. Each call is timed alone after an L2 eviction
(gpu_timing.bench_clean), median of --reps, and as
CUDA-graph replays (gpu_timing.bench_graph: GPU time without the host's launch time). The same run checks on the GPU that the pool path gives a token the
same output however the prompt is split (whole vs two chunks, the second attending to the first as cached
prefix), and that the full-precision path does not.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gpu_timing import bench_clean, bench_graph
from sglang_ext.kernels import extend_attention, store_kv
from sglang_ext.kvformats import get_format

FORMATS = ("int8", "octave_k3v4", "octave_k3v3")
SHAPES = {128: (32, 8, None), 256: (24, 4, 64)}  # head_dim: (q heads, KV heads, rotary dims)
PREFIXES = (0, 4096, 28672)


def indptr(lengths, dev) -> torch.Tensor:
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=dev)
    out[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int32, device=dev), 0)
    return out


def case(name: str, d: int, prefix: int, new: int, reps: int) -> dict:
    hq, hkv, rotary = SHAPES[d]
    fmt = get_format(name, d, rotary)
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    total = prefix + new
    planes = fmt.allocate(total + 64, hkv, dev)
    slots = (torch.randperm(total + 63, device=dev, generator=gen)[:total] + 1).to(torch.int32)
    k = torch.randn(total, hkv, d, device=dev, generator=gen, dtype=torch.bfloat16)
    v = torch.randn(total, hkv, d, device=dev, generator=gen, dtype=torch.bfloat16)
    q = torch.randn(new, hq, d, device=dev, generator=gen, dtype=torch.bfloat16)
    store_kv(fmt, planes, slots, k, v)
    new_k, new_v, new_slots, prefix_slots = k[prefix:], v[prefix:], slots[prefix:], slots[:prefix]
    o = torch.empty_like(q)
    qo, kvp = indptr([new], dev), indptr([prefix], dev)
    scale = d ** -0.5

    def run(pool: bool):
        # prefix_rows from the host, as the attention backend's per-batch plan gives it (no device read)
        return extend_attention(fmt, q, new_k, new_v, o, planes, qo, kvp, prefix_slots, new, scale,
                                new_slots=new_slots if pool else None, prefix_rows=prefix)

    row = {"format": name, "head_dim": d, "prefix": prefix, "new": new,
           "store_us": round(bench_clean(lambda: store_kv(fmt, planes, new_slots, new_k, new_v), reps=reps), 1),
           "full_us": round(bench_clean(lambda: run(False), reps=reps), 1),
           "pool_us": round(bench_clean(lambda: run(True), reps=reps), 1)}
    row["extra_pct"] = round(100 * (row["pool_us"] / row["full_us"] - 1), 2)
    # the same calls replayed from CUDA graphs: GPU time only (eager timings of a lone call include the host's
    # launch time wherever the host launches slower than the GPU runs, as it does for the pool path's two extra
    # dequantize launches in front of the attention kernel)
    try:
        row["full_graph_us"] = round(bench_graph(lambda: run(False)), 1)
        row["pool_graph_us"] = round(bench_graph(lambda: run(True)), 1)
        row["extra_graph_pct"] = round(100 * (row["pool_graph_us"] / row["full_graph_us"] - 1), 2)
    except Exception as exc:  # noqa: BLE001 (recorded next to the eager timings)
        row["graph_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return row


def split_check(name: str, d: int, new: int) -> dict:
    """Whole prompt in one extend vs two chunks (the second over the first as prefix): max |diff| of the second
    chunk's rows (float32 outputs), pool path and full-precision path."""
    hq, hkv, rotary = SHAPES[d]
    fmt = get_format(name, d, rotary)
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(1)
    planes = fmt.allocate(new + 1, hkv, dev)
    slots = torch.arange(1, new + 1, dtype=torch.int32, device=dev)
    k = torch.randn(new, hkv, d, device=dev, generator=gen, dtype=torch.bfloat16)
    v = torch.randn(new, hkv, d, device=dev, generator=gen, dtype=torch.bfloat16)
    q = torch.randn(new, hq, d, device=dev, generator=gen, dtype=torch.bfloat16)
    store_kv(fmt, planes, slots, k, v)
    half = new // 2
    out = {}
    for pool in (True, False):
        whole = torch.empty(q.shape, dtype=torch.float32, device=dev)
        extend_attention(fmt, q, k, v, whole, planes, indptr([new], dev), indptr([0], dev), slots[:0], new,
                         d ** -0.5, new_slots=slots if pool else None, prefix_rows=0)
        second = torch.empty(q[half:].shape, dtype=torch.float32, device=dev)
        extend_attention(fmt, q[half:], k[half:], v[half:], second, planes, indptr([new - half], dev),
                         indptr([half], dev), slots[:half], new - half, d ** -0.5,
                         new_slots=slots[half:] if pool else None, prefix_rows=half)
        out["pool_max_diff" if pool else "full_max_diff"] = (whole[half:] - second).abs().max().item()
    return {"format": name, "head_dim": d, "new": new, **out}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/extend-pool.json"))
    ap.add_argument("--new", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "rows": [], "split": []}
    for d in SHAPES:
        for name in FORMATS:
            result["split"].append(split_check(name, d, 1024))
            print(json.dumps(result["split"][-1]), flush=True)
            for prefix in PREFIXES:
                result["rows"].append(case(name, d, prefix, args.new, args.reps))
                print(json.dumps(result["rows"][-1]), flush=True)
                args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
