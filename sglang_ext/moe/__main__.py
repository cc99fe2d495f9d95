"""`python -m sglang_ext.moe plan --model-path M --gpus N --gpu-mem G [--tp T] [--kv-cache-dtype F]
[--context-tokens C] [--max-running R] [--h2d-gbps B] [--gpu-bw-gbs W] [--hit-rate H ...]`."""

from __future__ import annotations

import argparse
import sys

from sglang_ext.moe.plan import PlanError, plan_paged_experts
from sglang_ext.pp.loading import load_config, load_shape

GIB = float(1 << 30)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sglang_ext.moe", description="Paged MoE experts planner.")
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="resident experts per layer next to the KV pool, and predicted decode speed")
    plan.add_argument("--model-path", required=True, help="model folder with config.json, or a config.json file")
    plan.add_argument("--gpus", type=int, required=True, help="number of GPUs (tp x pp)")
    plan.add_argument("--gpu-mem", type=float, required=True, help="GiB per GPU")
    plan.add_argument("--tp", type=int, default=None, help="tensor-parallel size (default: 2 when --gpus is even)")
    plan.add_argument("--kv-cache-dtype", default="auto", help="SGLang --kv-cache-dtype value or a sglang_ext format")
    plan.add_argument("--context-tokens", type=int, default=32768, help="KV pool size in tokens (default 32768)")
    plan.add_argument("--max-running", type=int, default=8, help="requests whose recurrent state is kept (default 8)")
    plan.add_argument("--h2d-gbps", type=float, default=25.0,
                      help="host-to-device GB/s per GPU (default 25: PCIe 4.0 x16 as measured in practice)")
    plan.add_argument("--gpu-bw-gbs", type=float, default=936.0,
                      help="GPU memory GB/s (default 936: RTX 3090; RX 7900 XTX: 960)")
    plan.add_argument("--hit-rate", type=float, nargs="+", default=[0.5, 0.7, 0.8, 0.9, 0.95, 1.0],
                      help="expert hit rates to predict decode speed at (measure one with benchmarks/paged_experts.py)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.gpus < 1 or args.gpu_mem <= 0:
        print("--gpus must be >= 1 and --gpu-mem positive", file=sys.stderr)
        return 2
    tp = args.tp or (2 if args.gpus % 2 == 0 else 1)
    config, _ = load_config(args.model_path)
    shape = load_shape(args.model_path)
    try:
        plan = plan_paged_experts(config, shape, gpus=args.gpus, gpu_mem_gib=args.gpu_mem, tp=tp,
                                  kv_cache_dtype=args.kv_cache_dtype, context_tokens=args.context_tokens,
                                  max_running=args.max_running)
    except PlanError as exc:
        print(f"paged experts plan: {exc}", file=sys.stderr)
        return 1
    whole = sum(shape.layer_weight_bytes) + shape.embed_bytes + shape.lm_head_bytes
    print(f"model {shape.name}: {shape.num_experts} experts, top-{shape.experts_per_token}, "
          f"{sum(plan.stage_moe_layers)} MoE layers; expert {plan.expert_bytes / 2**20:.2f} MiB "
          f"({plan.expert_bytes / tp / 2**20:.2f} MiB per tp rank); weights {whole / GIB:.1f} GiB in all")
    print(f"{args.gpus} x {args.gpu_mem:g} GiB: tp {plan.tp}, pp {plan.pp}, layers per stage "
          f"{','.join(map(str, plan.partition))}; KV {args.context_tokens} tokens ({args.kv_cache_dtype}) "
          f"{plan.kv_gib:.2f} GiB + recurrent state {plan.state_gib:.2f} GiB per GPU")
    print("| stage | MoE layers | GiB per GPU for experts | experts per layer that fit |")
    print("| --- | --- | --- | --- |")
    for s, (free, n) in enumerate(zip(plan.stage_free_gib, plan.stage_moe_layers)):
        fit = int(free * GIB // (n * plan.expert_bytes / tp)) if n else 0
        print(f"| {s} | {n} | {free:.2f} | {min(fit, shape.num_experts)} |")
    print(f"--enable-paged-experts --paged-experts-num-resident {plan.num_resident}  "
          f"(K/E = {plan.num_resident / shape.num_experts:.0%}); host store per rank {plan.host_store_gib:.1f} GiB")
    print(f"\npredicted decode tokens/s at batch 1 (GPU {args.gpu_bw_gbs:g} GB/s, host link {args.h2d_gbps:g} GB/s):")
    print("| expert hit rate | tokens/s |")
    print("| --- | --- |")
    for h in args.hit_rate:
        print(f"| {h:.2f} | {plan.decode_tokens_per_s(shape, h, args.gpu_bw_gbs, args.h2d_gbps):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
