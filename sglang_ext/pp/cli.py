"""`python -m sglang_ext.pp plan --model-path M --gpus N [--gpu-mem GiB,...] [--kv-cache-dtype F] [--tp T]`."""

from __future__ import annotations

import argparse
import sys

from .devices import visible_gpu_memory_gib
from .loading import load_shape
from .planner import PlanOptions
from .report import plan_gpus, render


def _gpu_mem(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--gpu-mem {text!r} is not a comma-separated list of GiB values")
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"--gpu-mem {text!r}: every GiB value must be positive")
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sglang_ext.pp", description="Pipeline-parallel partition planner.")
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="valid (TP, PP) shapes for N GPUs and the best layer partition")
    plan.add_argument("--model-path", required=True, help="model folder with config.json, or a config.json file")
    plan.add_argument("--gpus", type=int, required=True, help="number of GPUs")
    plan.add_argument(
        "--gpu-mem",
        type=_gpu_mem,
        default=None,
        help="GiB per GPU, one value for all or one per GPU in launch order (default: read through NVML)",
    )
    plan.add_argument("--kv-cache-dtype", default="auto", help="SGLang --kv-cache-dtype value or a sglang_ext format")
    plan.add_argument("--tp", type=int, default=None, help="only consider this tensor-parallel size")
    plan.add_argument(
        "--mem-fraction-static", type=float, default=None, help="as SGLang's flag (default: SGLang's rule)"
    )
    plan.add_argument("--decode-batch", type=int, default=32, help="sequences per decode step for the time model")
    plan.add_argument("--context-tokens", type=int, default=4096, help="context length for the time model")
    plan.add_argument("--paged-experts-num-resident", type=int, default=None,
                      help="as SGLang's flag with --enable-paged-experts: count K routed experts per MoE layer")
    plan.add_argument("--ple-offloaded", action="store_true",
                      help="qwen4_exp: the n-gram PLE tables stay off the GPU (--ple-offload-embedding or "
                      "--ple-offload-backend ssd); their bytes are not counted")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.gpus < 1:
        print(f"--gpus must be >= 1, got {args.gpus}", file=sys.stderr)
        return 2
    mem = args.gpu_mem if args.gpu_mem is not None else visible_gpu_memory_gib()
    if mem is not None and len(mem) not in (1, args.gpus):
        if args.gpu_mem is None:  # more or fewer GPUs visible than planned for: assume the first one's size
            mem = mem[:1]
        else:
            print(f"--gpu-mem has {len(mem)} values; give 1 or --gpus={args.gpus}", file=sys.stderr)
            return 2
    if mem is not None and len(mem) == 1:
        mem = mem * args.gpus
    opts = PlanOptions(
        gpu_mem_gib=mem,
        kv_cache_dtype=args.kv_cache_dtype,
        mem_fraction_static=args.mem_fraction_static,
        decode_batch=args.decode_batch,
        context_tokens=args.context_tokens,
        paged_experts_num_resident=args.paged_experts_num_resident,
    )
    shape = load_shape(args.model_path, ple_offloaded=args.ple_offloaded)
    print(render(shape, args.gpus, opts, plan_gpus(shape, args.gpus, opts, tp=args.tp)))
    return 0
