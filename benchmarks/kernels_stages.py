"""Each kernel's share of one decode call, by the call's default launch (round 17 of docs/benchmarks/kernels.md):

    OUT=$OUT python3 benchmarks/kernels_stages.py        # on the H200, carrying .whl; writes $OUT/stages.json

Per case (head_dim:format) at batch 8 x 32k and 8 x 4k: the call replayed from a CUDA graph after an L2 eviction
by a read (gpu_timing.bench_graph, median of 3) and the GPU time of each of its kernels (kernels_breakdown's
torch.profiler means over 20 back-to-back calls). Round 17 found the octave rotations this way.
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
from kernels_breakdown import kernel_times
from kernels_profile import random_planes
from kernels_variants import decode_inputs

from sglang_ext import kernels
from sglang_ext.kvformats import get_format

CASES = ("128:octave_k3v4", "256:octave_k3v4", "256:octave_k3v3", "128:int8")


def main():
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    res = {}
    for batch, ctx in ((8, 32768), (8, 4096)):
        for case in CASES:
            d, name = int(case.split(":")[0]), case.split(":")[1]
            hq, hkv, rot = HEAD_CONFIGS[d]
            fmt = get_format(name, head_dim=d, rotary_dim=rot)
            tokens, indptr, idx, q, o, kb, vb, sm, _ = decode_inputs(batch, ctx, hq, hkv, d, dev, gen)
            planes = random_planes(fmt, tokens, hkv, dev, gen)
            del kb, vb
            fn = functools.partial(kernels.decode_attention, fmt, q, planes, o, indptr, idx, sm)
            graph = statistics.median(bench_graph(fn) for _ in range(3))
            per_kernel = kernel_times(fn)
            res[f"B{batch}x{ctx} {case}"] = {"graph_clean_us": graph, "kernels_us": per_kernel,
                                              "kernel_sum_us": sum(per_kernel.values())}
            print(f"B{batch}x{ctx} {case} graph {graph:.1f} sum {sum(per_kernel.values()):.1f}", per_kernel, flush=True)
            del planes
    Path(os.environ.get("OUT", "/tmp"), "stages.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
