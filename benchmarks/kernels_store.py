"""Store (quantize-and-store) kernel: time per 4096 new tokens and bit-exactness, every format, d 64/128/256.

    PYTHONUNBUFFERED=1 python3 benchmarks/kernels_store.py --out $OUT            # on the H200, no carry needed
    PYTHONUNBUFFERED=1 python3 benchmarks/kernels_store.py --before DIR ...      # DIR/store.py: an older store
                                                                                 # module, timed in the same run
For each head_dim (64: 8 KV heads; 128: 8; 256: 4, rotary 64) and format: bf16 K/V of N tokens (random Gaussian,
K x 3, shuffled slots) through `store_kv`, compared byte for byte with `fmt.quantize` run on the CPU (the
spec), then timed with triton.testing.do_bench (median, L2 flushed before each call). The floor: the bytes
the store must move (K/V in bf16 + the codes and scales out) over the device copy bandwidth, measured here.
Writes store.json to --out and prints one line per measurement.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import torch
import triton

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sglang_ext import kernels  # noqa: E402
from sglang_ext.kvformats import get_format  # noqa: E402

# head_dim -> (KV heads, rotary_dim)
CONFIGS = {64: (8, 64), 128: (8, 128), 256: (4, 64)}
FORMATS = ("int8", "octave_k3v4", "octave_k3v3")


def bench(fn, rep=100):
    if not torch.cuda.is_available():  # CPU under TRITON_INTERPRET=1: checks only, no meaningful time
        fn()
        return float("nan")
    return triton.testing.do_bench(fn, warmup=20, rep=rep, quantiles=[0.5])


def load_before(path: Path):
    """An older store module, imported as a submodule of sglang_ext.kernels (its relative imports resolve)."""
    spec = importlib.util.spec_from_file_location("sglang_ext.kernels._store_before", path / "store.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def measure(store_kv, fmt, hkv, n, device, gen) -> dict:
    k = (torch.randn(n, hkv, fmt.head_dim, device=device, generator=gen) * 3).to(torch.bfloat16)
    v = torch.randn(n, hkv, fmt.head_dim, device=device, generator=gen).to(torch.bfloat16)
    k[0, 0] = 0  # the all-zero-block branch
    slots = n + 64
    planes = fmt.allocate(slots, hkv, device)
    for p in planes.values():
        p.view(torch.uint8).fill_(0xA5)
    loc = torch.randperm(slots, device=device, generator=gen)[:n]
    store_kv(fmt, planes, loc, k, v)
    want = fmt.quantize(k.cpu(), v.cpu())
    mism = {name: int((planes[name][loc].cpu().view(torch.uint8) != want[name].view(torch.uint8)).sum())
            for name in want}
    ms = bench(lambda: store_kv(fmt, planes, loc, k, v))
    moved = n * hkv * (2 * fmt.head_dim * 2 + fmt.bytes_per_token_head)
    return {"mismatched_bytes": mism, "us": ms * 1e3, "bytes_moved": moved}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/store")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--head-dims", default="64,128,256")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--variants", default="", help="extra launches of the current store, e.g. '16x1,8x1': "
                    "block_n x num_warps")
    ap.add_argument("--before", type=Path, help="folder holding an older store.py to time beside the current one")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=device).manual_seed(0)
    nbytes = 2 << 30 if device == "cuda" else 1 << 20
    src = torch.randint(-128, 127, (nbytes,), dtype=torch.int8, device=device)
    dst = torch.empty_like(src)
    copy_tbps = 2 * nbytes / (bench(lambda: dst.copy_(src)) * 1e-3) / 1e12
    del src, dst
    print(f"copy {copy_tbps:.3f} TB/s", flush=True)
    impls = {"now": kernels.store_kv}
    for v in filter(None, args.variants.split(",")):
        bn, nw = (int(x) for x in v.split("x"))
        impls[f"bn{bn}w{nw}"] = lambda *a, bn=bn, nw=nw: kernels.store_kv(*a, block_n=bn, num_warps=nw)
    if args.before:
        impls["before"] = load_before(args.before).store_kv
    rows = []
    for d in (int(x) for x in args.head_dims.split(",")):
        hkv, rot = CONFIGS[d]
        for name in args.formats.split(","):
            fmt = get_format(name, head_dim=d, rotary_dim=rot)
            for label, fn in impls.items():
                r = measure(fn, fmt, hkv, args.tokens, device, gen)
                floor_us = r["bytes_moved"] / (copy_tbps * 1e12) * 1e6
                row = {"impl": label, "format": name, "head_dim": d, "kv_heads": hkv, "tokens": args.tokens,
                       **r, "floor_us": floor_us, "TBps": r["bytes_moved"] / (r["us"] * 1e-6) / 1e12}
                rows.append(row)
                bad = sum(r["mismatched_bytes"].values())
                print(f"store {label:<7} d{d:<3} {name:<12} {r['us']:9.1f} us  floor {floor_us:5.1f} us  "
                      f"{row['TBps']:.3f} TB/s  mismatched bytes {bad}", flush=True)
    meta = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "triton": triton.__version__,
            "torch": torch.__version__, "copy_TBps": copy_tbps}
    (out / "store.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
