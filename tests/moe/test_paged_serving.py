"""SGLang's paged experts (`--enable-paged-experts --paged-experts-num-resident K`) served on the CPU platform on
the tiny qwen3_5_moe (8 routed experts, top-2, 4 MoE layers; hybrid flags as tests/hybrid/test_hybrid_serving.py),
at K = top-k (2), a middle K (4) and all experts (8):

- greedy tokens and log-probabilities equal transformers' own float32 implementation of the same checkpoint
  (unpaged), for a batch that prefills more distinct experts than K (several waves) and decodes together;
- the server's hit/miss record (its trace: every wave's loads, SGLANG_EXT_PAGED_EXPERTS_TRACE) equals a replay of
  its routing through `sglang_ext.moe.residency.LruResidency`, load for load;
- each layer's host store holds exactly E experts (its stated bound: E x 3 x hidden x moe_intermediate x 4 bytes),
  allocated once, and the slot table K of them."""

import json

import pytest
from paged_helpers import HYBRID_ARGS, HYBRID_ENV, ask_batch, assert_matches_reference
from server import ServerProcess

from sglang_ext.moe.residency import LruResidency
from sglang_ext.moe.traces import server_trace_loads


@pytest.fixture(scope="module", params=[2, 4, 8], ids=lambda k: f"K{k}")
def served(request, moe_checkpoint, tmp_path_factory):
    k = request.param
    trace = tmp_path_factory.mktemp("paged") / "trace.jsonl"
    proc = ServerProcess(moe_checkpoint, [*HYBRID_ARGS, "--enable-paged-experts", "--paged-experts-num-resident",
                                          str(k)],
                         env={**HYBRID_ENV, "SGLANG_EXT_PAGED_EXPERTS_TRACE": str(trace)},
                         name=f"paged-experts-K{k}").start()
    try:
        replies = ask_batch(proc.url)
    finally:
        proc.stop()
    return k, replies, trace


def test_greedy_equals_unpaged_reference(served, moe_reference):
    k, replies, _ = served
    assert_matches_reference(replies, moe_reference, f"K={k}")


def test_hits_and_misses_match_replay(served, moe_config):
    config = moe_config
    k, _, trace = served
    records = server_trace_loads(trace)
    num_experts = config["num_experts"]
    layers = {rec["layer"] for rec in records}
    assert layers == set(range(config["num_hidden_layers"])), f"MoE layers in the trace: {sorted(layers)}"
    policies = {layer: LruResidency(k, num_experts) for layer in layers}
    for i, rec in enumerate(records):
        waves = policies[rec["layer"]].step(rec["experts"])
        assert [list(load) for wave in waves for load in wave] == rec["loads"], f"K={k}, planner line {i}"
    misses = sum(len(rec["loads"]) for rec in records)
    accesses = sum(len(rec["experts"]) for rec in records)
    assert misses == sum(p.counters.misses for p in policies.values())
    assert accesses == sum(p.counters.accesses for p in policies.values())
    if k == num_experts:
        assert misses == 0, f"all experts resident, yet {misses} loads"
    else:
        assert 0 < misses < accesses, f"K={k}: {misses} misses of {accesses}"
        # the prompts route more distinct experts per layer than K: waves ran
        assert max(len(rec["experts"]) for rec in records) > k


def test_host_store_within_bound(served, moe_config):
    config = moe_config
    k, _, trace = served
    stores = [json.loads(line) for line in trace.read_text().splitlines() if '"store"' in line]
    expert_bytes = 3 * config["hidden_size"] * config["moe_intermediate_size"] * 4  # float32 gate, up, down
    assert sorted(s["store"] for s in stores) == list(range(config["num_hidden_layers"])), "one store per layer"
    for s in stores:
        assert s["host_bytes"] == config["num_experts"] * expert_bytes, s
        assert s["slot_bytes"] == k * expert_bytes, s
