"""Tensor parallelism over compressed KV on the dense built-in model: TP=3 against TP=1 of the same KV format.

SmolLM2-135M-Instruct has 3 KV heads, so at `--tp-size 3` each rank (gloo on the CPU platform, float32 weights)
holds one KV head and quantizes and stores only that head. Per format, a TP=1 and a TP=3 server (started side by
side) decode the same prompts greedily, one request at a time, with each position's top-2 log-probabilities.

TP=3 is not bit-identical to TP=1: the row-parallel projections (o_proj, down_proj) sum partial products through
an all-reduce, another float32 summation order than one GEMM, so the K/V of the next layer differ in their last
bits; an element that sits on a code boundary then rounds to the neighbouring code (an int8 step is 1/127 of the
element's scale, a 3-bit step roughly 2/7 of it). "Identical output" is therefore not the claim. The check is:
  1. before the first differing token, every position's log-probability of the chosen token is within the
     format's DELTA of TP=1's;
  2. where the tokens part, it is a near-tie: TP=1's top-2 margin there is below 2*DELTA, TP=3's token is TP=1's
     second choice, and TP=3 gives it a log-probability within DELTA of TP=1's.
A real sharding bug (a wrong head, scale or rank slice) moves log-probabilities by far more than DELTA and parts
tokens at positions with a wide margin, so it fails.

DELTA per format: what a few last-bit perturbations do to a log-probability, with room, and far below the
typical top-2 margin of these prompts (median 1.2-1.4 nats), so that rule 2 only admits partings at positions that
were near-ties at TP=1. Measured (12 tokens x 4 prompts, tokens equal on all): int8 gaps 5.0e-3 .. 2.2e-2, DELTA
0.05; octave_k3v4 6e-6 .. 2.5e-2 (8.9e-2 in a 16-token run), DELTA 0.25 (a flipped 3-bit code moves its element
by tens of int8 steps, so it gets the wider bound).

Formats: octave_k3v4 in CI (the format users shard; int8 meets TP=2 on the hybrid model in
tests/hybrid/test_hybrid_parallel.py). int8 runs here too with SGLANG_EXT_TEST_TP3_INT8=1 (left out of CI for
its two server start-ups; measured tokens equal on 4 of 4, gaps 5.0e-3 .. 2.2e-2). float32 KV at TP>1 is covered
on the hybrid model; float32 and octave_k3v3 at TP=3 were run by hand with these rules (docs/kv-formats.md):
float32 tokens equal, gaps up to 5.1e-6; octave_k3v3 parted on one prompt's last token at a near-tie (margin
0.375) with a 0.26 gap there, so it would need DELTA 0.3.
"""

from __future__ import annotations

import concurrent.futures
import os

import pytest
import requests
from server import ServerProcess

FORMATS = ("int8", "octave_k3v4") if os.environ.get("SGLANG_EXT_TEST_TP3_INT8") == "1" else ("octave_k3v4",)
# Log-probability tolerance per format (see the module docstring for why these values).
DELTA = {"int8": 0.05, "octave_k3v4": 0.25}
PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
)
NEW_TOKENS = 12
ARGS = ("--dtype", "float32", "--max-total-tokens", "2000", "--disable-overlap-schedule")


def _serve(model_dir: str, kv_format: str, tp: int) -> ServerProcess:
    args = [*ARGS, "--kv-cache-dtype", kv_format]
    env = {}
    if tp > 1:
        args += ["--tp-size", str(tp)]
        # SGLang binds one NUMA node per rank unless told otherwise; more ranks than nodes need a core list each.
        env["SGLANG_CPU_OMP_THREADS_BIND"] = "|".join(str(r % (os.cpu_count() or 1)) for r in range(tp))
    return ServerProcess(model_dir, args, env=env, name=f"{kv_format}-tp{tp}").start()


def _decode(server: ServerProcess) -> list[dict]:
    """One prompt at a time: each prefills in one chunk and decodes alone on both servers."""
    replies = []
    for text in PROMPTS:
        body = {"text": text, "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0.0},
                "return_logprob": True, "top_logprobs_num": 2}
        r = requests.post(f"{server.url}/generate", json=body, timeout=900)
        r.raise_for_status()
        replies.append(r.json()["meta_info"])
    return replies


def _run(model_dir: str, kv_format: str, tp: int) -> tuple[list[dict], int]:
    server = _serve(model_dir, kv_format, tp)
    try:
        info = server.server_info()
        return _decode(server), info.get("tp_size")
    finally:
        server.stop()


def compare(reference: list[dict], sharded: list[dict], delta: float) -> list[dict]:
    """Rules 1 and 2 of the module docstring, per prompt; returns what was measured, raises AssertionError."""
    measured = []
    for text, ref, got in zip(PROMPTS, reference, sharded):
        ref_lp = [(lp, tok) for lp, tok, _ in ref["output_token_logprobs"]]
        got_lp = [(lp, tok) for lp, tok, _ in got["output_token_logprobs"]]
        first = next((i for i, (a, b) in enumerate(zip(ref_lp, got_lp)) if a[1] != b[1]), None)
        same = len(ref_lp) if first is None else first
        gap = max((abs(a[0] - b[0]) for a, b in zip(ref_lp[:same], got_lp[:same])), default=0.0)
        assert gap <= delta, f"{text!r}: log-probabilities differ by {gap:.3g} > {delta} before any token parts"
        row = {"prompt": text, "first_difference": first, "gap": gap}
        if first is not None:
            (lp1, tok1, _), (lp2, tok2, _) = ref["output_top_logprobs"][first][:2]
            margin = lp1 - lp2
            row["margin"] = margin
            where = f"{text!r}: tokens part at position {first} ({tok1} at TP=1, {got_lp[first][1]} at TP=3)"
            assert tok1 == ref_lp[first][1], f"{where}: TP=1's greedy token is not its top-1"
            assert margin < 2 * delta, f"{where}: TP=1's top-2 margin {margin:.3g} is no near-tie (2*delta {2 * delta})"
            assert got_lp[first][1] == tok2, f"{where}: TP=3's token is not TP=1's second choice {tok2}"
            assert abs(got_lp[first][0] - lp2) <= delta, (
                f"{where}: TP=3 gives its token {got_lp[first][0]:.4g}, TP=1 gave it {lp2:.4g}")
        measured.append(row)
    return measured


@pytest.mark.parametrize("kv_format", FORMATS)
def test_tp3_matches_tp1_up_to_near_ties(model_dir, kv_format, record_property):
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # both servers start at once: start-up is mostly waiting
        single, sharded = pool.submit(_run, model_dir, kv_format, 1), pool.submit(_run, model_dir, kv_format, 3)
        (reference, tp1), (got, tp3) = single.result(), sharded.result()
    assert (tp1, tp3) == (1, 3), (tp1, tp3)
    margins = sorted(lp1 - lp2 for meta in reference for (lp1, _, _), (lp2, _, _), *_ in meta["output_top_logprobs"])
    rows = compare(reference, got, DELTA[kv_format])
    record_property("measured", rows)
    record_property("median_top2_margin", margins[len(margins) // 2])
    print(f"{kv_format} TP=3 vs TP=1: " + "; ".join(
        f"first difference {r['first_difference']}, gap {r['gap']:.2e}" + (f", margin {r['margin']:.3g}" if "margin" in r else "")
        for r in rows) + f"; median top-2 margin {margins[len(margins) // 2]:.3g}")


def _meta(steps: list[tuple[int, float, int, float]]) -> dict:
    """(chosen token, its logprob, second token, its logprob) per step, as SGLang's meta_info has them."""
    return {"output_token_logprobs": [[lp, tok, None] for tok, lp, _, _ in steps],
            "output_top_logprobs": [[[lp, tok, None], [lp2, tok2, None]] for tok, lp, tok2, lp2 in steps]}


def test_compare_accepts_near_ties_only():
    """The rules without servers: a near-tie parting passes, a gap or a wide-margin parting fails."""
    ref = [_meta([(5, -0.1, 6, -3.0), (7, -0.70, 8, -0.72), (9, -0.2, 1, -4.0)])] * len(PROMPTS)
    near_tie = [_meta([(5, -0.11, 6, -3.0), (8, -0.69, 7, -0.73), (2, -0.3, 9, -2.0)])] * len(PROMPTS)
    rows = compare(ref, near_tie, 0.05)
    assert [r["first_difference"] for r in rows] == [1] * len(PROMPTS)
    with pytest.raises(AssertionError, match="before any token parts"):
        compare(ref, [_meta([(5, -0.3, 6, -3.0), (8, -0.69, 7, -0.73), (9, -0.2, 1, -4.0)])] * len(PROMPTS), 0.05)
    with pytest.raises(AssertionError, match="no near-tie"):
        compare(ref, [_meta([(6, -0.1, 5, -3.0), (7, -0.70, 8, -0.72), (9, -0.2, 1, -4.0)])] * len(PROMPTS), 0.05)
    with pytest.raises(AssertionError, match="second choice"):
        compare(ref, [_meta([(5, -0.1, 6, -3.0), (3, -0.69, 7, -0.73), (9, -0.2, 1, -4.0)])] * len(PROMPTS), 0.05)
