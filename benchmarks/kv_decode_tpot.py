"""Decode speed over a compressed KV pool on the portable CPU platform: time per output token at batch 1 and 8.

Produces the CPU decode figures of docs/kv-formats.md, "Known limits". Time: one server start per format plus
the requests (not recorded).

    python benchmarks/kv_decode_tpot.py [--dtypes int8,octave_k3v4] [--batches 1,8] [--prompt 512] [--tokens 64]

For each `--kv-cache-dtype`: one real server (built-in model, float32 weights); for each batch size B, B
streamed greedy requests sent at once (prompts: B different windows of --prompt tokens of the constitution
text, ignore_eos) after a warm-up request. TPOT of a request = (end - first token) / (tokens - 1); the table
gives the mean over the B requests. Prints a markdown table; --out writes the rows as JSON. At B > 1 a
request's TPOT also contains the decode steps stalled by the other requests' prefills (all B arrive at once):
compare runs of the same B and --prompt only.

--attention-only: no server; one decode step's attention over the model's 30 layers (3 KV heads, 9 query
heads, head_dim 64; B sequences of --prompt cached tokens in a shuffled pool), per-request reference loop (the
CPU path before batching) vs `batched_attention`, median of --repeats, process CPU time and wall time. CPU time
is the steadier figure on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from server import ServerProcess  # noqa: E402

from sglang_ext.models.builtin import default_model_dir  # noqa: E402

TEXT_PATH = Path(__file__).resolve().parents[1] / "tests" / "kvcache" / "data" / "constitution_article1.txt"


def stream(server: ServerProcess, ids: list[int], tokens: int) -> tuple[float, float, int]:
    body = {"input_ids": ids, "stream": True,
            "sampling_params": {"max_new_tokens": tokens, "temperature": 0.0, "ignore_eos": True}}
    t0 = time.perf_counter()
    first, n = None, 0
    with requests.post(f"{server.url}/generate", json=body, stream=True, timeout=1800) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                continue
            if first is None:
                first = time.perf_counter()
            n = len(json.loads(line[5:])["output_ids"])
    return first - t0, time.perf_counter() - first, n


def attention_only(args) -> list[dict]:
    import torch

    from sglang_ext.kvcache.batch_plan import plan_decode
    from sglang_ext.kvcache.batched_attention import batched_attention, pad_batch
    from sglang_ext.kvformats import get_format, reference

    layers, h_kv, hq, d = 30, 3, 9, 64
    rows = []
    for dtype in args.dtypes.split(","):
        fmt = get_format(dtype, d, d)
        for batch in [int(b) for b in args.batches.split(",")]:
            gen = torch.Generator().manual_seed(0)
            slots = batch * args.prompt
            planes = fmt.allocate(slots + 1, h_kv, "cpu")
            for name, codes in fmt.quantize(torch.randn(slots + 1, h_kv, d, generator=gen),
                                             torch.randn(slots + 1, h_kv, d, generator=gen)).items():
                planes[name][:] = codes
            table = (torch.randperm(slots, generator=gen) + 1).view(batch, args.prompt)
            q = torch.randn(batch, hq, d, generator=gen)
            timings = {}
            for path in ("per_request", "batched"):
                samples = []
                for _ in range(args.repeats):
                    c0, w0 = time.process_time(), time.perf_counter()
                    plan = plan_decode(table, list(range(batch)), [args.prompt] * batch)
                    padded = pad_batch(plan, new_tokens=False) if path == "batched" else None
                    for _layer in range(layers):
                        if padded is None:
                            reference.decode_attention(fmt, q, planes, plan.kv_indptr, plan.kv_indices, d**-0.5)
                        else:
                            batched_attention(fmt, q, planes, padded, d**-0.5)
                    samples.append((time.process_time() - c0, time.perf_counter() - w0))
                cpu = sorted(s[0] for s in samples)[len(samples) // 2]
                wall = sorted(s[1] for s in samples)[len(samples) // 2]
                timings[path] = (cpu, wall)
            rows.append({"kv_cache_dtype": dtype, "batch": batch, "cached_tokens": args.prompt,
                         "per_request_cpu_ms": round(1000 * timings["per_request"][0], 1),
                         "batched_cpu_ms": round(1000 * timings["batched"][0], 1),
                         "per_request_wall_ms": round(1000 * timings["per_request"][1], 1),
                         "batched_wall_ms": round(1000 * timings["batched"][1], 1)})
            print(json.dumps(rows[-1]), flush=True)
    print("| KV | batch | per-request CPU ms (wall) | batched CPU ms (wall) |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['kv_cache_dtype']} | {r['batch']} | {r['per_request_cpu_ms']} ({r['per_request_wall_ms']}) "
              f"| {r['batched_cpu_ms']} ({r['batched_wall_ms']}) |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="int8,octave_k3v4")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", default=None)
    ap.add_argument("--attention-only", action="store_true")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if args.attention_only:
        rows = attention_only(args)
        if args.out:
            Path(args.out).write_text(json.dumps(rows, indent=1))
        return
    model = str(default_model_dir())
    ids = AutoTokenizer.from_pretrained(model)(TEXT_PATH.read_text(), add_special_tokens=False).input_ids
    batches = [int(b) for b in args.batches.split(",")]
    step = (len(ids) - args.prompt) // max(max(batches) - 1, 1)
    prompts = [ids[i * step : i * step + args.prompt] for i in range(max(batches))]
    rows = []
    for dtype in args.dtypes.split(","):
        server_args = ["--dtype", "float32", "--kv-cache-dtype", dtype, "--max-total-tokens", "20000",
                       "--random-seed", "0"]  # fmt: skip
        server = ServerProcess(model, server_args, name=f"tpot-{dtype}").start()
        try:
            stream(server, prompts[0][:32], 4)  # warm-up
            for batch in batches:
                with ThreadPoolExecutor(batch) as pool:
                    res = list(pool.map(lambda p: stream(server, p, args.tokens), prompts[:batch]))
                tpots = [decode_s / max(n - 1, 1) for _ttft, decode_s, n in res]
                rows.append({"kv_cache_dtype": dtype, "batch": batch, "prompt_tokens": args.prompt,
                             "new_tokens": args.tokens, "tpot_ms": round(1000 * sum(tpots) / len(tpots), 1)})
                print(json.dumps(rows[-1]), flush=True)
        finally:
            server.stop()
    print("| KV | batch | TPOT (ms) |\n|---|---|---|")
    for r in rows:
        print(f"| {r['kv_cache_dtype']} | {r['batch']} | {r['tpot_ms']} |")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
