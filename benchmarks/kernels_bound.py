"""Is a decode launch bound by the memory system or by its instructions? (round 17 of docs/benchmarks/kernels.md)

    OUT=$OUT python3 benchmarks/kernels_bound.py         # on the H200, carrying .whl; writes $OUT/bound.json

The same call at batch 8 x 32k over four slot orders: in order (the benchmarks' default), every token at slot 0
and tokens cycling over 32 slots (every load an L1 hit after the first), and a random permutation. If the time
barely moves when nothing comes from DRAM, the loop's instructions bound it. CUDA-graph replays
(gpu_timing.bench_graph), median of 3.
"""

import functools
import json
import os
import statistics
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from gpu_timing import bench_graph
from kernels_bench import HEAD_CONFIGS
from kernels_profile import random_planes

from sglang_ext import kernels
from sglang_ext.kvformats import get_format

CASES = [(128, "octave_k3v4", {}), (128, "octave_k3v3", {}), (256, "octave_k3v4", {}), (128, "int8", {})]


def main():
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    batch, ctx = 8, 32768
    tokens = batch * ctx
    res = {}
    for d, name, var in CASES:
        hq, hkv, rot = HEAD_CONFIGS[d]
        fmt = get_format(name, head_dim=d, rotary_dim=rot)
        planes = random_planes(fmt, tokens, hkv, dev, gen)
        indptr = torch.arange(batch + 1, dtype=torch.int32, device=dev) * ctx
        q = torch.randn(batch, hq, d, device=dev, generator=gen).to(torch.bfloat16)
        o = torch.empty_like(q)
        orders = {"in_order": torch.arange(tokens, dtype=torch.int64, device=dev),
                  "slot0": torch.zeros(tokens, dtype=torch.int64, device=dev),
                  "same_32": (torch.arange(tokens, device=dev) % 32).to(torch.int64),
                  "random": torch.randperm(tokens, device=dev, generator=gen).to(torch.int64)}
        row = {}
        for order, idx in orders.items():
            fn = functools.partial(kernels.decode_attention, fmt, q, planes, o, indptr, idx, d ** -0.5, **var)
            row[order] = statistics.median(bench_graph(fn) for _ in range(3))
        key = f"d{d} {name} {json.dumps(var)}"
        res[key] = row
        print(key, " ".join(f"{k}={v:.1f}us" for k, v in row.items()), flush=True)
        del planes
    Path(os.environ.get("OUT", "/tmp"), "bound.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
