"""Plot a kernels_bench.py result: python3 benchmarks/kernels_plot.py kernels.json kernels.png (needs matplotlib).

Top row: effective decode bandwidth (K/V bytes / median time) per (batch, context), one panel per head_dim,
with the measured copy bandwidth and 80 % of it. Bottom row: speed-up over SGLang's bf16 kernel, with the
issue's per-format targets at batch 8 x 32k marked.
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

from kernels_report import MIN_FRACTION_OF_COPY, MIN_SPEEDUP, SHORT, TARGET_BATCH, TARGET_CTX  # noqa: E402

COLORS = {"bf16-sglang": "black", "bf16-sglang-s16": "tab:purple", "bf16": "grey", "int8": "tab:blue",
          "octave_k3v4": "tab:orange",
          "octave_k3v3": "tab:green"}


def plot(res, path):
    dims = sorted({r["head_dim"] for r in res["decode"]})
    fig, axes = plt.subplots(2, len(dims), figsize=(max(6.5 * len(dims), 9), 8), squeeze=False)
    copy = res["copy"]["TBps"]
    for col, d in enumerate(dims):
        rows = [r for r in res["decode"] if r["head_dim"] == d]
        combos = list(dict.fromkeys((r["batch"], r["ctx"]) for r in rows))
        labels = [f"B{b}\n{c // 1024}k" for b, c in combos]
        x = range(len(combos))
        base = {(r["batch"], r["ctx"]): r["ms"] for r in rows if r["kernel"] == "bf16-sglang"}
        bw_ax, sp_ax = axes[0][col], axes[1][col]
        for kernel in dict.fromkeys(r["kernel"] for r in rows):
            by = {(r["batch"], r["ctx"]): r for r in rows if r["kernel"] == kernel}
            bw = [by[c]["TBps"] if c in by else float("nan") for c in combos]
            sp = [base[c] / by[c]["ms"] if c in by and c in base else float("nan") for c in combos]
            style = dict(marker="o", color=COLORS.get(kernel), label=SHORT.get(kernel, kernel),
                         ls="--" if kernel in ("bf16", "bf16-sglang-s16") else "-")
            bw_ax.plot(x, bw, **style)
            sp_ax.plot(x, sp, **style)
            if kernel in MIN_SPEEDUP and (TARGET_BATCH, TARGET_CTX) in combos:
                i = combos.index((TARGET_BATCH, TARGET_CTX))
                sp_ax.scatter([i], [MIN_SPEEDUP[kernel]], marker="_", s=400, color=COLORS.get(kernel), zorder=5)
        bw_ax.axhline(copy, color="red", ls="--", lw=1, label=f"copy {copy:.2f} TB/s")
        bw_ax.axhline(MIN_FRACTION_OF_COPY * copy, color="red", ls=":", lw=1, label="80% of copy")
        bw_ax.set_title(f"decode d{d}: effective K/V bandwidth")
        bw_ax.set_ylabel("TB/s (K/V bytes / median time)")
        sp_ax.set_title(f"decode d{d}: speed-up over SGLang bf16 (bars: targets, B8x32k)")
        sp_ax.set_ylabel("x (log scale)")
        sp_ax.set_yscale("log")
        sp_ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        sp_ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        sp_ax.set_yticks([0.1, 0.2, 0.5, 1, 2, 4, 8])
        for ax in (bw_ax, sp_ax):
            ax.set_xticks(list(x), labels)
            ax.grid(alpha=0.3)
        bw_ax.legend(fontsize=8)
    how = ("CUDA-graph replays after an L2 eviction by a read, medians" if res.get("timing") == "graph"
           else "triton.testing.do_bench medians")
    fig.suptitle(f"{res['device']}, torch {res['torch']}, triton {res['triton']} ({how})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    plot(json.loads(open(sys.argv[1]).read()), sys.argv[2])
