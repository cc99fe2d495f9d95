"""Modelled KV capacity and stage time: the sglang_ext planner vs SGLang's default even split.

Produces every table of docs/benchmarks/pipeline-parallel.md. Time: about 6 s (no GPU, no server).

Everything here is the planner's model (sglang_ext/pp/planner.py), evaluated on published model configs
(tests/pp/configs); no GPU is used. Prints Markdown tables for docs/benchmarks/pipeline-parallel.md.

    python benchmarks/pp_capacity.py [--gpus 3-8] [--gpu-mem 24] [--mixed 24,16]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from sglang_ext.pp import ModelShape, PlanOptions, best_candidate, plan_gpus
from sglang_ext.pp.partition import format_partition

CONFIGS = Path(__file__).resolve().parent.parent / "tests" / "pp" / "configs"
MODELS = [
    ("Qwen3-32B", "qwen3_32b", {}),
    ("Qwen3.5-27B-like (64 layers, 16 with KV, 248k vocab)", "qwen3_5_27b_like", {}),
    ("Qwen3.5-like, 48 layers (12 with KV), 248k vocab", "qwen3_5_27b_like", {"num_hidden_layers": 48}),
    ("Qwen3-30B-A3B (48-layer MoE)", "qwen3_30b_a3b", {}),
]


def load(name: str, overrides: dict) -> ModelShape:
    config = json.loads((CONFIGS / f"{name}.json").read_text())
    config.get("text_config", config).update(overrides)
    return ModelShape.from_config(config, name=name)


def fmt(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def table(title: str, shape: ModelShape, gpu_counts: list[int], mem_for) -> list[str]:
    rows = [
        f"### {title}: {mem_for(0)}",
        "",
        "| GPUs | TP x PP | planned split | KV tokens planned | default split | KV tokens default | gain "
        "| bottleneck ms planned / default | plan time s |",
        "|---:|---|---|---:|---|---:|---:|---|---:|",
    ]
    for n in gpu_counts:
        mem = mem_for(n)
        opts = PlanOptions(gpu_mem_gib=mem)
        start = time.perf_counter()
        candidates = plan_gpus(shape, n, opts)
        elapsed = time.perf_counter() - start
        best = best_candidate(candidates)
        if best is None:
            valid = [f"{c.tp}x{c.pp}" for c in candidates if not c.problems]
            rows.append(f"| {n} | {', '.join(valid) or 'none valid'} | does not fit | | | | | | {elapsed:.2f} |")
            continue
        p, d = best.plan, best.default
        gain = "n/a (default does not fit)" if not d.capacity else f"{p.capacity / d.capacity - 1:+.1%}"
        rows.append(
            f"| {n} | {best.tp} x {best.pp} | {format_partition(p.partition)} | {fmt(p.capacity)} | "
            f"{format_partition(d.partition)} | {fmt(d.capacity)} | {gain} | "
            f"{p.bottleneck_ms:.2f} / {d.bottleneck_ms:.2f} | {elapsed:.2f} |"
        )
    return rows + [""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", default="3-8", help="GPU counts, a range a-b")
    parser.add_argument("--gpu-mem", type=float, default=24.0, help="GiB of every GPU (uniform tables)")
    parser.add_argument("--mixed", default="24,16", help="GiB pattern repeated over the GPUs (mixed tables)")
    args = parser.parse_args()
    lo, hi = (int(v) for v in args.gpus.split("-"))
    counts = list(range(lo, hi + 1))
    pattern = [float(v) for v in args.mixed.split(",")]

    def uniform(n):
        return f"{args.gpu_mem:g} GiB per GPU" if n == 0 else (args.gpu_mem,) * n

    def mixed(n):
        if n == 0:
            return "GPU memory " + ", ".join(f"{v:g}" for v in pattern) + ", ... GiB in launch order"
        return tuple(pattern[i % len(pattern)] for i in range(n))

    out = []
    for title, name, overrides in MODELS:
        shape = load(name, overrides)
        out += table(title, shape, counts, uniform)
        out += table(title, shape, counts, mixed)
    print("\n".join(out))


if __name__ == "__main__":
    main()
