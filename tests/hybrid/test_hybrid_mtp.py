"""NEXTN (MTP) speculative decoding on a hybrid GDN model on the CPU platform: tiny Qwen3.5 served by stock
`launch_server --speculative-algorithm NEXTN` with its own MTP layer (SGLang's Qwen3_5ForCausalLMMTP draft),
chain and tree drafts, greedy output token for token equal to the same checkpoint served without speculation,
and drafts accepted (the server's own counters).

A verify runs the GDN layers over the drafts with per-draft recurrent and conv states (SGLang's intermediate
state buffers; tree drafts continue from their parent's snapshot) and commits the state of the last accepted
draft (hybrid/ops/state_scatter.py); any wrong state shows up as different tokens after the first accepted draft.

The checkpoint: `prepare_tiny("qwen3_5")`, with the MTP layer made able to guess (its random weights never
propose the target's token): the draft's input fusion passes only the next token's embedding (fc = [I | 0]) and
its decoder layer adds nothing (o_proj, down_proj zero), so it drafts the bigram lm_head(norm(embedding)); the
target's attention, GDN and MLP outputs are scaled by 0.3 (as models/tiny.py does for the dense tiny models), so
that bigram is often the target's next token (13 of 39 greedy tokens offline) while attention and the recurrent
state still decide most of them.

The chain server runs the HiCache host tier and `--session-retention-seconds` too: an agent turn's second turn (a
device hit) and its host hit after one long prompt answer as the cold request (tokens, log-probabilities, verify
counts), the MTP layer's KV with the target's in SGLang's host pool (host_round_trip in
test_hybrid_compressed_combos.py).

Flags as tests/hybrid/test_hybrid_serving.py (float32, float32 conv state, no_buffer Mamba radix strategy without
overlap, 16 Mamba slots), and a memory fraction that only has to admit the small pool (SGLang's free-memory profile
is noisy on a shared machine). No deterministic mode is needed over float32 KV: the plain and speculative servers agree
token for token (last-bit differences between 4-row verify and 1-row decode GEMMs do not reach a near-tie here).
"""

import shutil

import pytest
import requests
import torch
from server import ServerProcess
from test_hybrid_compressed_combos import HICACHE_ARGS, host_round_trip

from sglang_ext.models.tiny import prepare_tiny

PROMPT_LENGTHS = (6, 20, 40, 71)
NEW_TOKENS = 32
BRANCH_SCALE = 0.3
HYBRID_ARGS = ("--dtype", "float32", "--enable-cache-report", "--mamba-radix-cache-strategy", "no_buffer",
               "--disable-overlap-schedule", "--max-mamba-cache-size", "16", "--mem-fraction-static", "0.95")
POOL_ARGS = ("--max-total-tokens", "2000")
HYBRID_ENV = {"SGLANG_MAMBA_CONV_DTYPE": "float32"}
# (name, --speculative-num-steps, --speculative-eagle-topk, --speculative-num-draft-tokens)
DRAFTS = (("chain", 3, 1, 4), ("tree", 3, 2, 6))


def _guessing_mtp_checkpoint(base, out):
    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    for f in base.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            shutil.copy(f, out / f.name)
    weights = load_file(base / "model.safetensors")
    hidden = weights["mtp.fc.weight"].shape[0]
    weights["mtp.fc.weight"] = torch.cat([torch.eye(hidden), torch.zeros(hidden, hidden)], dim=1)
    for name in list(weights):
        if name.endswith(("out_proj.weight", "o_proj.weight", "down_proj.weight")):
            weights[name] = weights[name] * (0.0 if name.startswith("mtp.") else BRANCH_SCALE)
    save_file(weights, out / "model.safetensors")
    return str(out)


@pytest.fixture(scope="module")
def checkpoint(model_dir, tmp_path_factory):  # model_dir: the built-in tokenizer the tiny model copies
    return _guessing_mtp_checkpoint(prepare_tiny("qwen3_5"), tmp_path_factory.mktemp("hybrid-mtp") / "qwen3_5")


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [[1] + torch.randint(3, 49000, (n - 1,), generator=gen).tolist() for n in PROMPT_LENGTHS]


def _greedy(server) -> list[dict]:
    outs = []
    for ids in _prompts():  # batch 1: each verify is one request's drafts
        body = {"input_ids": ids,
                "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0.0, "ignore_eos": True}}
        reply = requests.post(f"{server.url}/generate", json=body, timeout=900)
        reply.raise_for_status()
        outs.append(reply.json())
    return outs


def _serve(checkpoint, args, name, pool_args=POOL_ARGS):
    return ServerProcess(checkpoint, [*HYBRID_ARGS, *pool_args, *args], env=HYBRID_ENV, name=name).start()


@pytest.fixture(scope="module")
def plain(checkpoint):
    server = _serve(checkpoint, [], "hybrid-mtp-plain")
    try:
        yield _greedy(server)
    finally:
        server.stop()


@pytest.mark.parametrize(("name", "steps", "topk", "draft_tokens"), DRAFTS, ids=[d[0] for d in DRAFTS])
def test_nextn_greedy_equals_plain(checkpoint, plain, name, steps, topk, draft_tokens, record_property):
    # The chain server runs the HiCache host tier and session retention too (float32 KV: SGLang's host pool with
    # the MTP layer packed after the target's); the host round trip as over compressed KV.
    with_host_tier = name == "chain"
    server = _serve(checkpoint, ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", str(steps),
                                 "--speculative-eagle-topk", str(topk),
                                 "--speculative-num-draft-tokens", str(draft_tokens)], f"hybrid-mtp-{name}",
                    pool_args=HICACHE_ARGS if with_host_tier else POOL_ARGS)
    try:
        outs = _greedy(server)
        if with_host_tier:
            host_round_trip(server, None)
    finally:
        server.stop()
    if with_host_tier:
        assert "packed MTP KV layers: target_layers=1, draft_layers=1" in server.log_text()
    for ids, got, want in zip(_prompts(), outs, plain):
        first_diff = next((i for i, (a, b) in enumerate(zip(got["output_ids"], want["output_ids"])) if a != b), None)
        assert first_diff is None and len(got["output_ids"]) == NEW_TOKENS, (
            f"{name}, prompt of {len(ids)} tokens: NEXTN parts from plain at token {first_diff}")
    verifies = sum(o["meta_info"]["spec_verify_ct"] for o in outs)
    accept_length = NEW_TOKENS * len(outs) / verifies
    record_property("accept_length", accept_length)
    assert accept_length > 1.1, f"{name}: accept length {accept_length:.2f}: (almost) no MTP draft was accepted"
