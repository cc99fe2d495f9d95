"""TTFT of an agent turn on a hybrid model (tiny Qwen3.5: 3 Gated DeltaNet layers + 1 full-attention layer) on
the CPU platform: cold, warm on device, and back from the HiCache host tier.

Produces the "Agent turns" table of docs/benchmarks/hybrid.md:

    python benchmarks/hybrid_sessions.py --contexts 1024,2048,3968 --repeats 2 --json /tmp/hybrid-sessions.json

One server (float32 weights and conv state, `--mamba-radix-cache-strategy no_buffer`, a device pool of the
largest context + 2048 tokens, a host tier of 2x that) replays, for each context size C and each repeat, an agent
session: turn 1 is C tokens (max 8 new tokens); turn 2 is turn 1 + its answer + a 64-token new message.
  cold    turn 2 after /flush_cache: everything is prefilled;
  warm    turn 1, then turn 2: the history (KV of the full-attention layer and the recurrent state of every GDN
          layer at the history's end) is on device, only the new message is prefilled;
  host    turn 1, then one-off prompts of more tokens than the device pool push it out to the host tier, then
          turn 2: KV pages and recurrent states are loaded back from host RAM.
TTFT is the client wall time of a non-streaming /generate with max_new_tokens=1 (prefill + one token), median
over the repeats; the client waits --think-seconds before each turn 2 (an agent reads the answer or runs a tool).
Each turn 2 must report the tier its history came from (`cached_tokens_details`) and the three answers must
be the same token; a run that does not is an error, not a row.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import requests
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from server import ServerProcess  # tests/server.py: a real launch_server subprocess

from sglang_ext.models.tiny import prepare_tiny

NEW_MESSAGE_TOKENS = 64
ONE_OFF_TOKENS = 1024
HOST_RATIO = 2


def server_args(device_tokens: int) -> list[str]:
    return ["--dtype", "float32", "--enable-cache-report", "--max-total-tokens", str(device_tokens),
            "--mamba-radix-cache-strategy", "no_buffer", "--disable-overlap-schedule", "--max-mamba-cache-size", "16",
            "--enable-hierarchical-cache", "--hicache-io-backend", "direct", "--hicache-mem-layout",
            "page_first_direct", "--hicache-ratio", str(HOST_RATIO)]


class Client:
    def __init__(self, url: str, seed: int):
        self.url = url
        self.gen = torch.Generator().manual_seed(seed)

    def tokens(self, n: int) -> list[int]:
        return torch.randint(3, 49000, (n,), generator=self.gen).tolist()

    def ask(self, ids: list[int], new_tokens: int) -> tuple[float, dict]:
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0.0}}
        t0 = time.perf_counter()
        reply = requests.post(f"{self.url}/generate", json=body, timeout=3600)
        seconds = time.perf_counter() - t0
        reply.raise_for_status()
        return seconds, reply.json()

    def flush(self, attempts: int = 60) -> None:
        """SGLang answers 400 while the host tier still has transfers in flight: retry for up to a minute."""
        for _ in range(attempts):
            reply = requests.post(f"{self.url}/flush_cache", timeout=60)
            if reply.status_code != 400:
                break
            time.sleep(1.0)
        reply.raise_for_status()

    def push_out(self, tokens: int) -> None:
        for _ in range(-(-tokens // ONE_OFF_TOKENS)):
            self.ask([1] + self.tokens(ONE_OFF_TOKENS - 1), 1)


def run_context(client: Client, context: int, device_tokens: int, think_s: float) -> dict:
    turn1 = [1] + client.tokens(context - 1)
    client.flush()
    _, first = client.ask(turn1, 8)
    turn2 = turn1 + first["output_ids"] + client.tokens(NEW_MESSAGE_TOKENS)
    reusable = len(turn1) + len(first["output_ids"]) - 1
    row = {"context": context, "turn2_tokens": len(turn2)}

    client.flush()
    row["cold_s"], cold = client.ask(turn2, 1)
    expect(cold, 0, None, "cold")

    client.flush()
    client.ask(turn1, 8)
    time.sleep(think_s)
    row["warm_s"], warm = client.ask(turn2, 1)
    expect(warm, reusable, "device", "warm")

    client.flush()
    client.ask(turn1, 8)
    client.push_out(device_tokens)
    time.sleep(think_s)
    row["host_s"], host = client.ask(turn2, 1)
    expect(host, reusable, "host", "host")

    answers = {cold["output_ids"][0], warm["output_ids"][0], host["output_ids"][0]}
    if len(answers) != 1:
        raise RuntimeError(f"context {context}: cold, warm and host answers differ: {answers}")
    return row


def expect(reply: dict, cached: int, tier: str | None, name: str) -> None:
    meta = reply["meta_info"]
    details = meta.get("cached_tokens_details") or {}
    if meta["cached_tokens"] != cached or (tier is not None and details.get(tier) != cached):
        raise RuntimeError(f"{name}: expected {cached} cached tokens from {tier}, got {meta['cached_tokens']} {details}")


def markdown(rows: list[dict]) -> str:
    lines = ["| history (tokens) | turn 2 prompt | cold TTFT (s) | warm, device hit (s) | host-tier hit (s) |",
             "| --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['context']} | {r['turn2_tokens']} | {r['cold_s']:.2f} | {r['warm_s']:.2f} | "
                     f"{r['host_s']:.2f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", default="1024,2048,3968",
                    help="comma-separated history sizes (tokens); turn 2 adds 72, within the context length (4096)")
    ap.add_argument("--repeats", type=int, default=3, help="sessions per context (TTFT is their median)")
    ap.add_argument("--think-seconds", type=float, default=1.0, help="client pause before each turn 2")
    ap.add_argument("--json", type=Path, help="also write the raw measurements here")
    args = ap.parse_args()
    contexts = [int(c) for c in args.contexts.split(",")]
    device_tokens = max(contexts) + 2048
    server = ServerProcess(str(prepare_tiny("qwen3_5")), server_args(device_tokens),
                           env={"SGLANG_MAMBA_CONV_DTYPE": "float32"}, name="hybrid-sessions").start()
    try:
        client = Client(server.url, seed=0)
        runs = [run_context(client, c, device_tokens, args.think_seconds) for c in contexts for _ in range(args.repeats)]
    finally:
        server.stop()
    rows = []
    for c in contexts:
        mine = [r for r in runs if r["context"] == c]
        rows.append({"context": c, "turn2_tokens": mine[0]["turn2_tokens"],
                     **{k: statistics.median(r[k] for r in mine) for k in ("cold_s", "warm_s", "host_s")}})
    if args.json:
        args.json.write_text(json.dumps({"device_tokens": device_tokens, "host_ratio": HOST_RATIO, "runs": runs,
                                         "rows": rows}, indent=1))
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
