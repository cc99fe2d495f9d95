"""Launcher variants of our decode / extend kernels at the issue-3 target shape, in one device call.

    PYTHONUNBUFFERED=1 python3 benchmarks/kernels_variants.py --out $OUT      # on the H200, carrying .whl

For each head_dim (128: 64 q / 8 KV heads; 256: 32 q / 4 KV heads, rotary 64) at batch 8 x 32k: the copy
bandwidth, SGLang's bf16 decode, our bf16 decode, int8 over (conversion path, block_n, num_stages, split cap,
warps), octave over (block_n, num_stages, split cap); extend of 4096 new tokens over a 32k prefix over (rows
per program, block_n, num_warps) unless --skip-extend. Every variant is first checked against the torch
reference (kvformats.reference) at a small ragged shape on stored K/V; timing pools hold random codes and
scales (the kernels' work does not depend on the values). Also, unless --skip-store: store kernel vs the CPU
reference quantizer, bit for bit, and its time for 4096 tokens.
--extend-scratch (round 6): extend at the launcher's default sizes, each compressed format through the direct
kernel and through the prefix scratch (extend.py), plus the scratch's dequantization alone;
--decode-only 128:int8,...: time decode only for these head_dim:format pairs (SGLang's decode is always timed).
Writes variants.json; prints one line per measurement.
"""

from __future__ import annotations

import argparse
import json
import math
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
from kernels_sglang_baseline import SGLangTritonDecode, sglang_extend  # noqa: E402

from sglang_ext import kernels  # noqa: E402
from sglang_ext.kernels import decode as dec  # noqa: E402
from sglang_ext.kernels.dequant import dequantize_rotated  # noqa: E402
from sglang_ext.kvformats import get_format, reference  # noqa: E402

DECODE_VARIANTS = {
    # fill_waves=False: max_kv_splits (16) splits for every request, as in run 3; default: wave_splits' count
    "bf16": [dict(block_n=64, fill_waves=False), dict(block_n=64)],
    # int8_f16: codes to fp16 dot operands in PTX before the shared-memory trip (kernels/int8_ptx.py); False:
    # Triton's own int8 -> bf16 conversion after it (the kernel of run 3)
    # round 5: int8_f16 2 = only V converted before the shared-memory trip (K after it, in the operand layout);
    # maxnreg / num_stages 1 / block_n 64: fewer registers and less shared memory, more programs per SM
    "int8": [dict(block_n=128), dict(block_n=128, int8_f16=2), dict(block_n=128, num_stages=1, maxnreg=128),
             dict(block_n=128, int8_f16=2, num_stages=1, maxnreg=128), dict(block_n=128, num_stages=1, maxnreg=96),
             dict(block_n=64, maxnreg=128), dict(block_n=64, int8_f16=2, maxnreg=128),
             dict(block_n=128, int8_f16=2, num_stages=1)],
    # round 6 (int8 d128): a register cap with the default two-stage prefetch kept, and more splits
    "int8-r6": [dict(block_n=128), dict(block_n=128, maxnreg=128, num_stages=2),
                dict(block_n=128, int8_f16=2, maxnreg=128, num_stages=2), dict(block_n=128, num_stages=2),
                dict(block_n=128, max_kv_splits=32), dict(block_n=128, maxnreg=128, num_stages=3)],
    "octave": [dict(block_n=128, fill_waves=False), dict(block_n=128)],
}
EXTEND_VARIANTS = {
    128: [dict(block_m=32, block_n=64, num_warps=8), dict(block_m=64, block_n=64, num_warps=8),
          dict(block_m=32, block_n=32, num_warps=8), dict(block_m=32, block_n=64, num_warps=4)],
    256: [dict(block_m=8, block_n=64, num_warps=4), dict(block_m=16, block_n=32, num_warps=8),
          dict(block_m=16, block_n=64, num_warps=8, num_stages=1), dict(block_m=32, block_n=32, num_warps=8,
                                                                          num_stages=1)],
}


# round 6: the launcher's default sizes, the prefix through the direct kernel and through the scratch
EXTEND_SCRATCH_VARIANTS = [dict(prefix_scratch=False), dict(prefix_scratch=True)]


def extend_variants_for(name, d, args):
    if args.skip_extend:
        return []
    if args.extend_scratch:
        return [dict()] if name == "bf16" else EXTEND_SCRATCH_VARIANTS
    return EXTEND_VARIANTS[d]


def decode_variants_for(name, d, args):
    if args.decode_only and f"{d}:{name}" not in args.decode_only.split(","):
        return []
    if args.int8_r6 and name == "int8":
        return DECODE_VARIANTS["int8-r6"]
    return DECODE_VARIANTS["octave" if name.startswith("octave") else name]


def bench(fn, rep=60):
    return triton.testing.do_bench(fn, warmup=10, rep=rep, quantiles=[0.5])


def small_check(fmt, cfg, device, gen, variants, extend_variants):
    """Every variant vs the torch reference on stored K/V (ragged lengths, shuffled slots); returns errors."""
    hq, hkv, d = cfg
    lens = [1, 77, 1000, 2100]
    n = sum(lens)
    slots = torch.randperm(n + 64, device=device)[:n]
    planes = fmt.allocate(n + 64, hkv, device)
    k = torch.randn(n, hkv, d, device=device, generator=gen)
    k[..., 1] *= 8
    v = torch.randn(n, hkv, d, device=device, generator=gen)
    kernels.store_kv(fmt, planes, slots, k.to(torch.bfloat16), v.to(torch.bfloat16))
    indptr = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=device)
    q = torch.randn(len(lens), hq, d, device=device, generator=gen).to(torch.bfloat16)
    ref = reference.decode_attention(fmt, q, planes, indptr, slots, d ** -0.5)
    errs = {}
    for var in variants:
        o = torch.full(q.shape, float("nan"), dtype=torch.bfloat16, device=device)
        try:
            kernels.decode_attention(fmt, q, planes, o, indptr, slots, d ** -0.5, **var)
        except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory: recorded, that variant not timed
            print(f"decode d{d} {fmt.name} {var}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            errs[json.dumps(var)] = float("nan")
            continue
        errs[json.dumps(var)] = rel_err(o.float(), ref) if not o.isnan().any() else float("nan")
    ext_new = 300
    qo = torch.tensor([0, 0, ext_new], dtype=torch.int32, device=device)
    kvp = torch.tensor([0, 500, 2600], dtype=torch.int32, device=device)
    qe = torch.randn(ext_new, hq, d, device=device, generator=gen).to(torch.bfloat16)
    ke = torch.randn(ext_new, hkv, d, device=device, generator=gen).to(torch.bfloat16)
    ve = torch.randn(ext_new, hkv, d, device=device, generator=gen).to(torch.bfloat16)
    # request 0: no new tokens; request 1: 300 new tokens over 2100 prefix slots
    eref = reference.extend_attention(fmt, qe, ke, ve, planes, qo, kvp, slots[:2600], d ** -0.5)
    if dict(prefix_scratch=True) in extend_variants:  # also the scratch taken two KV heads at a time
        extend_variants = extend_variants + [dict(prefix_scratch=True, scratch_bytes=2600 * d * 2 * 2 * 2)]
    for var in extend_variants:
        o = torch.full(qe.shape, float("nan"), dtype=torch.bfloat16, device=device)
        try:
            kernels.extend_attention(fmt, qe, ke, ve, o, planes, qo, kvp, slots[:2600], ext_new, d ** -0.5, **var)
        except triton.runtime.errors.OutOfResources:
            continue
        errs["extend " + json.dumps(var)] = rel_err(o.float(), eref) if not o.isnan().any() else float("nan")
    return errs


def store_exactness(fmt, hkv, device, gen, n=4096):
    k = (torch.randn(n, hkv, fmt.head_dim, device=device, generator=gen) * 3).to(torch.bfloat16)
    v = torch.randn(n, hkv, fmt.head_dim, device=device, generator=gen).to(torch.bfloat16)
    planes = fmt.allocate(n, hkv, device)
    loc = torch.arange(n, device=device)
    kernels.store_kv(fmt, planes, loc, k, v)
    want = fmt.quantize(k.cpu(), v.cpu())
    mism = {name: int((planes[name].cpu().view(torch.uint8) != want[name].view(torch.uint8)).sum()) for name in want}
    ms = bench(lambda: kernels.store_kv(fmt, planes, loc, k, v), rep=100)
    return {"format": fmt.name, "head_dim": fmt.head_dim, "tokens": n, "mismatched_bytes_vs_cpu_reference": mism,
            "store_us": ms * 1e3}


def decode_inputs(batch, ctx, hq, hkv, d, device, gen):
    """The decode timing inputs at batch x ctx (every request ctx tokens, slots in order): tokens, kv_indptr,
    kv_indices, bf16 q and o [batch, hq, d], bf16 K/V pools [tokens, hkv, d], sm_scale, and SGLang's bf16
    decode kernel planned for them."""
    tokens = batch * ctx
    indptr = torch.arange(batch + 1, dtype=torch.int32, device=device) * ctx
    idx = torch.arange(tokens, dtype=torch.int64, device=device)
    q = torch.randn(batch, hq, d, device=device, generator=gen).to(torch.bfloat16)
    o = torch.empty_like(q)
    kb = torch.randn(tokens, hkv, d, device=device, generator=gen).to(torch.bfloat16)
    vb = torch.randn(tokens, hkv, d, device=device, generator=gen).to(torch.bfloat16)
    base = SGLangTritonDecode()
    base.plan(torch.full((batch,), ctx, dtype=torch.int32, device=device), hq, hkv, d)
    return tokens, indptr, idx, q, o, kb, vb, 1.0 / math.sqrt(d), base


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/variants")
    ap.add_argument("--head-dims", default="128,256")
    ap.add_argument("--skip-extend", action="store_true")
    ap.add_argument("--skip-store", action="store_true")
    ap.add_argument("--formats", default="bf16,int8,octave_k3v4,octave_k3v3", help="our formats to time")
    ap.add_argument("--extend-scratch", action="store_true", help="extend: direct vs prefix scratch (round 6)")
    ap.add_argument("--decode-only", default="", help="head_dim:format pairs whose decode is timed (default all)")
    ap.add_argument("--int8-r6", action="store_true", help="int8 decode: round 6's variant set")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = "cuda"
    gen = torch.Generator(device=device).manual_seed(0)
    res = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "torch": torch.__version__,
           "decode": [], "extend": [], "checks": [], "store": []}
    nbytes = 4 << 30
    src = torch.randint(-128, 127, (nbytes,), dtype=torch.int8, device=device)
    dst = torch.empty_like(src)
    res["copy_TBps"] = 2 * nbytes / (bench(lambda: dst.copy_(src)) * 1e-3) / 1e12
    del src, dst
    print(f"copy {res['copy_TBps']:.3f} TB/s", flush=True)
    batch, ctx = 8, 32768
    for d in (int(x) for x in args.head_dims.split(",")):
        hq, hkv, rot = HEAD_CONFIGS[d]
        cfg = (hq, hkv, d)
        fmts = {name: get_format(name, head_dim=d, rotary_dim=rot) for name in args.formats.split(",")}
        for f in fmts.values():
            if f.name != "bf16" and not args.skip_store:
                res["store"].append(store_exactness(f, hkv, device, gen))
                print("store", json.dumps(res["store"][-1]), flush=True)
        for name, f in fmts.items():
            vars_ = decode_variants_for(name, d, args)
            ext_vars = extend_variants_for(name, d, args)
            errs = small_check(f, cfg, device, gen, vars_, ext_vars)
            res["checks"].append({"format": name, "head_dim": d, "rel_err_vs_reference": errs})
            print(f"check d{d} {name}: " + " ".join(f"{k}={v:.1e}" for k, v in errs.items()), flush=True)
        tokens, indptr, idx, q, o, kb, vb, sm, base = decode_inputs(batch, ctx, hq, hkv, d, device, gen)
        t_sgl = bench(lambda: base.run(q, kb, vb, o, indptr, idx, sm))
        res["decode"].append({"kernel": "bf16-sglang", "head_dim": d, "us": t_sgl * 1e3,
                              "TBps": tokens * hkv * 4 * d / (t_sgl * 1e-3) / 1e12})
        print(f"decode d{d} sglang-bf16 {t_sgl * 1e3:.0f} us", flush=True)
        for name, f in fmts.items():
            planes = {"k": kb, "v": vb} if name == "bf16" else random_planes(f, tokens, hkv, device, gen)
            for var in decode_variants_for(name, d, args):
                check = next(c for c in res["checks"] if c["format"] == name and c["head_dim"] == d)
                if not check["rel_err_vs_reference"][json.dumps(var)] < 2e-2:
                    print(f"decode d{d} {name} {var}: not timed (failed or erred in the check)", flush=True)
                    continue
                t = bench(lambda: kernels.decode_attention(f, q, planes, o, indptr, idx, sm, **var))
                row = {"kernel": name, "head_dim": d, **var, "us": t * 1e3,
                       "TBps": tokens * hkv * f.bytes_per_token_head / (t * 1e-3) / 1e12, "speedup": t_sgl / t}
                res["decode"].append(row)
                print(f"decode d{d} {name} {var}: {t * 1e3:.0f} us {row['TBps']:.2f} TB/s {row['speedup']:.2f}x",
                      flush=True)
            del planes
        if not args.skip_extend:
            prefix, new = 32768, 4096
            qe = torch.randn(new, hq, d, device=device, generator=gen).to(torch.bfloat16)
            ke = torch.randn(new, hkv, d, device=device, generator=gen).to(torch.bfloat16)
            ve = torch.randn(new, hkv, d, device=device, generator=gen).to(torch.bfloat16)
            oe = torch.empty_like(qe)
            qo = torch.tensor([0, new], dtype=torch.int32, device=device)
            kvp = torch.tensor([0, prefix], dtype=torch.int32, device=device)
            t_sgl = bench(lambda: sglang_extend(qe, ke, ve, oe, kb, vb, qo, kvp, idx[:prefix], new, sm), rep=200)
            res["extend"].append({"kernel": "bf16-sglang", "head_dim": d, "ms": t_sgl})
            print(f"extend d{d} sglang-bf16 {t_sgl:.2f} ms", flush=True)
            for name, f in fmts.items():
                planes = {"k": kb[:prefix], "v": vb[:prefix]} if name == "bf16" else \
                    random_planes(f, prefix, hkv, device, gen)
                if args.extend_scratch and name != "bf16":
                    k_s = torch.empty(prefix, hkv, d, dtype=torch.bfloat16, device=device)
                    v_s = torch.empty_like(k_s)
                    lim = kvp[1:]
                    t = bench(lambda: dequantize_rotated(f, planes, idx[:prefix], k_s, v_s, limit=lim), rep=100)
                    moved = prefix * hkv * (f.bytes_per_token_head + 4 * d)  # codes + scales in, bf16 K/V out
                    res["extend"].append({"kernel": name, "head_dim": d, "dequant_only": True, "ms": t,
                                          "TBps": moved / (t * 1e-3) / 1e12})
                    print(f"extend d{d} {name} scratch dequant alone: {t * 1e3:.1f} us "
                          f"{moved / (t * 1e-3) / 1e12:.2f} TB/s", flush=True)
                    del k_s, v_s
                if args.extend_scratch and name == "bf16":  # the same kernel with float32 q / k / v / o
                    q32, k32, v32, o32 = qe.float(), ke.float(), ve.float(), oe.float()
                    t = bench(lambda: kernels.extend_attention(f, q32, k32, v32, o32, planes, qo, kvp, idx[:prefix],
                                                               new, sm), rep=200)
                    res["extend"].append({"kernel": name, "head_dim": d, "float32_io": True, "ms": t,
                                          "ratio": t / t_sgl})
                    print(f"extend d{d} bf16 float32 q/k/v/o: {t:.2f} ms {t / t_sgl:.2f}x sglang", flush=True)
                    del q32, k32, v32, o32
                for var in extend_variants_for(name, d, args):
                    try:
                        t = bench(lambda: kernels.extend_attention(f, qe, ke, ve, oe, planes, qo, kvp, idx[:prefix],
                                                                   new, sm, **var), rep=200)
                    except triton.runtime.errors.OutOfResources as exc:
                        print(f"extend d{d} {name} {var}: {exc}", flush=True)
                        continue
                    res["extend"].append({"kernel": name, "head_dim": d, **var, "ms": t, "ratio": t / t_sgl})
                    print(f"extend d{d} {name} {var}: {t:.2f} ms {t / t_sgl:.2f}x sglang", flush=True)
        res.setdefault("resident_programs", []).append({"head_dim": d, "by_variant": [
            {"key": repr(k), "programs_per_sm": v} for k, v in dec._RESIDENT.items()]})
        print(f"resident programs per SM d{d}: " + "; ".join(
            f"{dict(k[-1]).get('FMT')}/{dict(k[-1]).get('BLOCK_N')}/I8F16={dict(k[-1]).get('I8_F16')}/"
            f"stages={dict(k[-1]).get('num_stages')}/maxnreg={dict(k[-1]).get('maxnreg')}: {v}"
            for k, v in dec._RESIDENT.items()), flush=True)
        dec._RESIDENT.clear()
        del kb, vb
        torch.cuda.empty_cache()
        (out / "variants.json").write_text(json.dumps(res, indent=1))
    (out / "variants.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
