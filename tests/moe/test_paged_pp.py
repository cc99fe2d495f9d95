"""Paged experts with pipeline parallelism 2 on the CPU platform, tiny qwen3_5_moe (4 MoE layers, 2 per stage),
K=4 of 8: SGLang refuses `--pp-size` > 1 with paged experts; sglang-ext lifts that refusal
(sglang_ext/moe/sglang_glue.py). Each stage builds host stores and slot tables for its own layers only and pages
them on its own. Checked here: greedy output equals transformers' unpaged float32 reference, each stage's trace
holds exactly its layers' stores and steps, and each stage's loads equal an LRU replay of its routing."""

import json
from collections import defaultdict

import pytest
from paged_helpers import HYBRID_ARGS, HYBRID_ENV, ask_batch, assert_matches_reference
from server import ServerProcess

from sglang_ext.moe.residency import LruResidency

K = 4


@pytest.fixture(scope="module")
def served(moe_checkpoint, tmp_path_factory):
    trace = tmp_path_factory.mktemp("paged-pp") / "trace.jsonl"
    # SGLang's CPU path binds one NUMA node per rank unless told otherwise: one core each
    env = {**HYBRID_ENV, "SGLANG_EXT_PAGED_EXPERTS_TRACE": str(trace), "SGLANG_CPU_OMP_THREADS_BIND": "0|1"}
    proc = ServerProcess(moe_checkpoint, [*HYBRID_ARGS, "--pp-size", "2", "--enable-paged-experts",
                                          "--paged-experts-num-resident", str(K)], env=env, name="paged-experts-pp2")
    proc.start()
    try:
        replies = ask_batch(proc.url)
    finally:
        proc.stop()
    return replies, trace


def test_pp2_greedy_equals_unpaged_reference(served, moe_reference):
    replies, _ = served
    assert_matches_reference(replies, moe_reference, f"pp 2, K={K}")


def test_pp2_each_stage_pages_its_own_layers(served, moe_config):
    _, trace = served
    by_stage = defaultdict(list)
    for line in trace.read_text().splitlines():
        rec = json.loads(line)
        by_stage[rec.pop("pid")].append(rec)
    assert len(by_stage) == 2, f"expected 2 scheduler processes in the trace, got {len(by_stage)}"
    num_layers, num_experts = moe_config["num_hidden_layers"], moe_config["num_experts"]
    expert_bytes = 3 * moe_config["hidden_size"] * moe_config["moe_intermediate_size"] * 4
    stage_layers = []
    for records in by_stage.values():
        stores = [r for r in records if "store" in r]
        layers = sorted(r["store"] for r in stores)
        stage_layers.append(layers)
        assert all(s["host_bytes"] == num_experts * expert_bytes and s["slot_bytes"] == K * expert_bytes
                   for s in stores), stores
        steps = [r for r in records if "layer" in r]
        assert {r["layer"] for r in steps} == set(layers), f"stage with stores {layers} planned other layers"
        policies = {layer: LruResidency(K, num_experts) for layer in layers}
        for i, rec in enumerate(steps):
            waves = policies[rec["layer"]].step(rec["experts"])
            assert [list(load) for wave in waves for load in wave] == rec["loads"], f"stage {layers}, line {i}"
        assert sum(len(r["loads"]) for r in steps) > 0, f"stage {layers}: no paging happened"
    assert sorted(stage_layers) == [[0, 1], [2, 3]], f"layers per stage: {stage_layers} of {num_layers}"
