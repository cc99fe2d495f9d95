"""Decode/extend attention over compressed KV (ours) vs SGLang 0.5.23's bf16 Triton kernels, in one process.

    # on the H200 (one device call; see docs/benchmarks/kernels.md for the command that carries .whl)
    PYTHONUNBUFFERED=1 python3 benchmarks/kernels_bench.py --out $OUT
    # here, tiny sizes under the Triton interpreter (correctness of the harness only, no timings)
    TRITON_INTERPRET=1 .venv/bin/python benchmarks/kernels_bench.py --quick --out /tmp/kb

Order: (a) device copy bandwidth, (d) correctness of every kernel vs a torch reference (poisoned outputs),
pool fill (our store kernel, timed), (b) decode grid, (c) extend of 4k new tokens over a 32k prefix.
Writes kernels.json to --out and prints a compact table last. The bf16 baseline is SGLang's own kernels,
loaded from the carried wheel files by kernels_sglang_baseline.py.
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import triton

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from gpu_timing import bench_clean, capture_graph  # noqa: E402
from kernels_check import LAST_PHASE, check_format, check_sglang, rel_err  # noqa: E402
from kernels_report import print_table, targets  # noqa: E402
from kernels_sglang_baseline import SGLANG_DEFAULT_MAX_KV_SPLITS, SGLangTritonDecode, sglang_extend  # noqa: E402

from sglang_ext.kernels.decode import run_decode  # noqa: E402
from sglang_ext.kernels.decode_plan import plan_decode  # noqa: E402

# head_dim -> (q heads, kv heads, rotary_dim): Llama/Qwen3-like d128 and Qwen3.5-like d256 partial RoPE
HEAD_CONFIGS = {128: (64, 8, 128), 256: (32, 4, 64)}
BATCHES = (1, 8, 32)
CONTEXTS = (4096, 32768, 131072)
OUR_FORMATS = ("bf16", "int8", "octave_k3v4", "octave_k3v3")  # "bf16" = our kernels on bf16 planes
EXTEND_PREFIX, EXTEND_NEW = 32768, 4096
FILL_CHUNK = 1 << 18  # tokens per store call while filling the pools
SWEEP_BLOCK_N = (32, 64, 128)
SWEEP_WARPS = (4, 8)
SWEEP_FORMATS = ("int8", "octave_k3v4")  # k3v3 differs from k3v4 only in V's bits
EXTEND_REP_MS = 500  # extend calls take tens of ms: enough repetitions for a median
ROTATE_BELOW_BYTES = 1 << 30  # rotate among several slot windows when one call's K/V is smaller than this


class Timer:
    """Median of triton.testing.do_bench (L2 flushed before every call) on the GPU; one wall-clock run on CPU.
    graphs (`--timing graph`, round 12): eager calls timed by gpu_timing.bench_clean (L2 evicted by a read), and
    decode timed as the replay of a CUDA graph (`replay`)."""

    def __init__(self, gpu: bool, rep_ms: int, graphs: bool = False):
        self.gpu, self.rep_ms, self.graphs = gpu, rep_ms, graphs and gpu

    def __call__(self, fn, rep_ms: int | None = None) -> dict:
        if not self.gpu:
            t0 = time.perf_counter()
            fn()
            return {"ms": (time.perf_counter() - t0) * 1e3, "p20": None, "p80": None}
        if self.graphs:
            return {"ms": bench_clean(fn) * 1e-3, "p20": None, "p80": None}
        p20, p50, p80 = triton.testing.do_bench(fn, warmup=10, rep=rep_ms or self.rep_ms, quantiles=[0.2, 0.5, 0.8])
        return {"ms": p50, "p20": p20, "p80": p80}

    def replay(self, fn) -> dict:
        """With graphs: the median replay of fn captured in a CUDA graph (bench_clean), as "ms" and "graph_ms"."""
        ms = bench_clean(capture_graph(fn).replay) * 1e-3
        return {"ms": ms, "p20": None, "p80": None, "graph_ms": ms, "graph_error": None}

    def graph(self, fn) -> dict:
        """Median replay time of fn captured in a CUDA graph (no launch gaps), or the capture error."""
        if not self.gpu:
            return {"graph_ms": None, "graph_error": "cpu"}
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
        except Exception as exc:  # recorded in the JSON and printed: capture is optional
            torch.cuda.synchronize()
            return {"graph_ms": None, "graph_error": f"{type(exc).__name__}: {exc}"[:300]}
        p50 = triton.testing.do_bench(graph.replay, warmup=10, rep=self.rep_ms, quantiles=[0.5])
        return {"graph_ms": p50[0] if isinstance(p50, (list, tuple)) else p50, "graph_error": None}


def copy_bandwidth(timer: Timer, device: str, nbytes: int) -> dict:
    src = torch.randint(-128, 127, (nbytes,), dtype=torch.int8, device=device)
    dst = torch.empty_like(src)
    t = timer(lambda: dst.copy_(src))
    return {"bytes_read_plus_written": 2 * nbytes, **t, "TBps": 2 * nbytes / (t["ms"] * 1e-3) / 1e12}


def fill_pools(fmts, kernels, kb, vb, planes, max_slots, dtype, device, gpu, log) -> list[dict]:
    """Same random K/V into the bf16 buffers and every format's planes; times our store kernel per format."""
    hkv, d = kb.shape[1], kb.shape[2]
    gen = torch.Generator(device=device).manual_seed(99)
    ms = {f.name: 0.0 for f in fmts}
    timed_tokens = 0
    for i, s in enumerate(range(0, max_slots, FILL_CHUNK)):
        e = min(s + FILL_CHUNK, max_slots)
        k = torch.randn(e - s, hkv, d, generator=gen, device=device, dtype=torch.float32).to(dtype)
        v = torch.randn(e - s, hkv, d, generator=gen, device=device, dtype=torch.float32).to(dtype)
        kb[s:e], vb[s:e] = k, v
        loc = torch.arange(s, e, device=device, dtype=torch.int64)
        for f in fmts:
            if planes[f.name].get("k") is kb:
                continue  # our bf16 planes are views of kb/vb
            if gpu:
                ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                ev0.record()
            kernels.store_kv(f, planes[f.name], loc, k, v)
            if gpu:
                ev1.record()
                ev1.synchronize()
                if i > 0:  # the first chunk pays for compilation
                    ms[f.name] += ev0.elapsed_time(ev1)
        if i > 0:
            timed_tokens += e - s
    rows = []
    for f in fmts:
        if planes[f.name].get("k") is kb or not gpu or timed_tokens == 0:
            continue
        in_bytes = timed_tokens * hkv * d * 2 * kb.element_size()
        out_bytes = timed_tokens * hkv * f.bytes_per_token_head
        sec = ms[f.name] * 1e-3
        rows.append({"format": f.name, "head_dim": d, "tokens": timed_tokens, "ms": ms[f.name],
                     "in_GBps": in_bytes / sec / 1e9, "in_plus_out_TBps": (in_bytes + out_bytes) / sec / 1e12})
        log(f"store {f.name} d{d}: {timed_tokens} tokens in {ms[f.name]:.2f} ms "
            f"({rows[-1]['in_plus_out_TBps']:.2f} TB/s in+out)")
    return rows


def bench_decode(cfg, fmts, kernels, kb, vb, planes, combos, timer, dtype, device, log) -> list[dict]:
    hq, hkv, d = cfg
    sm_scale = 1.0 / math.sqrt(d)
    max_slots = kb.shape[0]
    rows = []
    gen = torch.Generator(device=device).manual_seed(5)
    for batch, ctx in combos:
        tokens = batch * ctx
        n_rot = 1 if tokens * hkv * 4 * d >= ROTATE_BELOW_BYTES else max(1, min(4, max_slots // tokens))
        indices = [torch.arange(r * tokens, (r + 1) * tokens, device=device, dtype=torch.int64)
                   for r in range(n_rot)]
        indptr = (torch.arange(batch + 1, dtype=torch.int32, device=device) * ctx).contiguous()
        q = torch.randn(batch, hq, d, generator=gen, device=device, dtype=torch.float32).to(dtype)
        outs = {}

        seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
        # run(idx) launches one decode over the slot window idx; timing cycles through the windows.
        # SGLang twice: its defaults (the baseline of every speed-up) and --triton-attention-num-kv-splits 16,
        # the split cap our launcher uses, to tell the split count's share of a difference from the format's.
        variants = []
        for name, splits in (("bf16-sglang", SGLANG_DEFAULT_MAX_KV_SPLITS), ("bf16-sglang-s16", 16)):
            base = SGLangTritonDecode(max_kv_splits=splits)
            base.plan(seq_lens, hq, hkv, d)
            o = torch.empty_like(q)
            variants.append((name, 4 * d,
                             lambda idx, o=o, base=base: base.run(q, kb, vb, o, indptr, idx, sm_scale), o))
        for f in fmts:  # planned once for the batch (as the attention backend does), run per call
            o_f = torch.empty_like(q)
            plan = plan_decode(f, planes[f.name], batch=batch, num_q_heads=hq, q_dtype=dtype, seq_lens_sum=tokens)
            variants.append((f.name, f.bytes_per_token_head, lambda idx, f=f, o_f=o_f, plan=plan: run_decode(
                plan, f, q, planes[f.name], o_f, indptr, idx, sm_scale), o_f))
        for name, bpt, run, out in variants:
            cyc = itertools.cycle(indices)
            if timer.graphs:  # one slot window: the read before each replay evicts the L2
                t = timer.replay(lambda run=run: run(indices[0]))
            else:
                t = timer(lambda run=run, cyc=cyc: run(next(cyc)))
            kv_bytes = tokens * hkv * bpt
            row = {"kernel": name, "head_dim": d, "batch": batch, "ctx": ctx, "kv_bytes": kv_bytes, **t,
                   "TBps": kv_bytes / (t["ms"] * 1e-3) / 1e12, "rotations": 1 if timer.graphs else n_rot}
            if not timer.graphs:
                row.update(timer.graph(lambda run=run: run(indices[0])))
            rows.append(row)
        for name, _, run, out in variants:  # same window for every kernel, then compare with SGLang's output
            run(indices[0])
            outs[name] = out.float()
        for row in rows[-len(variants):]:
            row["rel_err_vs_bf16_sglang"] = rel_err(outs[row["kernel"]], outs["bf16-sglang"])
        log(" ".join(f"{r['kernel']}={r['ms'] * 1e3:.0f}us" for r in rows[-len(variants):])
            + f"  [d{d} B{batch} ctx{ctx}]")
    return rows


def bench_sweep(cfg, fmts, kernels, planes, timer, dtype, device, log, batch=8, ctx=32768) -> list[dict]:
    """Our decode at batch x ctx over the launcher's tuning knobs (those its signature offers):
    tokens per iteration (block_n) x warps. Tells whether the kernels as written can reach the targets."""
    hq, hkv, d = cfg
    params = inspect.signature(kernels.decode_attention).parameters
    knobs = [k for k in ("block_n", "num_warps") if k in params]
    if len(knobs) < 2:
        log(f"sweep skipped: decode_attention has no {set(('block_n', 'num_warps')) - set(knobs)} argument")
        return []
    gen = torch.Generator(device=device).manual_seed(8)
    q = torch.randn(batch, hq, d, generator=gen, device=device, dtype=torch.float32).to(dtype)
    o = torch.empty_like(q)
    indptr = torch.arange(batch + 1, dtype=torch.int32, device=device) * ctx
    idx = torch.arange(batch * ctx, dtype=torch.int64, device=device)
    rows = []
    for f in (f for f in fmts if f.name in SWEEP_FORMATS):
        for block_n, warps in itertools.product(SWEEP_BLOCK_N, SWEEP_WARPS):
            row = {"kernel": f.name, "head_dim": d, "batch": batch, "ctx": ctx, "block_n": block_n,
                   "num_warps": warps}
            run = lambda f=f, bn=block_n, w=warps: kernels.decode_attention(  # noqa: E731
                f, q, planes[f.name], o, indptr, idx, 1.0 / math.sqrt(d), seq_lens_sum=batch * ctx, block_n=bn,
                num_warps=w)
            try:
                t = timer(run)
            except Exception as exc:  # e.g. out of shared memory at a large tile: recorded, not timed
                row["error"] = f"{type(exc).__name__}: {exc}"[:200]
                rows.append(row)
                continue
            row.update(t)
            row["TBps"] = batch * ctx * hkv * f.bytes_per_token_head / (t["ms"] * 1e-3) / 1e12
            rows.append(row)
        best = min((r for r in rows if r["kernel"] == f.name and "ms" in r and r["head_dim"] == d),
                   key=lambda r: r["ms"], default=None)
        if best:
            log(f"sweep d{d} {f.name}: best block_n={best['block_n']} warps={best['num_warps']} "
                f"{best['ms'] * 1e3:.0f} us {best['TBps']:.2f} TB/s")
    return rows


def bench_extend(cfg, fmts, kernels, kb, vb, planes, timer, dtype, device, prefix, new, log) -> list[dict]:
    hq, hkv, d = cfg
    sm_scale = 1.0 / math.sqrt(d)
    gen = torch.Generator(device=device).manual_seed(6)
    qe = torch.randn(new, hq, d, generator=gen, device=device, dtype=torch.float32).to(dtype)
    ke = torch.randn(new, hkv, d, generator=gen, device=device, dtype=torch.float32).to(dtype)
    ve = torch.randn(new, hkv, d, generator=gen, device=device, dtype=torch.float32).to(dtype)
    qo_indptr = torch.tensor([0, new], dtype=torch.int32, device=device)
    kv_indptr = torch.tensor([0, prefix], dtype=torch.int32, device=device)
    kv_indices = torch.arange(prefix, dtype=torch.int64, device=device)
    flops = 4 * hq * d * (new * prefix + new * (new + 1) / 2)
    rows, outs = [], {}
    o = torch.empty_like(qe)
    variants = [("bf16-sglang", lambda: sglang_extend(qe, ke, ve, o, kb, vb, qo_indptr, kv_indptr, kv_indices,
                                                       new, sm_scale), o)]
    for f in fmts:
        o_f = torch.empty_like(qe)
        variants.append((f.name, lambda f=f, o_f=o_f: kernels.extend_attention(
            f, qe, ke, ve, o_f, planes[f.name], qo_indptr, kv_indptr, kv_indices, new, sm_scale, is_causal=True), o_f))
    for name, fn, out in variants:
        t = timer(fn, rep_ms=EXTEND_REP_MS)
        rows.append({"kernel": name, "head_dim": d, "prefix": prefix, "new": new, **t,
                     "TFLOPs": flops / (t["ms"] * 1e-3) / 1e12})
        outs[name] = out.float()
    for r in rows:
        r["rel_err_vs_bf16_sglang"] = rel_err(outs[r["kernel"]], outs["bf16-sglang"])
        r["ratio_vs_bf16"] = r["ms"] / rows[0]["ms"]
    log(" ".join(f"{r['kernel']}={r['ms']:.2f}ms" for r in rows) + f"  [extend d{d} {new} over {prefix}]")
    # store of the new tokens (bf16: the copy SGLang's set_kv_buffer does)
    loc = torch.arange(prefix, prefix + new, device=device, dtype=torch.int64)
    t = timer(lambda: (kb.index_copy_(0, loc, ke), vb.index_copy_(0, loc, ve)))
    rows.append({"kernel": "bf16-sglang", "head_dim": d, "op": "store", "new": new, **t})
    for f in fmts:
        if f.name != "bf16":
            rows.append({"kernel": f.name, "head_dim": d, "op": "store", "new": new,
                         **timer(lambda f=f: kernels.store_kv(f, planes[f.name], loc, ke, ve))})
    return rows


def plan_memory(cfg, fmts, combos, free_bytes, log):
    """Largest combos whose pools fit in 85 % of free memory; returns (kept combos, skipped, max_slots)."""
    hq, hkv, d = cfg
    per_slot = hkv * (4 * d + sum(f.bytes_per_token_head for f in fmts if f.name != "bf16"))
    scratch = 3 * FILL_CHUNK * hkv * d * 4 + (1 << 30)
    kept, skipped = [], []
    for b, c in combos:
        (kept if b * c * per_slot + scratch <= 0.85 * free_bytes else skipped).append((b, c))
    for b, c in skipped:
        log(f"skip d{d} B{b} ctx{c}: pools need {b * c * per_slot / 2**30:.1f} GiB, free {free_bytes / 2**30:.1f} GiB")
    max_slots = max(b * c for b, c in kept) if kept else 0
    return kept, skipped, max_slots


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/kernels_bench"))
    ap.add_argument("--quick", action="store_true", help="tiny sizes for a CPU run under TRITON_INTERPRET=1")
    ap.add_argument("--baseline-only", action="store_true", help="copy bandwidth + SGLang bf16 only")
    ap.add_argument("--rep-ms", type=int, default=60)
    ap.add_argument("--timing", choices=["do_bench", "graph"], default="do_bench",
                    help="graph: decode as CUDA-graph replays, every call after an L2 eviction by a read (round 12)")
    ap.add_argument("--head-dims", default="128,256")
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--contexts", default=",".join(map(str, CONTEXTS)))
    ap.add_argument("--no-sweep", action="store_true", help="skip the launcher sweep at batch 8 x 32k")
    ap.add_argument("--formats", default=",".join(OUR_FORMATS), help="our formats (SGLang's bf16 always runs)")
    ap.add_argument("--no-extend", action="store_true", help="skip the extend benchmark")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.is_available() and not args.quick
    device = "cuda" if gpu else "cpu"
    # SGLang's decode kernel does not run in bf16 under the Triton interpreter (numpy has no bf16): fp16 there
    dtype = torch.bfloat16 if gpu else torch.float16
    timer = Timer(gpu, args.rep_ms, graphs=args.timing == "graph")
    lines = []

    def log(msg):
        print(msg, flush=True)
        lines.append(msg)

    res = {"device": torch.cuda.get_device_name() if gpu else "cpu (TRITON_INTERPRET=1)", "torch": torch.__version__,
           "timing": args.timing,
           "triton": triton.__version__, "dtype": str(dtype), "checks": [], "store": [], "decode": [], "sweep": [],
           "extend": [],
           "skipped": [], "errors": []}
    batches = tuple(int(x) for x in args.batches.split(","))
    contexts = tuple(int(x) for x in args.contexts.split(","))
    if args.quick:
        batches, contexts = (1, 3), (64, 200)
    prefix, new = (EXTEND_PREFIX, EXTEND_NEW) if not args.quick else (150, 40)
    res["copy"] = copy_bandwidth(timer, device, (4 << 30) if gpu else (64 << 20))
    log(f"copy: {res['copy']['TBps']:.3f} TB/s (read+written over time)")

    kernels = None
    fmt_names = () if args.baseline_only else tuple(filter(None, args.formats.split(",")))
    if fmt_names:
        from sglang_ext import kernels  # noqa: F811
        from sglang_ext.kvformats import get_format
    for d in (int(x) for x in args.head_dims.split(",")):
        hq, hkv, rot = HEAD_CONFIGS[d]
        if args.quick:
            hq, hkv = 8, 2
        cfg = (hq, hkv, d)
        fmts = [get_format(n, head_dim=d, rotary_dim=rot) for n in fmt_names]
        # (d) correctness before timing
        res["checks"].append(check_sglang(SGLangTritonDecode(), sglang_extend, cfg, dtype, device))
        for f in list(fmts):
            try:
                res["checks"].append(check_format(f, kernels, cfg, dtype, device))
            except Exception as exc:  # a format our kernels reject: recorded, printed, and not timed
                res["errors"].append(f"{f.name} d{d} ({LAST_PHASE['phase']}): {type(exc).__name__}: {exc}"[:400])
                log(f"CHECK ERROR {res['errors'][-1]}")
                fmts.remove(f)
        for c in res["checks"][-1 - len(fmts):]:
            log("check " + json.dumps(c))
        combos = [(b, c) for b in batches for c in contexts]
        free = torch.cuda.mem_get_info()[0] if gpu else (8 << 30)
        combos, skipped, max_slots = plan_memory(cfg, fmts, combos, free, log)
        res["skipped"] += [{"head_dim": d, "batch": b, "ctx": c} for b, c in skipped]
        max_slots = max(max_slots, prefix + new)
        kb = torch.empty(max_slots, hkv, d, dtype=dtype, device=device)
        vb = torch.empty_like(kb)
        # our bf16 kernels read SGLang's buffers themselves (same [slots, H, D] layout) when the dtype is bf16
        planes = {f.name: ({"k": kb, "v": vb} if f.name == "bf16" and dtype == torch.bfloat16
                           else f.allocate(max_slots, hkv, device)) for f in fmts}
        res["store"] += fill_pools(fmts, kernels, kb, vb, planes, max_slots, dtype, device, gpu, log)
        res["decode"] += bench_decode(cfg, fmts, kernels, kb, vb, planes, combos, timer, dtype, device, log)
        if gpu and not args.no_sweep:
            res["sweep"] += bench_sweep(cfg, [f for f in fmts if f.name != "bf16"], kernels, planes, timer, dtype,
                                        device, log)
        if not args.no_extend:
            res["extend"] += bench_extend(cfg, fmts, kernels, kb, vb, planes, timer, dtype, device, prefix, new, log)
        del kb, vb, planes
        if gpu:
            torch.cuda.empty_cache()
        (out / "kernels.json").write_text(json.dumps(res, indent=1))
    res["targets"] = targets(res)
    (out / "kernels.json").write_text(json.dumps(res, indent=1))
    (out / "kernels_bench.log").write_text("\n".join(lines) + "\n")
    print_table(res)


if __name__ == "__main__":
    main()
