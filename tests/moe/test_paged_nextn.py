"""NEXTN (MTP) speculative decoding with paged experts on the CPU platform: SGLang refuses speculative decoding with
`--enable-paged-experts`; sglang-ext lifts that refusal for NEXTN (sglang_ext/moe/sglang_glue.py). Tiny
qwen3_5_moe (8 routed experts, top-2, 4 MoE layers and an MoE MTP layer), K=4 of 8, a chain of 3 drafts (4 tokens
per verify), its MTP layer made able to guess (paged_helpers.guessing_mtp_checkpoint).

The three prompts are sent at once, so a verify batch routes 3 x 4 tokens x top-2 entries per layer: more distinct
experts than K, run in waves like a prefill. Checked: greedy tokens equal transformers' own float32 greedy decoding
of the same checkpoint (no speculation, no paging) token for token; drafts are accepted (the server's verify
counters); the draft's MoE layer pages its own slot table; every slot table's loads (target layers and the MTP layer)
equal an LRU replay of its routing; target layers ran steps with more distinct experts than K beyond the prefills."""

import concurrent.futures
import json
from collections import defaultdict

import pytest
import requests
import torch
from paged_helpers import HYBRID_ARGS, HYBRID_ENV, guessing_mtp_checkpoint, prompts
from server import ServerProcess

from sglang_ext.models.tiny import prepare_tiny
from sglang_ext.moe.residency import LruResidency
from sglang_ext.moe.traces import server_trace_loads

K = 4
NEW_TOKENS = 24
BRANCH_SCALE = 0.3
CHAIN = ("--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
         "--speculative-num-draft-tokens", "4")


@pytest.fixture(scope="module")
def checkpoint(model_dir, tmp_path_factory):  # model_dir: the built-in tokenizer the tiny model copies
    return guessing_mtp_checkpoint(prepare_tiny("qwen3_5_moe"), tmp_path_factory.mktemp("paged-mtp") / "qwen3_5_moe",
                                   BRANCH_SCALE)


@pytest.fixture(scope="module")
def reference(checkpoint):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    with torch.no_grad():
        return [model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)[0, len(ids):].tolist()
                for ids in prompts()]


@pytest.fixture(scope="module")
def served(checkpoint, tmp_path_factory):
    trace = tmp_path_factory.mktemp("paged-nextn") / "trace.jsonl"
    # a memory fraction that only has to admit the small pool, as tests/hybrid/test_hybrid_mtp.py
    proc = ServerProcess(checkpoint, [*HYBRID_ARGS, "--mem-fraction-static", "0.95", "--enable-paged-experts",
                                      "--paged-experts-num-resident", str(K), *CHAIN],
                         env={**HYBRID_ENV, "SGLANG_EXT_PAGED_EXPERTS_TRACE": str(trace)}, name="paged-experts-nextn")
    proc.start()

    def ask(ids):
        body = {"input_ids": ids,
                "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0.0, "ignore_eos": True}}
        reply = requests.post(f"{proc.url}/generate", json=body, timeout=900)
        reply.raise_for_status()
        return reply.json()

    try:
        with concurrent.futures.ThreadPoolExecutor(len(prompts())) as pool:
            replies = list(pool.map(ask, prompts()))
    finally:
        proc.stop()
    return replies, trace


def test_nextn_greedy_equals_plain_decoding(served, reference, record_property):
    replies, _ = served
    for ids, reply, expected in zip(prompts(), replies, reference):
        got = reply["output_ids"]
        first_diff = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), None)
        assert first_diff is None and len(got) == NEW_TOKENS, (
            f"prompt of {len(ids)} tokens: NEXTN with paged experts parts from plain decoding at token {first_diff}")
    verifies = sum(r["meta_info"]["spec_verify_ct"] for r in replies)
    accept_length = NEW_TOKENS * len(replies) / verifies
    record_property("accept_length", accept_length)
    assert accept_length > 1.1, f"accept length {accept_length:.2f}: (almost) no MTP draft was accepted"


def test_target_and_draft_tables_page_as_lru(served, moe_config):
    _, trace = served
    records = server_trace_loads(trace)
    stores = [r for r in map(json.loads, trace.read_text().splitlines()) if "store" in r]
    num_layers, num_experts = moe_config["num_hidden_layers"], moe_config["num_experts"]
    # the target's MoE layers, then the MTP layer's (its own decoder layer 0)
    assert [(s["table"], s["store"]) for s in stores] == [*((i, i) for i in range(num_layers)), (num_layers, 0)]
    by_table = defaultdict(list)
    for rec in records:
        by_table[rec["table"]].append(rec)
    assert sorted(by_table) == list(range(num_layers + 1)), f"tables that planned steps: {sorted(by_table)}"
    for table, steps in by_table.items():
        policy = LruResidency(K, num_experts)
        for i, rec in enumerate(steps):
            waves = policy.step(rec["experts"])
            assert [list(load) for wave in waves for load in wave] == rec["loads"], f"table {table}, line {i}"
        assert sum(len(r["loads"]) for r in steps) > 0, f"table {table}: no paging happened"
    # prefills are at most one per prompt plus SGLang's start-up request; the rest of the wide steps are verifies
    wide = sum(len(r["experts"]) > K for r in by_table[num_layers - 1])
    assert wide > len(prompts()) + 1, f"only {wide} steps of the last target layer routed more than K experts"
