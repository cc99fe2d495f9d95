"""Decode time over the same K/V in two pool layouts, in alternation, at batch 8 x 32k (issue 3, round 11):

    PYTHONUNBUFFERED=1 python3 benchmarks/kernels_layout.py --out $OUT/layout.json [--rounds 5] \
        [--cases 128:int8,256:int8,128:octave_k3v4,128:bf16]                  # on the H200

slot-major: the planes as the pool allocates them, [slots, kv_heads, ...]: one token's KV heads are adjacent, so
a program (one request, one KV head, one split) reads rows of one head strided by the whole token's bytes.
head-major: the same planes allocated [kv_heads, slots, ...] and viewed as [slots, kv_heads, ...] (the kernels
take any strides), so a program streams contiguous memory. The question: does the slot-major gather, not the
instruction count, keep int8 decode at about 62 % of the copy bandwidth? Both layouts are checked against each
other (same values, same output) before timing.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from pathlib import Path

import torch
import triton

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from kernels_alternate import alternate, copy_bandwidth
from kernels_bench import HEAD_CONFIGS
from kernels_profile import random_planes
from kernels_variants import decode_inputs

from sglang_ext import kernels
from sglang_ext.kvformats import get_format


def head_major(planes: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in planes.items():
        hm = torch.empty((p.shape[1], p.shape[0], *p.shape[2:]), dtype=p.dtype, device=p.device)
        hm.copy_(p.transpose(0, 1))
        out[name] = hm.transpose(0, 1)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cases", default="128:int8,256:int8,128:octave_k3v4,128:bf16")
    ap.add_argument("--variant", default="{}", help="JSON keyword arguments of decode_attention for both layouts")
    args = ap.parse_args()
    variant = json.loads(args.variant)
    device = "cuda"
    gen = torch.Generator(device=device).manual_seed(0)
    res = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "rounds": args.rounds,
           "variant": variant, "cases": {}}
    res["copy_TBps"] = copy_tbps = copy_bandwidth(device)
    batch, ctx = 8, 32768
    for case in args.cases.split(","):
        d, _, name = case.partition(":")
        d = int(d)
        hq, hkv, rot = HEAD_CONFIGS[d]
        fmt = get_format(name, head_dim=d, rotary_dim=rot)
        tokens, indptr, idx, q, o, kb, vb, sm, base = decode_inputs(batch, ctx, hq, hkv, d, device, gen)
        if name == "bf16":
            planes = {"k": kb, "v": vb}
        else:
            planes = random_planes(fmt, tokens, hkv, device, gen)
        layouts = {"slot_major": planes, "head_major": head_major(planes)}
        nbytes = sum(p.numel() * p.element_size() for p in planes.values())
        outs = {}
        for ln, pl in layouts.items():
            out = torch.full_like(o, float("nan"))
            kernels.decode_attention(fmt, q, pl, out, indptr, idx, sm, **variant)
            outs[ln] = out.float()
        diff = ((outs["head_major"] - outs["slot_major"]).norm() / outs["slot_major"].norm()).item()
        assert diff < 1e-6 and not outs["slot_major"].isnan().any(), diff
        runs = {"sglang_bf16": functools.partial(base.run, q, kb, vb, o, indptr, idx, sm)}
        for ln, pl in layouts.items():
            runs[ln] = functools.partial(kernels.decode_attention, fmt, q, pl, o, indptr, idx, sm, **variant)
        times = alternate(runs, args.rounds, f"d{d} {name}")
        med = {n: statistics.median(v) for n, v in times.items()}
        share = {n: nbytes / (med[n] * 1e-6) / 1e12 / copy_tbps for n in layouts}
        res["cases"][case] = {"bytes": nbytes, "times_us": times, "median_us": med, "copy_share": share}
        print(f"d{d} {name} medians: " + " ".join(
            f"{n}={m:.0f}us" + (f" ({share[n]:.0%} of copy)" if n in share else "") for n, m in med.items()), flush=True)
    Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
