"""Where one decode_attention call's time goes, on the H200 (round 12):

    PYTHONUNBUFFERED=1 python3 benchmarks/kernels_breakdown.py '{"default": {}, "st2": {"num_stages": 2}}' \
        128:int8,256:int8 $OUT/breakdown.json          # carrying .whl (kernels_variants' imports need it)

Per variant (NAME: keyword arguments of `kernels.decode_attention`) and case (head_dim:format), batch 8 x 32k:
the eager `triton.testing.do_bench` median (3 times), the same call captured in a CUDA graph and replayed under
do_bench (2 times), and the GPU time of each kernel of the call (torch.profiler, mean over 20 back-to-back calls,
no L2 eviction between them). do_bench evicts the L2 with a 256 MB write before each call; the gap between its
times and the kernels' sum is how round 12 found the write-back of those dirty lines (about 12 us).
"""

import functools
import json
import sys
from pathlib import Path

import torch
import triton

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from gpu_timing import capture_graph
from kernels_bench import HEAD_CONFIGS
from kernels_profile import random_planes
from kernels_variants import decode_inputs

from sglang_ext import kernels
from sglang_ext.kvformats import get_format


def graph_time(fn) -> float:
    return triton.testing.do_bench(capture_graph(fn).replay, warmup=10, rep=60, quantiles=[0.5]) * 1e3


def kernel_times(fn, calls: int = 20) -> dict[str, float]:
    """us of GPU time per call, by kernel name (first 60 characters)."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    out = {}
    for event in prof.key_averages():
        t = getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0)
        if t:
            out[event.key[:60]] = round(t / calls, 2)
    return out


def main():
    variants = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {"default": {}}
    cases = sys.argv[2].split(",") if len(sys.argv) > 2 else ["128:int8", "256:int8"]
    out_path = Path(sys.argv[3] if len(sys.argv) > 3 else "/tmp/breakdown.json")
    device = "cuda"
    gen = torch.Generator(device=device).manual_seed(0)
    res = {}
    for case in cases:
        d, name = case.split(":")
        d = int(d)
        hq, hkv, rot = HEAD_CONFIGS[d]
        fmt = get_format(name, head_dim=d, rotary_dim=rot)
        tokens, indptr, idx, q, o, kb, vb, sm, _ = decode_inputs(8, 32768, hq, hkv, d, device, gen)
        planes = random_planes(fmt, tokens, hkv, device, gen)
        del kb, vb
        for vn, kw in variants.items():
            fn = functools.partial(kernels.decode_attention, fmt, q, planes, o, indptr, idx, sm, **kw)
            eager = [triton.testing.do_bench(fn, warmup=10, rep=60, quantiles=[0.5]) * 1e3 for _ in range(3)]
            graph = [graph_time(fn) for _ in range(2)]
            per_kernel = kernel_times(fn)
            res[f"{case} {vn}"] = {"eager": eager, "graph": graph, "kernels": per_kernel}
            print(case, vn, "eager", [round(x, 1) for x in eager], "graph", [round(x, 1) for x in graph], per_kernel,
                  flush=True)
        del planes
    out_path.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
