"""Decode time against the split count, over the benchmark grid, to check `decode.wave_splits`' choice:

    PYTHONUNBUFFERED=1 python3 benchmarks/kernels_splits.py --out $OUT/splits.json    # on the H200

For every shape (batch x context, every request the same length) and case (head_dim:format), each split count
1..16 is timed as a CUDA-graph replay (`gpu_timing.bench_graph`) with `max_kv_splits` = that count and
`fill_waves` off, so the grid has exactly that many splits. Also recorded: what `wave_splits` needs to replay its
choice on the host (programs per split, resident slots, mean length, tokens per iteration) and the count the
default launch chose, so that other cost models can be scored against the measured times afterwards
(`--score FILE` here, no GPU: each model's time over the best count's, per shape and over the grid).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

SPLITS = range(1, 17)


def measure(args) -> dict:
    import torch
    import triton

    res = {"device": torch.cuda.get_device_name(), "triton": triton.__version__,
           "sms": torch.cuda.get_device_properties("cuda").multi_processor_count, "shapes": {}}
    splits = [int(x) for x in args.splits.split(",")] if args.splits else list(SPLITS)
    cases = [(int(d), name) for d, _, name in (c.partition(":") for c in args.cases.split(","))]
    gen = torch.Generator(device="cuda").manual_seed(0)
    for shape in args.shapes.split(","):
        batch, ctx = (int(x) for x in shape.split("x"))
        for d, name in cases:
            key = f"b{batch} c{ctx} d{d} {name}"
            res["shapes"][key] = r = time_case(batch, ctx, d, name, splits, res["sms"], gen)
            t = r["times_us"]
            best = min(splits, key=lambda s: t[s])
            print(f"{key}: {r['occupancy']}, block_n {r['block_n']}, chosen {r['chosen']} ({t['default']:.1f} us), "
                  f"best {best} ({t[best]:.1f} us); " + " ".join(f"{s}:{t[s]:.0f}" for s in splits), flush=True)
            Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    return res


def time_case(batch, ctx, d, name, splits, sms, gen) -> dict:
    """Graph-replay times of the default launch and of each split count for one shape and case; the default
    launch's occupancy (the driver's resident count, registers, and the count by the SM's register total)."""
    import gpu_timing
    import torch
    import triton
    from kernels_bench import HEAD_CONFIGS
    from kernels_profile import random_planes

    from sglang_ext import kernels
    from sglang_ext.kernels import decode as dec
    from sglang_ext.kvformats import get_format

    hq, hkv, rot = HEAD_CONFIGS[d]
    fmt = get_format(name, head_dim=d, rotary_dim=rot)
    device = "cuda"
    tokens = batch * ctx
    indptr = torch.arange(batch + 1, dtype=torch.int32, device=device) * ctx
    idx = torch.arange(tokens, dtype=torch.int64, device=device)
    q = torch.randn(batch, hq, d, device=device, generator=gen).to(torch.bfloat16)
    o = torch.empty_like(q)
    planes = random_planes(fmt, tokens, hkv, device, gen)
    sm = d ** -0.5

    dec._RESIDENT.clear()
    occupancy = {}
    resident_programs = dec.resident_programs

    def traced(kernel, dev):
        n = occupancy["resident_per_sm"] = resident_programs(kernel, dev)
        props = torch.cuda.get_device_properties(dev)
        warps, shared = kernel.metadata.num_warps, kernel.metadata.shared
        regs_per_warp = -(-kernel.n_regs * 32 // 256) * 256
        occupancy.update(n_regs=kernel.n_regs, warps=warps, shared=shared,
                         by_sm_registers=props.regs_per_multiprocessor // (regs_per_warp * warps),
                         driver=dec._driver_occupancy(kernel.function, 32 * warps, shared))
        return n

    dec.resident_programs = traced
    try:
        kernels.decode_attention(fmt, q, planes, o, indptr, idx, sm)  # the default launch
    finally:
        dec.resident_programs = resident_programs
    kind = dec.layout(fmt)[0]
    launch = dec.default_launch(fmt, hq // hkv, 1, q, batch * hkv * dec.DEFAULT_MAX_KV_SPLITS)
    block_n = dec.tile_tokens(kind, launch.get("block_n") or dec.default_block_n(kind, d),
                              max(launch.get("min_rows", 16), triton.next_power_of_2(hq // hkv)), q)
    (resident,) = dec._RESIDENT.values()
    chosen = dec.wave_splits(batch * hkv, dec.DEFAULT_MAX_KV_SPLITS, sms * resident, ctx, block_n)

    def call(**kw):
        return lambda: kernels.decode_attention(fmt, q, planes, o, indptr, idx, sm, **kw)

    times = {"default": gpu_timing.bench_graph(call())}
    for s in splits:
        times[s] = gpu_timing.bench_graph(call(max_kv_splits=s, fill_waves=False))
    gpu_timing._GRAPHS.clear()  # each graph keeps its own memory pool
    torch.cuda.empty_cache()
    return {"batch": batch, "ctx": ctx, "head_dim": d, "format": name, "programs_per_split": batch * hkv,
            "resident_per_sm": resident, "block_n": block_n, "chosen": chosen, "occupancy": occupancy,
            "times_us": times}


def model_splits(programs_per_split, max_splits, slots, seq_len, block_n, overhead, slack, min_block=32) -> int:
    """wave_splits with a fixed cost of `overhead` loop iterations per program and the largest count within
    `slack` of the cheapest."""
    def cost(s):
        per_split = math.ceil(math.ceil(seq_len / s) / min_block) * min_block
        return math.ceil(programs_per_split * s / slots) * (max(1, math.ceil(per_split / block_n)) + overhead)
    best = min(cost(s) for s in range(1, max_splits + 1))
    return max(s for s in range(1, max_splits + 1) if cost(s) * 100 <= round(100 * (1 + slack)) * best)


def score(path: str, resident_from: str | None = None):
    res = json.loads(Path(path).read_text())
    sms = res["sms"]
    # the driver's resident count per launch (format, head_dim, block_n), from a run that recorded it
    driver = {}
    for r in json.loads(Path(resident_from).read_text())["shapes"].values() if resident_from else ():
        driver[(r["format"], r["head_dim"], r["block_n"])] = r["occupancy"]["driver"]
    models = [(o, sl) for o in (0, 0.5, 1, 2, 3, 4) for sl in (0.0, 0.05)]
    ratios = {m: [] for m in models}
    for key, r in res["shapes"].items():
        t = {int(k): v for k, v in r["times_us"].items() if k != "default"}
        if len(t) < len(SPLITS):
            continue  # a run over some counts only
        best = min(t.values())
        picks = []
        for m in models:
            resident = (r.get("occupancy", {}).get("driver") or driver.get((r["format"], r["head_dim"], r["block_n"]))
                        or r["resident_per_sm"])
            s = model_splits(r["programs_per_split"], 16, sms * resident, r["ctx"], r["block_n"], *m)
            ratios[m].append(t[s] / best)
            picks.append(s)
        print(f"{key:32s} best {min(t, key=t.get):2d} ({best:7.1f} us)  " +
              " ".join(f"{s:2d}:{t[s] / best:.2f}" for s in picks))
    print("model (overhead iterations, slack): geomean / worst of time over the best count's")
    for m, rs in ratios.items():
        if not rs:
            print("  no shape was timed at every count")
            break
        print(f"  {m}: {statistics.geometric_mean(rs):.3f} / {max(rs):.3f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--shapes", default="1x4096,1x32768,1x131072,8x4096,8x32768,8x131072,32x4096,32x32768,32x131072")
    ap.add_argument("--cases", default="128:int8,256:int8,128:octave_k3v4,256:octave_k3v4,128:octave_k3v3,"
                                       "256:octave_k3v3,128:bf16,256:bf16")
    ap.add_argument("--splits", default="", help="counts to time, comma-separated (default 1..16)")
    ap.add_argument("--score", help="a JSON this script wrote: score split-count models against it (no GPU)")
    ap.add_argument("--resident-from", help="with --score: take the driver's resident counts from this run's JSON")
    args = ap.parse_args()
    if args.score:
        score(args.score, args.resident_from)
    else:
        assert args.out, "--out"
        measure(args)


if __name__ == "__main__":
    main()
