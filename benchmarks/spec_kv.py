"""Speculative decoding served by SGLang on the portable CPU platform against the plain server: the "Served on
the CPU platform" table of docs/benchmarks/speculative.md (greedy identity, the server's accept length, tokens/s).

    python benchmarks/spec_kv.py [--kv auto int8 octave_k3v4 octave_k3v3] [--deterministic] [--draft DIR]
                                 [--prompts tests|heldout] [--batch B] [--algorithm NEXTN|NGRAM] [--out F]
                                 [--topk 1 4] [--draft-tokens N]
    # the table's rows: a trained layer (python -m tools.draft_training --out DIR), chain and tree, batch 1
    python benchmarks/spec_kv.py --kv auto --prompts heldout --draft DIR --topk 1 4 --out served.json

Time: every server start takes 40-70 s on 2 CPU cores; the 16 held-out prompts take 2-3 minutes per server at
batch 1 (about 15 tokens/s plain, 10-12 speculative), so the command above runs about 10 minutes.

Per KV format: a plain server, then a NEXTN server (fixed-seed MTP layer, or --draft DIR, a trained one; 3 steps,
topk 1, 4 draft tokens), one
at a time, each given the 4 prompts of tests/spec/test_spec_serving.py one by one (batch 1, greedy, 64 tokens,
ignore_eos). Recorded per request: output ids, completion_tokens, spec_verify_ct and e2e_latency from the
server's meta_info, and the 1-minute load average before and after. --deterministic starts both servers with
--enable-deterministic-inference (the CPU platform's batch-invariant mode); both serve the MiMo folder then, the
model NEXTN verifies with. Printed per format: prompts with identical
output, identical tokens (position by position), accept length (completion tokens / verify steps) and tokens/s
(completion tokens / e2e latency, prefill included) for plain and NEXTN.

--prompts heldout: instead, the 16 held-out prompts train-draft measures its simulated acceptance on (chat
template, token ids), up to 128 greedy tokens each, stopping at the end token as the simulation does: the
server's accept length on the simulation's own prompts. --batch B: B prompts per /generate call (scheduled
together; the list is cycled to fill a batch), tokens/s = completion tokens / wall time of the calls.
--algorithm NGRAM: the NGRAM drafter (no draft model, 4 draft tokens) instead of NEXTN.
--topk K [K ...]: one NEXTN server per value (`--speculative-eagle-topk`; > 1 drafts trees), each against the same
plain server; --draft-tokens N: `--speculative-num-draft-tokens` (default 4: 3 verified draft tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))  # tools/ (the held-out prompts of draft training) is not installed
from server import ServerProcess  # noqa: E402
from spec.test_spec_serving import BASE_ARGS, NEW_TOKENS, NGRAM_ARGS, PROMPTS, nextn_args  # noqa: E402

from sglang_ext.models import prepare  # noqa: E402
from sglang_ext.models.mtp_checkpoint import fixed_seed_mtp_weights, write_mtp_checkpoint  # noqa: E402

# A forward step can stall for minutes on a shared 2-core machine; SGLang's scheduler watchdog (300 s) would
# then kill the server mid-run.
WATCHDOG = ("--watchdog-timeout", "3600")


def prompt_set(name: str, model: str) -> tuple[list[dict], int, bool]:
    """(request inputs, new tokens, ignore_eos) of a prompt set."""
    if name == "tests":
        return [{"text": p} for p in PROMPTS], NEW_TOKENS, True
    from transformers import AutoTokenizer

    from tools.draft_training.draft_corpus import HELDOUT_TOPICS, prompts
    from tools.draft_training.train_draft import DraftTrainConfig

    config = DraftTrainConfig()
    ids = prompts(HELDOUT_TOPICS, AutoTokenizer.from_pretrained(model), config.heldout_prompts, config.seed)
    return [{"input_ids": i} for i in ids], config.new_tokens, False


def greedy_batches(server, inputs: list[dict], new_tokens: int, ignore_eos: bool, batch: int) -> list[dict]:
    """Every input once (cycled to fill the last batch), `batch` per /generate call; each output gets the wall
    time of its call."""
    outs = []
    for start in range(0, len(inputs), batch):
        chunk = [inputs[(start + j) % len(inputs)] for j in range(batch)]
        key = "text" if "text" in chunk[0] else "input_ids"
        body = {key: [c[key] for c in chunk], "sampling_params": {
            "max_new_tokens": new_tokens, "temperature": 0.0, "ignore_eos": ignore_eos}}
        t0 = time.monotonic()
        r = requests.post(f"{server.url}/generate", json=body, timeout=3600)
        r.raise_for_status()
        wall = time.monotonic() - t0
        outs += [{**o, "wall": wall, "call": start // batch} for o in r.json()]
    return outs


def run_server(model: str, args: list[str], name: str, inputs, new_tokens, ignore_eos, batch) -> dict:
    server = ServerProcess(model, args, name=name).start()
    try:
        load_before = os.getloadavg()[0]
        outs = greedy_batches(server, inputs, new_tokens, ignore_eos, batch)
        load_after = os.getloadavg()[0]
    finally:
        server.stop()
    return {"load1_before": load_before, "load1_after": load_after, "batch": batch,
            "requests": [{"ids": o["output_ids"], "wall": o["wall"], "call": o["call"],
                          **{k: o["meta_info"].get(k) for k in ("completion_tokens", "spec_verify_ct", "e2e_latency")}}
                         for o in outs]}


def summarise(kv: str, plain: dict, nextn: dict) -> dict:
    pairs = list(zip(plain["requests"], nextn["requests"], strict=True))
    tokens = sum(len(p["ids"]) for p, _ in pairs)
    same_tokens = sum(a == b for p, n in pairs for a, b in zip(p["ids"], n["ids"]))
    completion = sum(n["completion_tokens"] for _, n in pairs)
    verify = sum(n["spec_verify_ct"] for _, n in pairs)

    def tok_s(reqs):  # completion tokens over the wall time of the calls (each call counted once)
        walls = {r["call"]: r["wall"] for r in reqs}
        return sum(r["completion_tokens"] for r in reqs) / sum(walls.values())

    return {"kv": kv, "prompts_identical": sum(p["ids"] == n["ids"] for p, n in pairs), "prompts": len(pairs),
            "tokens_identical": same_tokens, "tokens": tokens, "accept_length": completion / verify,
            "plain_tok_s": tok_s(plain["requests"]), "nextn_tok_s": tok_s(nextn["requests"]),
            "load1": [plain["load1_before"], plain["load1_after"], nextn["load1_before"], nextn["load1_after"]]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kv", nargs="+", default=["auto", "int8", "octave_k3v4", "octave_k3v3"])
    ap.add_argument("--out", default=None)
    ap.add_argument("--deterministic", action="store_true", help="both servers with --enable-deterministic-inference")
    ap.add_argument("--prompts", choices=["tests", "heldout"], default="tests")
    ap.add_argument("--batch", type=int, default=1, help="prompts per /generate call")
    ap.add_argument("--algorithm", choices=["NEXTN", "NGRAM"], default="NEXTN")
    ap.add_argument("--topk", type=int, nargs="+", default=[1], help="--speculative-eagle-topk, one server each")
    ap.add_argument("--draft-tokens", type=int, default=4, help="--speculative-num-draft-tokens")
    ap.add_argument("--draft", default=None, help="a trained MTP folder (python -m tools.draft_training's output); "
                    "default: the fixed-seed untrained layer")
    args = ap.parse_args()
    model = str(prepare())
    if args.draft:
        mtp = Path(args.draft)
    else:
        mtp = Path(tempfile.mkdtemp(prefix="spec-kv-")) / "smollm2-mtp"
        write_mtp_checkpoint(model, mtp, fixed_seed_mtp_weights(model, seed=0))
    inputs, new_tokens, ignore_eos = prompt_set(args.prompts, model)
    serve = (inputs, new_tokens, ignore_eos, args.batch)
    spec_configs = ([(k, nextn_args(str(mtp), topk=k, draft_tokens=args.draft_tokens)) for k in args.topk]
                    if args.algorithm == "NEXTN" else [(None, NGRAM_ARGS)])
    results = []
    mode = ["--enable-deterministic-inference"] if args.deterministic else []
    plain_model = str(mtp) if args.deterministic else model
    for kv in args.kv:
        kv_args = ["--kv-cache-dtype", kv, *mode]
        plain = run_server(plain_model, [*BASE_ARGS, *WATCHDOG, *kv_args], f"bench-plain-{kv}", *serve)
        for topk, spec_args in spec_configs:
            nextn = run_server(model, [*BASE_ARGS, *WATCHDOG, *kv_args, *spec_args], f"bench-spec-{kv}", *serve)
            results.append({"summary": summarise(kv, plain, nextn), "deterministic": args.deterministic,
                            "prompts": args.prompts, "batch": args.batch, "algorithm": args.algorithm,
                            "topk": topk, "draft_tokens": args.draft_tokens if topk else None,
                            "plain": plain, "nextn": nextn})
            s = results[-1]["summary"]
            print(f"| {kv} | topk {topk} | {s['prompts_identical']}/{s['prompts']} | "
                  f"{s['tokens_identical']}/{s['tokens']} | {s['accept_length']:.3f} | {s['plain_tok_s']:.2f} | "
                  f"{s['nextn_tok_s']:.2f} | {' / '.join(f'{x:.1f}' for x in s['load1'])} |", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
