"""Paged experts with tensor parallelism 2 (gloo) on the CPU platform, tiny qwen3_5_moe, K=4 of 8: SGLang refuses
`--tp-size` > 1 with paged experts; sglang-ext lifts that refusal (sglang_ext/moe/sglang_glue.py). Each rank pages
its own shard of every expert; the router's input and weights are the same on both ranks, so both must route, place
and load the same experts with no collective of their own. Checked here: greedy output equals transformers'
unpaged float32 reference, and the two ranks' residency traces are identical line for line."""

import json
from collections import defaultdict

import pytest
from paged_helpers import HYBRID_ARGS, HYBRID_ENV, ask_batch, assert_matches_reference
from server import ServerProcess

K = 4


@pytest.fixture(scope="module")
def served(moe_checkpoint, tmp_path_factory):
    trace = tmp_path_factory.mktemp("paged-tp") / "trace.jsonl"
    proc = ServerProcess(moe_checkpoint, [*HYBRID_ARGS, "--tp-size", "2", "--enable-paged-experts",
                                          "--paged-experts-num-resident", str(K)],
                         env={**HYBRID_ENV, "SGLANG_EXT_PAGED_EXPERTS_TRACE": str(trace)}, name="paged-experts-tp2")
    proc.start()
    try:
        replies = ask_batch(proc.url)
    finally:
        proc.stop()
    return replies, trace


def test_tp2_greedy_equals_unpaged_reference(served, moe_reference):
    replies, _ = served
    assert_matches_reference(replies, moe_reference, f"tp 2, K={K}")


def test_tp2_ranks_route_and_load_the_same(served, moe_config):
    _, trace = served
    by_rank = defaultdict(list)
    for line in trace.read_text().splitlines():
        rec = json.loads(line)
        by_rank[rec.pop("pid")].append(rec)
    assert len(by_rank) == 2, f"expected 2 scheduler processes in the trace, got {len(by_rank)}"
    first, second = by_rank.values()
    planned = [r for r in first if "layer" in r]
    assert planned and sum(len(r["loads"]) for r in planned) > 0, "no paging happened"
    assert [r for r in first if "layer" in r] == [r for r in second if "layer" in r]
    # each rank stores half of every expert (the intermediate dimension is split)
    expert_bytes = 3 * moe_config["hidden_size"] * moe_config["moe_intermediate_size"] * 4
    for rank in by_rank.values():
        stores = [r for r in rank if "store" in r]
        assert len(stores) == moe_config["num_hidden_layers"]
        assert all(s["host_bytes"] == moe_config["num_experts"] * expert_bytes // 2 for s in stores), stores[0]
