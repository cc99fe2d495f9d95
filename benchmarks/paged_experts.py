"""Paged MoE experts: residency policies on routing traces, and decode speed against K on the CPU platform.

    python benchmarks/paged_experts.py policies [--trace FILE ...] [--synthetic] [--steps 400]
    python benchmarks/paged_experts.py serve [--k 2 4 8] [--tokens 32]

`policies` replays traces through LRU (SGLang's), frequency-with-decay and next-layer prefetch
(`sglang_ext/moe/residency.py`) at several K and prints hit rates, demand misses and prefetch loads per
token-layer. Traces: server trace files (`SGLANG_EXT_PAGED_EXPERTS_TRACE`, e.g. from `serve`), and with
`--synthetic` SYNTHETIC decode traces of a 256-expert top-8 48-layer model (Zipf popularity per layer, temporal
repeat and cross-layer follow probabilities: `sglang_ext.moe.traces.synthetic_trace`). Seconds to a few minutes.

`serve` starts the tiny qwen3_5_moe (8 experts, top-2, 4 MoE layers) on the CPU platform without paging and with
paged experts at each K, sends the same greedy requests, and prints decode tokens/s, whether the tokens equal the
unpaged server's, and the hit rate from the server's own trace. One server at a time, ~1-2 min each.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from sglang_ext.moe.residency import replay
from sglang_ext.moe.traces import read_server_trace, synthetic_trace

LOOSE = {"threshold": 0.25, "min_seen": 4}
STRICT = {"threshold": 0.5, "min_seen": 16}
POLICIES = (  # (label, policy, prefetch width as a multiple of top-k, policy kwargs, prefetch kwargs)
    ("LRU (SGLang)", "lru", 0, {}, None),
    ("freq-decay 0.9", "freq-decay", 0, {"decay": 0.9}, None),
    ("freq-decay 0.99", "freq-decay", 0, {"decay": 0.99}, None),
    ("LRU + prefetch P>=0.25", "lru", 1, {}, LOOSE),
    ("LRU + prefetch P>=0.5", "lru", 1, {}, STRICT),
)


def compare(name: str, steps, num_experts: int, top_k: int, ks, load_ms: float, compute_ms: float) -> None:
    """Per K and policy: hit rate, loads, and the modelled time of a layer-step: prefetch copies overlap the
    previous layer's compute but share the host link, demand copies stall:
    t = max(compute, prefetch loads x load time) + demand loads x load time."""
    layer_steps = sum(len(s) for s in steps)
    print(f"\n### {name}: {len(steps)} steps x {len(steps[0])} layers, E={num_experts}, top-{top_k}\n")
    print("| K | policy | hit rate | demand loads / layer-step | prefetch loads / layer-step | prefetched and used "
          f"| modelled ms / layer-step (load {load_ms} ms, compute {compute_ms} ms) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for k in ks:
        for label, policy, width, kwargs, ahead in POLICIES:
            c = replay(steps, policy, k, num_experts, prefetch_width=width * top_k, prefetch=ahead, **kwargs)
            used = f"{c.prefetch_used / c.prefetches:.0%}" if c.prefetches else "-"
            demand, early = c.misses / layer_steps, c.prefetches / layer_steps
            t = max(compute_ms, early * load_ms) + demand * load_ms
            print(f"| {k} | {label} | {c.hit_rate:.3f} | {demand:.2f} | {early:.2f} | {used} | {t:.3f} |")


def cmd_policies(args) -> None:
    for path in args.trace:
        steps, stores = read_server_trace(path)
        store = next(iter(stores.values()))
        experts = store["experts"]
        top_k = args.top_k
        ks = [k for k in (top_k, experts // 2, experts - top_k) if top_k <= k < experts]
        compare(f"server trace {Path(path).name}", steps, experts, top_k, sorted(set(ks)), args.load_ms,
                args.compute_ms)
    if args.synthetic:
        for label, kw in (("synthetic, Zipf 1.0, repeat 0.3, follow 0.3, batch 1",
                           {"zipf_s": 1.0, "p_repeat": 0.3, "p_follow": 0.3, "batch": 1}),
                          ("synthetic, Zipf 0.6, repeat 0.1, follow 0.5, batch 1",
                           {"zipf_s": 0.6, "p_repeat": 0.1, "p_follow": 0.5, "batch": 1}),
                          ("synthetic, Zipf 1.0, repeat 0.3, follow 0.3, batch 8",
                           {"zipf_s": 1.0, "p_repeat": 0.3, "p_follow": 0.3, "batch": 8})):
            steps = synthetic_trace(num_layers=args.layers, num_experts=256, top_k=8, steps=args.steps, seed=0, **kw)
            compare(label, steps, 256, 8, (32, 64, 128), args.load_ms, args.compute_ms)


def _serve_once(model: str, extra: list[str], prompts, tokens: int, trace: str | None):
    import requests
    from server import ServerProcess

    env = {"SGLANG_MAMBA_CONV_DTYPE": "float32"}
    if trace:
        env["SGLANG_EXT_PAGED_EXPERTS_TRACE"] = trace
    proc = ServerProcess(model, ["--dtype", "float32", "--max-total-tokens", "2000", "--mamba-radix-cache-strategy",
                                 "no_buffer", "--disable-overlap-schedule", "--max-mamba-cache-size", "16", *extra],
                         env=env, name="paged-bench").start()
    try:
        def ask(ids):
            body = {"input_ids": ids, "sampling_params": {"max_new_tokens": tokens, "temperature": 0.0,
                                                          "ignore_eos": True}}
            r = requests.post(f"{proc.url}/generate", json=body, timeout=900)
            r.raise_for_status()
            return r.json()

        ask(prompts[0][:4])  # warm-up
        if trace:
            Path(trace).write_text("")  # count the measured requests only
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            replies = list(pool.map(ask, prompts))
        wall = time.perf_counter() - t0
    finally:
        proc.stop()
    decode_tokens = sum(len(r["output_ids"]) for r in replies)
    return [r["output_ids"] for r in replies], decode_tokens / wall


def cmd_serve(args) -> None:
    import torch

    from sglang_ext.models.tiny import prepare_tiny
    from sglang_ext.moe.traces import server_trace_loads

    model = str(prepare_tiny("qwen3_5_moe"))
    gen = torch.Generator().manual_seed(0)
    prompts = [[1] + torch.randint(3, 49000, (n - 1,), generator=gen).tolist() for n in (12, 40)]
    load_before = os.getloadavg()
    base, base_tps = _serve_once(model, [], prompts, args.tokens, None)
    print("| K (of 8) | tokens/s (2 requests, batched) | same tokens as unpaged | hit rate (server trace) "
          "| load average (1 min) after |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| unpaged | {base_tps:.1f} | - | - | {os.getloadavg()[0]:.1f} |")
    for k in args.k:
        trace = tempfile.mktemp(suffix=".jsonl")
        out, tps = _serve_once(model, ["--enable-paged-experts", "--paged-experts-num-resident", str(k)], prompts,
                               args.tokens, trace)
        recs = server_trace_loads(trace)
        accesses = sum(len(r["experts"]) for r in recs)
        misses = sum(len(r["loads"]) for r in recs)
        print(f"| {k} | {tps:.1f} | {out == base} | {1 - misses / accesses:.3f} | {os.getloadavg()[0]:.1f} |")
    print(f"load average (1, 5, 15 min) before: {' '.join(f'{v:.1f}' for v in load_before)}, after: "
          f"{' '.join(f'{v:.1f}' for v in os.getloadavg())} on {os.cpu_count()} cores")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    pol = sub.add_parser("policies")
    pol.add_argument("--trace", nargs="*", default=[])
    pol.add_argument("--top-k", type=int, default=2, help="router top-k of the server traces")
    pol.add_argument("--synthetic", action="store_true")
    pol.add_argument("--steps", type=int, default=400)
    pol.add_argument("--layers", type=int, default=48)
    # Qwen3.5-122B-A10B W4A16 at tp 2 (python -m sglang_ext.moe plan): 2.32 MiB per expert shard over 25 GB/s;
    # about 44 MB of weights read per layer per rank at batch 1 (mean over its layers) from 936 GB/s memory.
    pol.add_argument("--load-ms", type=float, default=0.097, help="one expert copy over the host link")
    pol.add_argument("--compute-ms", type=float, default=0.047, help="one layer's compute at batch 1")
    srv = sub.add_parser("serve")
    srv.add_argument("--k", type=int, nargs="+", default=[2, 4, 8])
    srv.add_argument("--tokens", type=int, default=32)
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)  # the simulator's tensors are tiny: thread hand-offs cost more than the math
    cmd_policies(args) if args.cmd == "policies" else cmd_serve(args)


if __name__ == "__main__":
    main()
