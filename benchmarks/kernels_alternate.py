"""Decode launcher variants timed in alternation with SGLang's bf16 kernel, in one process, at batch 8 x 32k by default (the
issue-3 shape):

    PYTHONUNBUFFERED=1 python3 benchmarks/kernels_alternate.py --out $OUT/alt.json [--rounds 7] \
        [--cases 128:int8,256:int8] [--variant NAME='{"num_warps": 8}' ...] [--batch 1 --ctx 131072]
                                                                                  # on the H200, carrying .whl

One process can time the same kernel 17 % apart from the next (round 6), so a single timing per process cannot
choose a default: here, per case (head_dim:format), SGLang's bf16 kernel and each variant (keyword arguments of
`kernels.decode_attention`) are timed one after the other `--rounds` times over the same inputs, each a
`triton.testing.do_bench` median. Before timing, every variant of every case is compared with the torch reference
over stored K/V (ragged batch of 3, slots in shuffled pages of 1 and 16, output poisoned with NaN). A 4 GiB copy
gives the bandwidth the shares are taken of (bytes read: the K/V code and scale planes).
Defaults: the int8 conversion modes of round 7 (`decode.I8_F16_BOTH`, `decode.I8_F16_V`) at d128 and d256.
Round 8 timed the two 3-bit lookups: `--cases 128:octave_k3v3,256:octave_k3v4,256:octave_k3v3,128:octave_k3v4
--variant planes='{"lut": 1}' --variant codes='{"lut": 2}'`.
Writes the JSON (every timing) and prints per variant the median over rounds and its speed-up over SGLang's median.
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

from gpu_timing import bench_clean, bench_graph  # noqa: E402
from kernels_bench import HEAD_CONFIGS  # noqa: E402
from kernels_check import rel_err  # noqa: E402
from kernels_profile import random_planes  # noqa: E402
from kernels_variants import decode_inputs  # noqa: E402

from sglang_ext import kernels  # noqa: E402
from sglang_ext.kernels import decode as dec  # noqa: E402
from sglang_ext.kvformats import get_format, reference  # noqa: E402

DEFAULT_VARIANTS = {"f16_both": {"int8_f16": dec.I8_F16_BOTH}, "f16_v": {"int8_f16": dec.I8_F16_V}}


def check(fmt, hq, hkv, d, variant, page_size, device, gen) -> float:
    """Relative error against the torch reference (ragged batch of 3, slots in shuffled pages), NaN if an output
    element was left unwritten."""
    lens = [700, 1, 2100]
    pages = [-(-n // page_size) for n in lens]
    n_pages = sum(pages) + 8
    perm = torch.randperm(n_pages, device=device)[:sum(pages)]
    slots, at = [], 0
    for n, p in zip(lens, pages):
        pg = perm[at:at + p]
        at += p
        slots.append((pg[:, None] * page_size + torch.arange(page_size, device=device)[None, :]).flatten()[:n])
    slots = torch.cat(slots)
    n = sum(lens)
    planes = fmt.allocate(n_pages * page_size, hkv, device)
    k = torch.randn(n, hkv, d, device=device, generator=gen)
    v = torch.randn(n, hkv, d, device=device, generator=gen)
    kernels.store_kv(fmt, planes, slots, k.to(torch.bfloat16), v.to(torch.bfloat16))
    indptr = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=device)
    q = torch.randn(len(lens), hq, d, device=device, generator=gen).to(torch.bfloat16)
    ref = reference.decode_attention(fmt, q, planes, indptr, slots, d ** -0.5)
    o = torch.full(q.shape, float("nan"), dtype=torch.bfloat16, device=device)
    # token-level slot ids in runs of page_size consecutive slots, as SGLang passes them (decode.py's docstring)
    kernels.decode_attention(fmt, q, planes, o, indptr, slots, d ** -0.5, page_size=page_size, **variant)
    return rel_err(o.float(), ref) if not o.isnan().any() else float("nan")


def copy_bandwidth(device, timer: str = "do_bench") -> float:
    """TB/s of a 4 GiB device-to-device copy (bytes read + written over the median time, TIMERS[timer]);
    printed. With timer "graph" the copy is timed eagerly (bench_clean): captured in a graph it becomes a memcpy
    node run by the copy engines, 2.72 TB/s against the 4.28 of the copy kernel (H200, round 12)."""
    src = torch.empty(4 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    timer = "clean" if timer == "graph" else timer
    t = TIMERS[timer](lambda: dst.copy_(src))
    tbps = 2 * src.numel() / (t * 1e-6) / 1e12
    print(f"copy {tbps:.3f} TB/s ({timer})", flush=True)
    return tbps


TIMERS = {"do_bench": lambda fn: triton.testing.do_bench(fn, warmup=10, rep=60, quantiles=[0.5]) * 1e3,
          "clean": bench_clean, "graph": bench_graph}


def alternate(runs: dict, rounds: int, label: str, timer: str = "do_bench") -> dict[str, list[float]]:
    """Each of `runs` (name -> callable) timed once per round, in turn, `rounds` times: name -> the medians in
    us (TIMERS[timer]), one per round; each round printed."""
    times = {n: [] for n in runs}
    for r in range(rounds):
        for n, fn in runs.items():
            times[n].append(TIMERS[timer](fn))
        print(f"{label} round {r}: " + " ".join(f"{n}={t[-1]:.0f}us" for n, t in times.items()), flush=True)
    return times


def parse_variant(text: str) -> tuple[str, dict]:
    name, sep, kwargs = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=JSON, got {text!r}")
    try:
        value = json.loads(kwargs)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"{name}: not JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{name}: expected a JSON object of decode_attention arguments")
    return name, value


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--cases", default="128:int8,256:int8", help="head_dim:format pairs")
    ap.add_argument("--variant", action="append", type=parse_variant, default=[],
                    help="NAME=JSON keyword arguments of decode_attention; repeatable (default: the int8 modes)")
    ap.add_argument("--page-sizes", default="1,16", help="page sizes of the reference checks")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=32768, help="tokens per request")
    ap.add_argument("--timing", choices=sorted(TIMERS), default="do_bench",
                    help="do_bench (L2 evicted by a write), clean (by a read: bench_clean) or graph (bench_graph)")
    args = ap.parse_args()
    variants = dict(args.variant) or DEFAULT_VARIANTS
    cases = [(int(d), name) for d, _, name in (c.partition(":") for c in args.cases.split(","))]
    device = "cuda"
    gen = torch.Generator(device=device).manual_seed(0)
    res = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "rounds": args.rounds,
           "variants": variants, "checks": {}, "cases": {}}
    res["copy_TBps"] = copy_tbps = copy_bandwidth(device, args.timing)
    for d, name in cases:
        hq, hkv, rot = HEAD_CONFIGS[d]
        fmt = get_format(name, head_dim=d, rotary_dim=rot)
        for ps in (int(x) for x in args.page_sizes.split(",")):
            for vn, var in variants.items():
                e = check(fmt, hq, hkv, d, var, ps, device, gen)
                res["checks"][f"d{d} {name} page{ps} {vn}"] = e
                print(f"check d{d} {name} page {ps} {vn}: {e:.2e}", flush=True)
    bad = {k: e for k, e in res["checks"].items() if not e < 2e-2}
    assert not bad, bad
    batch, ctx = args.batch, args.ctx
    res["batch"], res["ctx"], res["timing"] = batch, ctx, args.timing
    for d, name in cases:
        hq, hkv, rot = HEAD_CONFIGS[d]
        fmt = get_format(name, head_dim=d, rotary_dim=rot)
        tokens, indptr, idx, q, o, kb, vb, sm, base = decode_inputs(batch, ctx, hq, hkv, d, device, gen)
        planes = random_planes(fmt, tokens, hkv, device, gen)
        nbytes = sum(p.numel() * p.element_size() for p in planes.values())
        runs = {"sglang_bf16": lambda: base.run(q, kb, vb, o, indptr, idx, sm)}
        for vn, var in variants.items():
            runs[vn] = (lambda kw: lambda: kernels.decode_attention(fmt, q, planes, o, indptr, idx, sm, **kw))(var)
        times = alternate(runs, args.rounds, f"d{d} {name}", args.timing)
        med = {n: statistics.median(t) for n, t in times.items()}
        summary = {n: {"median_us": m, "min_us": min(times[n]), "max_us": max(times[n]),
                       "speedup_vs_sglang": med["sglang_bf16"] / m} for n, m in med.items()}
        for n in variants:
            summary[n]["TBps"] = nbytes / (med[n] * 1e-6) / 1e12
            summary[n]["copy_share"] = summary[n]["TBps"] / copy_tbps
        res["cases"][f"d{d} {name}"] = {"bytes_read": nbytes, "times_us": times, "summary": summary}
        print(f"d{d} {name} medians: " + " ".join(f"{n}={s['median_us']:.0f}us ({s['speedup_vs_sglang']:.2f}x)"
                                                  for n, s in summary.items()), flush=True)
        del planes, kb, vb
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
