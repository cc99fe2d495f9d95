"""Decode at the byte limit: the table of docs/benchmarks/kernels.md's section "Decode at the byte limit".

    # on an H200, with SGLang's kernel files in .whl/sglang_0_5_23_kernels/ (kernels_sglang_baseline.py): ~140 s
    PYTHONUNBUFFERED=1 python3 benchmarks/kernels_roofline.py --out results/
    # here, no GPU: the harness at tiny sizes under the Triton interpreter (no meaningful times)
    TRITON_INTERPRET=1 .venv/bin/python benchmarks/kernels_roofline.py --quick --out /tmp/kr
    # the doc's tables from the JSON
    python3 benchmarks/kernels_roofline.py --markdown docs/benchmarks/kernels-roofline.json

What it times, each call as the replay of a CUDA graph after a 256 MB read has evicted the L2 (gpu_timing), one
plan per batch made outside the graph (decode_plan.plan_decode), the layer's run_decode inside it:
- the device copy bandwidth (4 GiB, bytes read + written over time): the ceiling every share is taken of;
- SGLang 0.5.23's Triton bf16 decode kernel (its default 8 splits, its own split counts): "sglang";
- our kernels over bf16 planes ("bf16": the bandwidth-optimal baseline), int8, and octave_k3v4 / octave_k3v3 both
  by the default plan (Gluon stage 1 on sm_90: "k3v4") and by the portable Triton stage 1 ("k3v4-triton", what
  RDNA3 and Ampere run);
at head_dim 128 (full RoPE) and 256 (rotary 64), GQA groups of 8 and 4 q heads per KV head, batch 8 x 32k,
32 x 32k and 8 x 128k, and three slot layouts: "contig" (each request one run of slots: a fresh server, page
size 1), "p1" (page size 1, every token in a random slot) and "p16" (pages of 16 slots in a random order).
Effective bandwidth = KV bytes the call must read (tokens x KV heads x bytes per token and head, scales included;
kv_indices not counted) / time. Every output is compared with SGLang's (relative error) before timing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))



def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64."""
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm())

# label -> (head_dim, q heads, kv heads, rotary_dim)
CONFIGS = {"d128-g8": (128, 64, 8, 128), "d128-g4": (128, 32, 8, 128),
           "d256-g8": (256, 32, 4, 64), "d256-g4": (256, 16, 4, 64)}
SHAPES = ((8, 32768), (32, 32768), (8, 131072))
LAYOUTS = ("contig", "p1", "p16")
# kernel label -> (format name, DecodeOverrides kwargs); "sglang" is SGLang's own kernel over the bf16 pool
KERNELS = {"bf16": ("bf16", {}), "int8": ("int8", {}), "k3v4": ("octave_k3v4", {}),
           "k3v4-triton": ("octave_k3v4", {"stage1": "triton"}), "k3v3": ("octave_k3v3", {}),
           "k3v3-triton": ("octave_k3v3", {"stage1": "triton"})}
FILL_CHUNK = 1 << 18


def slot_layout(layout: str, tokens: int, pool: int, gen: torch.Generator, device) -> torch.Tensor:
    """Token-level slot ids (int64) of `tokens` tokens in a pool of `pool` slots, as SGLang passes them."""
    if layout == "contig":
        return torch.arange(tokens, device=device, dtype=torch.int64)
    page = 1 if layout == "p1" else 16
    pages = torch.randperm(pool // page, generator=gen, device=device)[: -(-tokens // page)]
    idx = (pages[:, None] * page + torch.arange(page, device=device)[None, :]).flatten()[:tokens].contiguous()
    assert idx.numel() == tokens, (layout, tokens, pool)
    return idx


def fill(fmts, kb, vb, planes, device, dtype):
    """The same random K/V into the bf16 buffers and every format's planes (our store kernel)."""
    from sglang_ext.kernels import store_kv

    gen = torch.Generator(device=device).manual_seed(99)
    n, hkv, d = kb.shape
    for s in range(0, n, FILL_CHUNK):
        e = min(s + FILL_CHUNK, n)
        k = torch.randn(e - s, hkv, d, generator=gen, device=device, dtype=torch.float32).to(dtype)
        v = torch.randn(e - s, hkv, d, generator=gen, device=device, dtype=torch.float32).to(dtype)
        kb[s:e], vb[s:e] = k, v
        loc = torch.arange(s, e, device=device, dtype=torch.int64)
        for f in fmts.values():
            if planes[f.name].get("k") is not kb:  # our bf16 planes are kb / vb themselves where the dtype is bf16
                store_kv(f, planes[f.name], loc, k, v)


def run_config(label, shapes, layouts, timer, dtype, device, log) -> list[dict]:
    from kernels_sglang_baseline import SGLangTritonDecode

    from sglang_ext.kernels.decode import run_decode
    from sglang_ext.kernels.decode_plan import DecodeOverrides, plan_decode
    from sglang_ext.kvformats import get_format

    d, hq, hkv, rot = CONFIGS[label]
    if device == "cpu":
        hq, hkv = hq // 4, hkv // 4
    fmts = {n: get_format(n, head_dim=d, rotary_dim=rot) for n in {f for f, _ in KERNELS.values()}}
    pool = -(-max(b * c for b, c in shapes) // 16) * 16  # whole pages of 16
    kb = torch.empty(pool, hkv, d, dtype=dtype, device=device)
    vb = torch.empty_like(kb)
    planes = {n: ({"k": kb, "v": vb} if n == "bf16" and dtype == torch.bfloat16 else f.allocate(pool, hkv, device))
              for n, f in fmts.items()}
    fill(fmts, kb, vb, planes, device, dtype)
    gen = torch.Generator(device=device).manual_seed(5)
    sm_scale = 1.0 / math.sqrt(d)
    rows = []
    for batch, ctx in shapes:
        tokens = batch * ctx
        q = torch.randn(batch, hq, d, generator=gen, device=device, dtype=torch.float32).to(dtype)
        indptr = (torch.arange(batch + 1, dtype=torch.int32, device=device) * ctx).contiguous()
        seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
        base = SGLangTritonDecode()
        base.plan(seq_lens, hq, hkv, d)
        for layout in layouts:
            idx = slot_layout(layout, tokens, pool, gen, device)
            page = 16 if layout == "p16" else 1
            calls = {}
            o_s = torch.empty_like(q)
            calls["sglang"] = (4 * d, lambda o_s=o_s, base=base, q=q, ip=indptr, idx=idx: base.run(
                q, kb, vb, o_s, ip, idx, sm_scale), o_s, "")
            for name, (fname, ov) in KERNELS.items():
                f = fmts[fname]
                o = torch.empty_like(q)
                plan = plan_decode(f, planes[fname], batch=batch, num_q_heads=hq, q_dtype=dtype,
                                   seq_lens_sum=tokens, overrides=DecodeOverrides(**ov))
                run = lambda f=f, o=o, plan=plan, q=q, ip=indptr, idx=idx, page=page: run_decode(
                    plan, f, q, planes[f.name], o, ip, idx, sm_scale, page_size=page)
                calls[name] = (f.bytes_per_token_head, run, o,
                    f"{plan.stage1} splits={plan.grid_splits} block_n={plan.block_n or plan.consts.get('BLOCK_N')}")
            outs = {}
            for name, (_, fn, o, _) in calls.items():
                o.fill_(float("nan"))
                fn()
                outs[name] = o.float().clone()
            for name, (bpt, fn, o, how) in calls.items():
                t_us = timer(fn)
                kv_bytes = tokens * hkv * bpt
                rows.append({"config": label, "head_dim": d, "q_heads": hq, "kv_heads": hkv, "batch": batch,
                             "ctx": ctx, "layout": layout, "kernel": name, "plan": how, "us": t_us,
                             "kv_bytes": kv_bytes, "TBps": kv_bytes / (t_us * 1e-6) / 1e12,
                             "rel_err_vs_sglang": rel_err(outs[name], outs["sglang"]),
                             "rel_err_vs_bf16": rel_err(outs[name], outs["bf16"])})
            # SGLang's kernel a second time, last: the spread of one kernel's time within a shape
            rows.append({**rows[-len(calls)], "kernel": "sglang-again", "us": timer(calls["sglang"][1])})
            rows[-1]["TBps"] = rows[-1]["kv_bytes"] / (rows[-1]["us"] * 1e-6) / 1e12
            log(f"{label} B{batch} {ctx // 1024}k {layout}: " + " ".join(
                f"{r['kernel']}={r['us']:.0f}" for r in rows[-len(calls) - 1:]))
            del calls, outs
    return rows  # the pools go with this frame


def markdown(res: dict, layout: str = "p16") -> str:
    """The doc's tables: (1) at `layout`, per config and shape, each kernel's us (share of the copy bandwidth;
    speed-up over SGLang's bf16 / over our bf16); (2) at batch 8 x 32k, each kernel's us per slot layout."""
    copy = res["copy"]["TBps"]
    by = {}
    for r in res["decode"]:
        by.setdefault((r["config"], r["batch"], r["ctx"], r["layout"]), {})[r["kernel"]] = r
    ours = [k for k in KERNELS if k != "bf16"]
    lines = ["| config | B x ctx | SGLang bf16 | our bf16 | " + " | ".join(ours) + " |",
             "|" + " --- |" * (4 + len(ours))]
    for (cfg, b, c, lay), ks in by.items():
        if lay != layout:
            continue
        s, o = ks["sglang"]["us"], ks["bf16"]["us"]
        cells = [f"{s:.0f} ({ks['sglang']['TBps'] / copy:.0%})", f"{o:.0f} ({ks['bf16']['TBps'] / copy:.0%}; {s / o:.2f}x)"]
        cells += [f"{ks[k]['us']:.0f} ({ks[k]['TBps'] / copy:.0%}; {s / ks[k]['us']:.2f}x / {o / ks[k]['us']:.2f}x)"
                  for k in ours]
        lines.append(f"| {cfg} | {b} x {c // 1024}k | " + " | ".join(cells) + " |")
    kinds = ["sglang", "bf16"] + ours
    lines += ["", "| config, 8 x 32k | slots | " + " | ".join(kinds) + " |", "|" + " --- |" * (2 + len(kinds))]
    for (cfg, b, c, lay), ks in by.items():
        if (b, c) == (8, 32768):
            lines.append(f"| {cfg} | {lay} | " + " | ".join(f"{ks[k]['us']:.0f}" for k in kinds) + " |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/kernels_roofline"))
    ap.add_argument("--quick", action="store_true", help="tiny sizes on the CPU under TRITON_INTERPRET=1")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--markdown", metavar="JSON", help="print the doc's tables from a result file and exit")
    ap.add_argument("--table-layout", default="p16", help="the slot layout of --markdown's first table")
    args = ap.parse_args()
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text()), args.table_layout))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.is_available() and not args.quick
    device = "cuda" if gpu else "cpu"
    dtype = torch.bfloat16 if gpu else torch.float16  # SGLang's kernel has no bf16 under the interpreter
    shapes = SHAPES if gpu else ((1, 64), (3, 100))
    if gpu:
        from gpu_timing import bench_clean, capture_graph

        def timer(fn):
            graph = capture_graph(fn)
            return bench_clean(graph.replay)
    else:
        def timer(fn):
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e6

    t_start = time.time()
    res = {"device": torch.cuda.get_device_name() if gpu else "cpu (TRITON_INTERPRET=1)", "torch": torch.__version__,
           "dtype": str(dtype), "timing": "CUDA-graph replay after a 256 MB L2-evicting read, median of 100",
           "decode": []}
    if gpu:
        import triton

        res["triton"] = triton.__version__
        n = 4 << 30
        src = torch.randint(-128, 127, (n,), dtype=torch.int8, device=device)
        dst = torch.empty_like(src)
        us = bench_clean(lambda: dst.copy_(src))
        res["copy"] = {"bytes_read_plus_written": 2 * n, "us": us, "TBps": 2 * n / (us * 1e-6) / 1e12}
        del src, dst
    else:
        res["copy"] = {"TBps": 1.0, "us": None}
    print(f"copy: {res['copy']['TBps']:.3f} TB/s", flush=True)
    res["errors"] = []
    for label in args.configs.split(","):
        try:
            res["decode"] += run_config(label, shapes, args.layouts.split(","), timer, dtype, device, print)
        except Exception as exc:  # noqa: BLE001 - recorded in the JSON and printed; the other configs still run
            traceback.print_exc()
            res["errors"].append(f"{label}: {type(exc).__name__}: {exc}"[:500])
        if gpu:
            torch.cuda.empty_cache()
        (out / "kernels-roofline.json").write_text(json.dumps(res, indent=1))
        print(f"[{label} done at {time.time() - t_start:.0f} s]", flush=True)
    res["wall_s"] = time.time() - t_start
    (out / "kernels-roofline.json").write_text(json.dumps(res, indent=1))
    print(markdown(res))


if __name__ == "__main__":
    main()
