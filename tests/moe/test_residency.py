"""Residency policies: our LRU is SGLang's (same loads, same slots on random traces); the other policies keep the
wave contract (every routed expert resident when its wave runs, slots a permutation) and count consistently."""

import random

import pytest

from sglang_ext.moe.residency import FreqDecayResidency, LruResidency, NextLayerPrefetch
from sglang_ext.moe.traces import synthetic_trace


def _random_steps(rng, num_experts, steps, max_distinct):
    return [sorted(rng.sample(range(num_experts), rng.randint(0, max_distinct))) for _ in range(steps)]


@pytest.mark.parametrize("num_experts,num_slots,max_distinct", [(8, 2, 2), (8, 4, 8), (16, 5, 16), (8, 8, 8)])
def test_lru_matches_sglang(num_experts, num_slots, max_distinct):
    from sglang.srt.layers.moe.paged_experts.residency import LRUPolicy, plan_waves

    rng = random.Random(num_experts * 100 + num_slots)
    ours, theirs = LruResidency(num_slots, num_experts), LRUPolicy(num_slots)
    for distinct in _random_steps(rng, num_experts, 300, max_distinct):
        waves = plan_waves(policy=theirs, distinct=distinct)
        assert ours.step(distinct) == [w.loads for w in waves], f"distinct {distinct}"
        assert dict(ours.resident) == dict(theirs.resident)
        assert list(ours.resident) == list(theirs.resident), "recency order differs"


@pytest.mark.parametrize("policy", [LruResidency, FreqDecayResidency])
def test_waves_keep_experts_resident(policy):
    rng = random.Random(1)
    p = policy(4, 12)
    misses = accesses = 0
    for distinct in _random_steps(rng, 12, 200, 10):
        before = dict(p.resident)
        waves = p.step(distinct)
        misses += sum(map(len, waves))
        accesses += len(distinct)
        assert sorted(p.resident.values()) == [0, 1, 2, 3], "slots must stay a permutation"
        loaded = {e for w in waves for e, _ in w}
        assert loaded.isdisjoint(before) or len(distinct) > 4, "a resident expert was loaded again"
        if len(distinct) <= 4:
            assert set(distinct) <= set(p.resident), "a routed expert is not resident after its wave"
    assert (p.counters.misses, p.counters.accesses) == (misses, accesses)


def test_freq_decay_keeps_hot_expert_lru_evicts():
    # Expert 0 is routed every third step, two cold experts (1..5 in turn) between its uses. K=2: LRU evicts 0
    # each time the second cold expert comes; frequency with decay keeps it and evicts the cold one.
    steps, cold = [], 0
    for i in range(60):
        if i % 3 == 0:
            steps.append([0])
        else:
            steps.append([1 + cold % 5])
            cold += 1
    lru, freq = LruResidency(2, 6), FreqDecayResidency(2, 6, decay=0.9)
    for s in steps:
        lru.step(s)
        freq.step(s)
    assert freq.counters.misses < lru.counters.misses, (freq.counters, lru.counters)


def test_prefetch_learns_a_fixed_follow_map():
    # Layer 1 always routes (layer-0 expert + 3) % 8: once each layer-0 expert was seen min_seen times, the
    # prefetch loads exactly layer 1's expert and layer 1 stops missing.
    rng = random.Random(0)
    steps = []
    for _ in range(200):
        a = rng.randrange(8)
        steps.append([[a], [(a + 3) % 8]])
    plain = [LruResidency(2, 8) for _ in range(2)]
    ahead = NextLayerPrefetch([LruResidency(2, 8) for _ in range(2)], width=1)
    for routed in steps:
        for layer, distinct in zip(plain, routed):
            layer.step(distinct)
        ahead.step(routed)
    late, lucky = ahead.layers[1].counters, plain[1].counters
    assert late.misses < lucky.misses / 3, (late, lucky)
    assert late.prefetch_used / late.prefetches > 0.9, late
    assert ahead.layers[0].counters.misses == plain[0].counters.misses, "layer 0 gets no prefetch"


def test_synthetic_trace_shape_and_determinism():
    a = synthetic_trace(num_layers=3, num_experts=16, top_k=2, steps=20, batch=2, seed=5)
    b = synthetic_trace(num_layers=3, num_experts=16, top_k=2, steps=20, batch=2, seed=5)
    assert a == b and len(a) == 20 and all(len(s) == 3 for s in a)
    assert all(2 <= len(layer) <= 4 and all(0 <= e < 16 for e in layer) for s in a for layer in s)
