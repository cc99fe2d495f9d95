"""Targets of issue 3 and the compact table kernels_bench.py prints last (from its result dict / kernels.json).

    python3 benchmarks/kernels_report.py kernels.json     # re-print the table of a saved run
"""

from __future__ import annotations

import json
import sys

# issue 3, at batch 8 x 32k context
TARGET_BATCH, TARGET_CTX = 8, 32768
MIN_FRACTION_OF_COPY = 0.80
MIN_SPEEDUP = {"int8": 1.8, "octave_k3v4": 3.5, "octave_k3v3": 4.0}
MAX_EXTEND_RATIO = 1.2
SHORT = {"bf16-sglang": "sgl-bf16", "bf16-sglang-s16": "sgl-bf16-s16", "bf16": "our-bf16", "int8": "int8",
         "octave_k3v4": "k3v4", "octave_k3v3": "k3v3"}


def _decode_row(res, kernel, d, b, c):
    for r in res["decode"]:
        if (r["kernel"], r["head_dim"], r["batch"], r["ctx"]) == (kernel, d, b, c):
            return r
    return None


def targets(res) -> list[dict]:
    """One entry per (target, head_dim, format): measured value, bound, met."""
    out = []
    copy = res["copy"]["TBps"]
    for d in sorted({r["head_dim"] for r in res["decode"]}):
        base = _decode_row(res, "bf16-sglang", d, TARGET_BATCH, TARGET_CTX)
        for name, need in MIN_SPEEDUP.items():
            row = _decode_row(res, name, d, TARGET_BATCH, TARGET_CTX)
            if row is None or base is None:
                out.append({"target": "decode B8x32k", "head_dim": d, "format": name, "met": None,
                            "note": "not measured"})
                continue
            frac = row["TBps"] / copy
            out.append({"target": "decode B8x32k bandwidth >= 80% of copy", "head_dim": d, "format": name,
                        "value": frac, "bound": MIN_FRACTION_OF_COPY, "met": frac >= MIN_FRACTION_OF_COPY})
            speedup = base["ms"] / row["ms"]
            out.append({"target": f"decode B8x32k speed-up over bf16 >= {need}", "head_dim": d, "format": name,
                        "value": speedup, "bound": need, "met": speedup >= need})
    for r in res["extend"]:
        if r.get("op") is None and r["kernel"] in MIN_SPEEDUP:
            out.append({"target": "extend 4k over 32k <= 1.2x bf16 time", "head_dim": r["head_dim"],
                        "format": r["kernel"], "value": r["ratio_vs_bf16"], "bound": MAX_EXTEND_RATIO,
                        "met": r["ratio_vs_bf16"] <= MAX_EXTEND_RATIO})
    return out


def print_table(res) -> None:
    print(f"\n== {res['device']} | torch {res['torch']} | triton {res['triton']} ==")
    print(f"copy D2D: {res['copy']['TBps']:.3f} TB/s (bytes read + written / median time)")
    for c in res["checks"]:
        keys = [k for k in c if "rel_err" in k or k in ("ok", "store_ok", "decode_unwritten", "extend_unwritten")]
        print(f"check {c['format']:>11} d{c['head_dim']}: " + " ".join(
            f"{k}={c[k]:.2e}" if isinstance(c[k], float) else f"{k}={c[k]}" for k in keys))
    for e in res.get("errors", []):
        print("ERROR", e)
    kernels = list(dict.fromkeys(r["kernel"] for r in res["decode"]))
    print("\ndecode: median us, effective TB/s (K/V bytes / time), speed-up vs sgl-bf16; [graph-replay us]")
    print(f"{'d':>4} {'B':>3} {'ctx':>7} | " + " | ".join(f"{SHORT.get(k, k):^27}" for k in kernels))
    for d, b, c in dict.fromkeys((r["head_dim"], r["batch"], r["ctx"]) for r in res["decode"]):
        base = _decode_row(res, "bf16-sglang", d, b, c)
        cells = []
        for k in kernels:
            r = _decode_row(res, k, d, b, c)
            if r is None or base is None:
                cells.append(f"{'not measured':^27}")
                continue
            g = f"[{r['graph_ms'] * 1e3:.0f}]" if r.get("graph_ms") else "[-]"
            cells.append(f"{r['ms'] * 1e3:7.0f} {r['TBps']:4.2f} {base['ms'] / r['ms']:4.2f}x {g:>7}")
        print(f"{d:>4} {b:>3} {c:>7} | " + " | ".join(cells))
    if res.get("sweep"):
        print("\nsweep of our decode at B8x32k: median us (TB/s) per block_n x num_warps")
        for d, k in dict.fromkeys((r["head_dim"], r["kernel"]) for r in res["sweep"]):
            cells = [f"bn{r['block_n']}/w{r['num_warps']}: " + (f"{r['ms'] * 1e3:.0f} ({r['TBps']:.2f})" if "ms" in r
                                                                else "error")
                     for r in res["sweep"] if (r["head_dim"], r["kernel"]) == (d, k)]
            print(f"  d{d} {SHORT.get(k, k):>5}: " + "  ".join(cells))
    print("\nextend (B1): median ms, TFLOP/s, time / sgl-bf16; store of the new tokens: median us")
    for r in res["extend"]:
        if r.get("op") is None:
            print(f"  d{r['head_dim']} {SHORT.get(r['kernel'], r['kernel']):>8}: {r['ms']:7.3f} ms "
                  f"{r['TFLOPs']:6.1f} TFLOP/s  x{r['ratio_vs_bf16']:.2f}  "
                  f"err_vs_bf16={r['rel_err_vs_bf16_sglang']:.2e}")
        else:
            print(f"  d{r['head_dim']} {SHORT.get(r['kernel'], r['kernel']):>8}: store {r['new']} tokens "
                  f"{r['ms'] * 1e3:.1f} us")
    for s in res.get("store", []):
        print(f"fill d{s['head_dim']} {s['format']}: {s['in_plus_out_TBps']:.2f} TB/s in+out")
    for s in res.get("skipped", []):
        print(f"skipped d{s['head_dim']} B{s['batch']} ctx{s['ctx']} (memory)")
    print("\ntargets:")
    for t in res.get("targets", []):
        if t["met"] is None:
            print(f"  {t['target']} d{t['head_dim']} {t['format']}: {t['note']}")
        else:
            print(f"  {'MET ' if t['met'] else 'MISS'} {t['target']} d{t['head_dim']} {t['format']}: "
                  f"{t['value']:.2f} (bound {t['bound']})")


def markdown(res) -> str:
    """The decode and extend tables as Markdown, for docs/benchmarks/kernels.md."""
    kernels = list(dict.fromkeys(r["kernel"] for r in res["decode"]))
    out = ["| d | B | ctx | " + " | ".join(SHORT.get(k, k) for k in kernels) + " |",
           "|---|---|---|" + "---|" * len(kernels)]
    for d, b, c in dict.fromkeys((r["head_dim"], r["batch"], r["ctx"]) for r in res["decode"]):
        base = _decode_row(res, "bf16-sglang", d, b, c)
        cells = []
        for k in kernels:
            r = _decode_row(res, k, d, b, c)
            if r is None:
                cells.append("n/m")
                continue
            g = f" [{r['graph_ms'] * 1e3:.0f}]" if r.get("graph_ms") else ""
            cells.append(f"{r['ms'] * 1e3:.0f}{g} us, {r['TBps']:.2f} TB/s, {base['ms'] / r['ms']:.2f}x")
        out.append(f"| {d} | {b} | {c // 1024}k | " + " | ".join(cells) + " |")
    out += ["", "| d | kernel | extend ms | TFLOP/s | time / sgl-bf16 | rel. err vs sgl-bf16 | store 4096 tokens |",
            "|---|---|---|---|---|---|---|"]
    stores = {(r["kernel"], r["head_dim"]): r["ms"] for r in res["extend"] if r.get("op") == "store"}
    for r in res["extend"]:
        if r.get("op") is None:
            st = stores.get((r["kernel"], r["head_dim"]))
            out.append(f"| {r['head_dim']} | {SHORT.get(r['kernel'], r['kernel'])} | {r['ms']:.2f} | "
                       f"{r['TFLOPs']:.1f} | {r['ratio_vs_bf16']:.2f} | {r['rel_err_vs_bf16_sglang']:.1e} | "
                       + (f"{st * 1e3:.0f} us |" if st is not None else "(views of the bf16 pool) |"))
    return "\n".join(out)


if __name__ == "__main__":
    result = json.loads(open(sys.argv[1]).read())
    if "--markdown" in sys.argv:
        print(markdown(result))
    else:
        print_table(result)
