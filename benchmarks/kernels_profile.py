"""Launch each decode kernel (and the extend kernels) once at batch 8 x 32k, for Nsight Compute to read.

    ncu --clock-control none -k regex:'stage1|^_fwd_kernel$|_extend_kernel|_store' \
        --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
        python3 benchmarks/kernels_profile.py --head-dim 128 --extend --store

Pools hold random bytes / random scales (any code is a valid code), not stored K/V: the profile is about
where the time goes; kernels_bench.py measures times and checks results. Every kernel is launched once
(compilation happens on the host before the launch, so the profiled launch is a normal one).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from kernels_bench import HEAD_CONFIGS  # noqa: E402
from kernels_sglang_baseline import SGLangTritonDecode, sglang_extend  # noqa: E402

from sglang_ext import kernels  # noqa: E402
from sglang_ext.kvformats import get_format  # noqa: E402


def random_planes(fmt, num_slots, hkv, device, gen):
    planes = fmt.allocate(num_slots, hkv, device)
    for name, p in planes.items():
        if p.dtype in (torch.uint8, torch.int8):
            lo, hi = (0, 256) if p.dtype == torch.uint8 else (-127, 128)
            p.copy_(torch.randint(lo, hi, p.shape, generator=gen, device=device, dtype=torch.int32))
        else:  # scales: positive, O(1 / sqrt(d)) like real ones; bf16 K/V: Gaussian
            src = torch.rand if "scale" in name else torch.randn
            p.copy_(src(p.shape, generator=gen, device=device) * (0.05 if "scale" in name else 1.0))
    return planes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=32768)
    ap.add_argument("--extend", action="store_true", help="also the extend kernels (4k new over 32k prefix)")
    ap.add_argument("--store", action="store_true", help="also our store kernels (4096 new tokens)")
    ap.add_argument("--extra", action="append", default=[], metavar="FORMAT=JSON",
                    help="one more decode launch of FORMAT with these decode_attention arguments, e.g. "
                         "octave_k3v4='{\"stage1\": \"mma\", \"mma_heads_n\": true}'; repeatable")
    args = ap.parse_args()
    device = "cuda"
    hq, hkv, rot = HEAD_CONFIGS[args.head_dim]
    d = args.head_dim
    batch, ctx = args.batch, args.ctx
    gen = torch.Generator(device=device).manual_seed(3)
    tokens = batch * ctx
    sm_scale = 1.0 / math.sqrt(d)
    indptr = torch.arange(batch + 1, dtype=torch.int32, device=device) * ctx
    indices = torch.arange(tokens, dtype=torch.int64, device=device)
    q = torch.randn(batch, hq, d, generator=gen, device=device).to(torch.bfloat16)
    o = torch.empty_like(q)
    kb = torch.randn(tokens, hkv, d, generator=gen, device=device).to(torch.bfloat16)
    vb = torch.randn(tokens, hkv, d, generator=gen, device=device).to(torch.bfloat16)
    base = SGLangTritonDecode()
    base.plan(torch.full((batch,), ctx, dtype=torch.int32, device=device), hq, hkv, d)
    fmts = [get_format(n, head_dim=d, rotary_dim=rot) for n in ("bf16", "int8", "octave_k3v4", "octave_k3v3")]
    planes = {f.name: ({"k": kb, "v": vb} if f.name == "bf16" else random_planes(f, tokens, hkv, device, gen))
              for f in fmts}
    base.run(q, kb, vb, o, indptr, indices, sm_scale)
    for f in fmts:
        kernels.decode_attention(f, q, planes[f.name], o, indptr, indices, sm_scale)
    for extra in args.extra:
        name, _, kwargs = extra.partition("=")
        f = next(f for f in fmts if f.name == name)
        kernels.decode_attention(f, q, planes[f.name], o, indptr, indices, sm_scale, **json.loads(kwargs))
    torch.cuda.synchronize()
    print(f"decode d{d} B{batch} ctx{ctx}: launched sgl-bf16, " + ", ".join(f.name for f in fmts)
          + "".join(f", {e}" for e in args.extra), flush=True)
    if args.extend:
        prefix, new = 32768, 4096
        qe = torch.randn(new, hq, d, generator=gen, device=device).to(torch.bfloat16)
        ke = torch.randn(new, hkv, d, generator=gen, device=device).to(torch.bfloat16)
        ve = torch.randn(new, hkv, d, generator=gen, device=device).to(torch.bfloat16)
        oe = torch.empty_like(qe)
        qo = torch.tensor([0, new], dtype=torch.int32, device=device)
        kvp = torch.tensor([0, prefix], dtype=torch.int32, device=device)
        sglang_extend(qe, ke, ve, oe, kb, vb, qo, kvp, indices[:prefix], new, sm_scale)
        for f in fmts:
            kernels.extend_attention(f, qe, ke, ve, oe, planes[f.name], qo, kvp, indices[:prefix], new, sm_scale)
        torch.cuda.synchronize()
        print(f"extend d{d}: {new} over {prefix} launched", flush=True)
    if args.store:
        new = 4096
        ke = torch.randn(new, hkv, d, generator=gen, device=device).to(torch.bfloat16)
        ve = torch.randn(new, hkv, d, generator=gen, device=device).to(torch.bfloat16)
        loc = torch.arange(new, dtype=torch.int64, device=device)
        for f in fmts[1:]:
            kernels.store_kv(f, planes[f.name], loc, ke, ve)
        torch.cuda.synchronize()
        print(f"store d{d}: {new} tokens launched", flush=True)


if __name__ == "__main__":
    main()
