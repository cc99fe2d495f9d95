"""KV format quality through a real SGLang server: perplexity, greedy agreement with bf16 KV, bytes per token.

Produces docs/benchmarks/quality.md, "Benchmark run" and "Greedy agreement with bf16 KV". Time: one server per
format (not recorded).

For each `--kv-cache-dtype` it starts `python -m sglang.launch_server` on the built-in SmolLM2-135M (float32
weights, prefill chunks of --chunk tokens so most context is read back from the KV pool) and measures:
  ppl        perplexity of tests/kvcache/data/constitution_article1.txt (1651 tokens), scored in one request
             with return_logprob (every token after the first).
             Also over the first --ci-tokens tokens (the CI test's window): prefill chunks start at token 0 in
             both, so those tokens' log-probabilities are the same numbers the test gets.
  agreement  20 prompts (windows of --window tokens of the same text at evenly spaced offsets) x --new
             greedy tokens, compared with bf16 KV's outputs: share of identical tokens (position by position),
             share of prompts identical throughout, and the mean first-divergence position (--new when none).
  bytes      KV pool bytes per token as the server reports it (memory_usage.kvcache / max_total_num_tokens).

    python benchmarks/quality_kv.py [--dtypes bf16,fp8_e4m3,int8,octave_k3v4,octave_k3v3] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests
from transformers import AutoTokenizer

from sglang_ext.models.builtin import default_model_dir

TEXT_PATH = Path(__file__).resolve().parents[1] / "tests" / "kvcache" / "data" / "constitution_article1.txt"
NUM_PROMPTS = 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, kv_cache_dtype: str, chunk: int):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(tempfile.mkstemp(prefix=f"quality-{kv_cache_dtype}-", suffix=".log")[1])
        cmd = [
            sys.executable, "-m", "sglang.launch_server", "--model-path", str(default_model_dir()),
            "--host", "127.0.0.1", "--port", str(self.port), "--kv-cache-dtype", kv_cache_dtype,
            "--dtype", "float32", "--chunked-prefill-size", str(chunk), "--random-seed", "0",
            # A fixed pool (small next to RAM) rather than a share of free host memory: the bytes per token
            # stay exact (the server reports the pool in GiB to 3 decimals) and the run fits a shared machine.
            "--max-total-tokens", "40000",
        ]  # fmt: skip
        with open(self.log, "w") as fh:
            self.proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{kv_cache_dtype}: server exited, log {self.log}")
            try:
                if requests.get(self.url + "/health_generate", timeout=30).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(2)
        self.stop()
        raise RuntimeError(f"{kv_cache_dtype}: server not healthy, log {self.log}")

    def post(self, path: str, payload: dict) -> dict:
        r = requests.post(self.url + path, json=payload, timeout=3600)
        r.raise_for_status()
        return r.json()

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


def measure(kv_cache_dtype: str, ids: list[int], prompts: list[list[int]], args) -> dict:
    server = Server(kv_cache_dtype, args.chunk)
    try:
        t0 = time.monotonic()
        out = server.post(
            "/generate",
            {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0},
             "return_logprob": True, "logprob_start_len": 0},
        )  # fmt: skip
        logprobs = [lp for lp, _t, _s in out["meta_info"]["input_token_logprobs"] if lp is not None]
        ppl = math.exp(-sum(logprobs) / len(logprobs))
        ci = logprobs[: args.ci_tokens - 1]
        ppl_ci = math.exp(-sum(ci) / len(ci))
        t1 = time.monotonic()
        outs = []
        if not args.ppl_only:
            outs = server.post(
                "/generate", {"input_ids": prompts, "sampling_params": {"max_new_tokens": args.new, "temperature": 0}}
            )
        t2 = time.monotonic()
        info = requests.get(server.url + "/server_info", timeout=60).json()
        kv_gib = info["internal_states"][0]["memory_usage"]["kvcache"]
        tokens = info["max_total_num_tokens"]
        return {
            "kv_cache_dtype": kv_cache_dtype,
            "ppl": ppl,
            "scored_tokens": len(logprobs),
            "ppl_ci_window": ppl_ci,
            "ci_scored_tokens": len(ci),
            "outputs": [o["output_ids"] for o in outs],
            "bytes_per_token": kv_gib * (1 << 30) / tokens,
            "max_total_num_tokens": tokens,
            "ppl_seconds": t1 - t0,
            "greedy_seconds": t2 - t1,
        }
    finally:
        server.stop()


def agreement(outputs: list[list[int]], reference: list[list[int]]) -> dict:
    """Token-level agreement of greedy outputs with the reference outputs (same prompts, same lengths asked)."""
    same = total = 0
    first_divergence = []
    for o, r in zip(outputs, reference, strict=True):
        total += len(r)
        same += sum(a == b for a, b in zip(o, r))
        n = 0
        while n < min(len(o), len(r)) and o[n] == r[n]:
            n += 1
        first_divergence.append(n)
    return {
        "tokens_identical": same / total,
        "prompts_identical": sum(o == r for o, r in zip(outputs, reference, strict=True)) / len(reference),
        "first_divergence_mean": sum(first_divergence) / len(first_divergence),
        "first_divergence": first_divergence,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="bf16,fp8_e4m3,int8,octave_k3v4,octave_k3v3")
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--ci-tokens", type=int, default=1152, help="first tokens scored by the CI perplexity test")
    ap.add_argument("--out", default=None)
    ap.add_argument("--ppl-only", action="store_true", help="perplexity and bytes only, no greedy batch")
    args = ap.parse_args()

    tok = AutoTokenizer.from_pretrained(default_model_dir())
    ids = tok(TEXT_PATH.read_text(), add_special_tokens=False).input_ids
    step = (len(ids) - args.window) // (NUM_PROMPTS - 1)
    prompts = [ids[i * step : i * step + args.window] for i in range(NUM_PROMPTS)]

    results = []
    for dtype in args.dtypes.split(","):
        try:
            results.append(measure(dtype, ids, prompts, args))
        except (RuntimeError, requests.HTTPError) as exc:
            results.append({"kv_cache_dtype": dtype, "error": str(exc)})
        print(json.dumps({k: v for k, v in results[-1].items() if k != "outputs"}), flush=True)

    if args.ppl_only:
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=1))
        return
    base = next(r for r in results if r["kv_cache_dtype"] == "bf16" and "error" not in r)
    print(f"\n| KV | bytes/token | capacity vs bf16 | PPL ({base['scored_tokens']} tok) | dPPL | "
          f"PPL ({base['ci_scored_tokens']} tok) | dPPL | tokens identical | prompts identical | first divergence |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        if "error" in r:
            print(f"| {r['kv_cache_dtype']} | failed: {r['error'][:80]} |")
            continue
        r.update(agreement(r["outputs"], base["outputs"]))
        print(
            f"| {r['kv_cache_dtype']} | {r['bytes_per_token']:.0f} "
            f"| x{base['bytes_per_token'] / r['bytes_per_token']:.2f} "
            f"| {r['ppl']:.4f} | {(r['ppl'] / base['ppl'] - 1) * 100:+.2f}% "
            f"| {r['ppl_ci_window']:.4f} | {(r['ppl_ci_window'] / base['ppl_ci_window'] - 1) * 100:+.2f}% "
            f"| {r['tokens_identical'] * 100:.1f}% | {r['prompts_identical'] * 100:.0f}% "
            f"| {r['first_divergence_mean']:.1f} of {args.new} |"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
