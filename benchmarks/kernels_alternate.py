"""int8 decode conversion modes timed in alternation, in one process, at batch 8 x 32k (the issue-3 shape).

    PYTHONUNBUFFERED=1 python3 benchmarks/kernels_alternate.py --out $OUT/alt-1.json [--rounds 7]   # on the H200

Round 6 saw the same command time one variant 209 us in one process and 258 us in another, while the default
moved 238 -> 279 us between two processes: a single timing per process cannot choose a default. Here, per head_dim,
SGLang's bf16 kernel and each int8 mode (`decode.I8_F16_BOTH`, `decode.I8_F16_V`) are timed one after the other,
`--rounds` times, over the same inputs, each a `triton.testing.do_bench` median; every mode is first checked
against the torch reference on a small ragged shape. Run it in two processes to see the spread between them.
Writes the JSON (every timing) and prints per mode the median over rounds and its speed-up over SGLang's median.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import triton

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from kernels_bench import HEAD_CONFIGS  # noqa: E402
from kernels_check import rel_err  # noqa: E402
from kernels_profile import random_planes  # noqa: E402
from kernels_variants import decode_inputs  # noqa: E402

from sglang_ext import kernels  # noqa: E402
from sglang_ext.kernels import decode as dec  # noqa: E402
from sglang_ext.kvformats import get_format, reference  # noqa: E402

MODES = {"f16_both": dec.I8_F16_BOTH, "f16_v": dec.I8_F16_V}


def check(fmt, hq, hkv, d, mode, device, gen) -> float:
    """Relative error of one mode against the torch reference over stored K/V (ragged batch of 3, shuffled
    slots), NaN if an output element was left unwritten."""
    lens = [700, 1, 2100]
    n = sum(lens)
    slots = torch.randperm(n + 64, device=device)[:n]
    planes = fmt.allocate(n + 64, hkv, device)
    k = torch.randn(n, hkv, d, device=device, generator=gen)
    v = torch.randn(n, hkv, d, device=device, generator=gen)
    kernels.store_kv(fmt, planes, slots, k.to(torch.bfloat16), v.to(torch.bfloat16))
    indptr = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=device)
    q = torch.randn(len(lens), hq, d, device=device, generator=gen).to(torch.bfloat16)
    ref = reference.decode_attention(fmt, q, planes, indptr, slots, d ** -0.5)
    o = torch.full(q.shape, float("nan"), dtype=torch.bfloat16, device=device)
    kernels.decode_attention(fmt, q, planes, o, indptr, slots, d ** -0.5, int8_f16=mode)
    return rel_err(o.float(), ref) if not o.isnan().any() else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--head-dims", default="128,256")
    args = ap.parse_args()
    device = "cuda"
    gen = torch.Generator(device=device).manual_seed(0)
    res = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "rounds": args.rounds, "head_dims": {}}
    batch, ctx = 8, 32768
    for d in (int(x) for x in args.head_dims.split(",")):
        hq, hkv, rot = HEAD_CONFIGS[d]
        fmt = get_format("int8", head_dim=d, rotary_dim=rot)
        errs = {name: check(fmt, hq, hkv, d, mode, device, gen) for name, mode in MODES.items()}
        print(f"d{d} check: " + " ".join(f"{n}={e:.1e}" for n, e in errs.items()), flush=True)
        assert all(e < 2e-2 for e in errs.values()), errs
        tokens, indptr, idx, q, o, kb, vb, sm, base = decode_inputs(batch, ctx, hq, hkv, d, device, gen)
        planes = random_planes(fmt, tokens, hkv, device, gen)
        runs = {"sglang_bf16": lambda: base.run(q, kb, vb, o, indptr, idx, sm)}
        for name, mode in MODES.items():
            runs[name] = (lambda m: lambda: kernels.decode_attention(fmt, q, planes, o, indptr, idx, sm, int8_f16=m))(mode)
        times = {name: [] for name in runs}
        for r in range(args.rounds):
            for name, fn in runs.items():
                times[name].append(triton.testing.do_bench(fn, warmup=10, rep=60, quantiles=[0.5]) * 1e3)
            print(f"d{d} round {r}: " + " ".join(f"{n}={t[-1]:.0f}us" for n, t in times.items()), flush=True)
        med = {n: statistics.median(t) for n, t in times.items()}
        summary = {n: {"median_us": m, "min_us": min(times[n]), "max_us": max(times[n]),
                       "speedup_vs_sglang": med["sglang_bf16"] / m} for n, m in med.items()}
        res["head_dims"][str(d)] = {"check_rel_err": errs, "times_us": times, "summary": summary}
        print(f"d{d} medians: " + " ".join(f"{n}={s['median_us']:.0f}us ({s['speedup_vs_sglang']:.2f}x)"
                                         for n, s in summary.items()), flush=True)
        del planes, kb, vb
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
