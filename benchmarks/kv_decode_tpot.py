"""Decode speed over a compressed KV pool on the portable CPU platform: time per output token at batch 1 and 8.

    python benchmarks/kv_decode_tpot.py [--dtypes int8,octave_k3v4] [--batches 1,8] [--prompt 512] [--tokens 64]

For each `--kv-cache-dtype`: one real server (built-in model, float32 weights); for each batch size B, B
streamed greedy requests sent at once (prompts: B different windows of --prompt tokens of the constitution
text, ignore_eos) after a warm-up request. TPOT of a request = (end - first token) / (tokens - 1); the table
gives the mean over the B requests. Prints a markdown table; --out writes the rows as JSON.
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="int8,octave_k3v4")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
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
