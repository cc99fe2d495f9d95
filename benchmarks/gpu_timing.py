"""How kernels_roofline.py times GPU calls (docs/benchmarks/kernels.md, "Method"; a helper, nothing to run on its
own): each call timed alone with CUDA events after a 256 MB read has evicted the L2 (`bench_clean`), optionally
as the replay of a CUDA graph captured once (`bench_graph`), which leaves out the host's launch time."""

from __future__ import annotations

import statistics

import torch

_EVICT: dict = {}


def bench_clean(fn, reps: int = 100, warmup: int = 10) -> float:
    """Median us of fn, timed alone (CUDA events around each call) after a 256 MB read has evicted the L2.

    `triton.testing.do_bench` evicts it with a 256 MB write instead: the L2 is then full of dirty lines, and
    writing them back costs the timed call about 12 us of DRAM time (measured: int8 d128 at batch 8 x 32k, 173 us
    under do_bench against 159 us of kernel time in the profiler). A serving step's attention follows kernels
    that mostly read (weights), so a read leaves the L2 closer to its state there."""
    dev = torch.cuda.current_device()
    if dev not in _EVICT:
        _EVICT[dev] = torch.ones(64 << 20, dtype=torch.float32, device="cuda")
    buf = _EVICT[dev]
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        buf.sum()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) * 1e3


_GRAPHS: dict = {}


def bench_graph(fn) -> float:
    """bench_clean of fn captured once in a CUDA graph (what a serving engine replays at decode): the kernels'
    time without the host's launch time, which eager timings of short calls include whenever the host launches
    slower than the GPU runs."""
    if fn not in _GRAPHS:
        _GRAPHS[fn] = capture_graph(fn)
    return bench_clean(_GRAPHS[fn].replay)


def capture_graph(fn) -> torch.cuda.CUDAGraph:
    """fn captured in a CUDA graph, after an eager warm-up call (compiles, fills launcher caches)."""
    fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
    torch.cuda.synchronize()
    return graph
