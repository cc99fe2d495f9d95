"""Start-up time and decode speed of stock SGLang + sglang-ext on the portable CPU platform.

Produces the table of docs/ARCHITECTURE.md, "CPU serving speed". Time: one server start per dtype (40-65 s on
2 CPU cores) plus one 64-token request.

    python benchmarks/serve_cpu.py [--dtype bfloat16 float32] [--tokens 64] [--out docs/benchmarks/serve-cpu.json]

For each dtype: starts a real server (built-in model), measures wall time until /health_generate answers,
then time per output token (TPOT) from a single greedy request: (e2e - ttft) / (tokens - 1), using a streamed
request to get TTFT. Prints a markdown table.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from server import ServerProcess  # noqa: E402

from sglang_ext.models import prepare  # noqa: E402

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def stream_timing(server: ServerProcess, tokens: int) -> tuple[float, float, int]:
    body = {"text": PROMPT, "stream": True,
            "sampling_params": {"max_new_tokens": tokens, "temperature": 0.0, "ignore_eos": True}}
    t0 = time.perf_counter()
    ttft, n = None, 0
    with requests.post(f"{server.url}/generate", json=body, stream=True, timeout=900) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                continue
            if ttft is None:
                ttft = time.perf_counter() - t0
            n = len(json.loads(line[5:])["output_ids"]) if b"output_ids" in line else n + 1
    e2e = time.perf_counter() - t0
    return ttft, e2e, n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", nargs="+", default=["bfloat16", "float32"])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    model = str(prepare())
    rows = []
    for dtype in args.dtype:
        server = ServerProcess(model, ["--dtype", dtype], name=f"bench-{dtype}").start()
        try:
            stream_timing(server, 4)  # warm-up
            ttft, e2e, n = stream_timing(server, args.tokens)
        finally:
            server.stop()
        tpot = (e2e - ttft) / max(n - 1, 1)
        rows.append({"dtype": dtype, "startup_s": round(server.startup_seconds, 1), "ttft_s": round(ttft, 3),
                     "tpot_ms": round(tpot * 1000, 1), "tokens": n})
    print("| dtype | start-up (s) | TTFT (s) | TPOT (ms) | tokens |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['dtype']} | {r['startup_s']} | {r['ttft_s']} | {r['tpot_ms']} | {r['tokens']} |")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
