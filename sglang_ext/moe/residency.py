"""Residency policies for paged MoE experts: which K of a layer's E experts sit in its device slots.

Pure bookkeeping on expert ids (no SGLang import, no tensors): the simulator (`benchmarks/paged_experts.py`) and
the server-trace replay in the tests drive these. One policy object per MoE layer, as SGLang keeps one
`LRUPolicy` per layer.

A step's distinct experts are served in waves of at most K, residents first (SGLang's `plan_waves`); every
policy shares that wave split and differs only in which resident it evicts for a missing expert:

- `LruResidency`: the least recently used resident outside the wave. Same slots, same loads as SGLang 0.5.23's
  `paged_experts.residency.LRUPolicy` + `plan_waves` (tests/moe/test_residency.py checks it on random traces).
- `FreqDecayResidency`: the resident with the lowest decayed use count (count *= decay every step the layer
  runs, +1 per step an expert is routed), ties to the least recently used.
- `NextLayerPrefetch` (wraps one of the above per layer): after layer l routes, the layer-(l+1) experts whose
  conditional frequency given one of layer l's experts (learned online from past steps) clears a threshold are
  loaded into layer l+1 before it runs, while layer l computes; their loads are counted apart from the demand
  misses a step waits for.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class Counters:
    accesses: int = 0  # distinct (step, layer, expert) routings
    misses: int = 0  # demand loads: experts paged in while the layer waits
    prefetches: int = 0  # loads issued ahead of the layer (NextLayerPrefetch)
    prefetch_used: int = 0  # prefetched experts routed by the step they were loaded for

    @property
    def hits(self) -> int:
        return self.accesses - self.misses

    @property
    def hit_rate(self) -> float:
        return self.hits / self.accesses if self.accesses else 0.0

    def add(self, other: Counters) -> None:
        self.accesses += other.accesses
        self.misses += other.misses
        self.prefetches += other.prefetches
        self.prefetch_used += other.prefetch_used


class LruResidency:
    """Slots start holding experts 0..K-1 (expert i in slot i), the least recently used first."""

    name = "lru"

    def __init__(self, num_slots: int, num_experts: int):
        if not 0 < num_slots <= num_experts:
            raise ValueError(f"residency: need 0 < K <= E, got K={num_slots}, E={num_experts}")
        self.num_slots = num_slots
        self.num_experts = num_experts
        self.resident: OrderedDict[int, int] = OrderedDict((e, e) for e in range(num_slots))  # expert -> slot
        self.counters = Counters()

    # --- eviction order: subclasses override -------------------------------------------------------------
    def _victim(self, wave: set[int]) -> int:
        # Every expert of the wave was moved to the recency tail, so the head is outside it.
        return next(iter(self.resident))

    def _observe(self, distinct: Sequence[int]) -> None:
        """Called once per step with the step's distinct experts, before its waves are placed."""

    # --- shared wave split ---------------------------------------------------------------------------
    def _place(self, experts: list[int]) -> list[tuple[int, int]]:
        for e in experts:
            if e in self.resident:
                self.resident.move_to_end(e)
        wave, loads = set(experts), []
        for e in experts:
            if e not in self.resident:
                victim = self._victim(wave)
                slot = self.resident.pop(victim)
                self.resident[e] = slot
                loads.append((e, slot))
        return loads

    def step(self, distinct: Sequence[int]) -> list[list[tuple[int, int]]]:
        """Serve one step's distinct routed experts (ascending, as torch.unique gives them); return each
        wave's (expert, slot) loads and count them as demand misses."""
        distinct = [e for e in distinct if e >= 0]
        self._observe(distinct)
        k = self.num_slots
        ordered = [e for e in distinct if e in self.resident] + [e for e in distinct if e not in self.resident]
        groups = [ordered[i:i + k] for i in range(0, len(ordered), k)] or [[]]
        waves = [self._place(g) for g in groups]
        self.counters.accesses += len(distinct)
        self.counters.misses += sum(len(w) for w in waves)
        return waves

    def prefetch(self, experts: Sequence[int]) -> int:
        """Load `experts` ahead of the next step (most recently used on arrival); return how many loaded."""
        loaded = 0
        for e in experts:
            if e in self.resident:
                continue
            slot = self.resident.pop(self._victim(set(experts)))
            self.resident[e] = slot
            loaded += 1
        self.counters.prefetches += loaded
        return loaded


class FreqDecayResidency(LruResidency):
    name = "freq-decay"

    def __init__(self, num_slots: int, num_experts: int, decay: float = 0.9):
        super().__init__(num_slots, num_experts)
        if not 0.0 < decay < 1.0:
            raise ValueError(f"freq-decay: decay must be in (0, 1), got {decay}")
        self.decay = decay
        self.score = [0.0] * num_experts

    def _observe(self, distinct: Sequence[int]) -> None:
        self.score = [s * self.decay for s in self.score]
        for e in distinct:
            self.score[e] += 1.0

    def _victim(self, wave: set[int]) -> int:
        # min() keeps the first of equal scores: the least recently used among them.
        return min((e for e in self.resident if e not in wave), key=lambda e: self.score[e])


class NextLayerPrefetch:
    """Per-layer policies plus a predictor: co[l][a][b] counts steps where layer l routed a and layer l+1 routed b,
    seen[l][a] the steps where layer l routed a. After layer l routes, each expert b of layer l+1 scores
    max over layer l's experts a of P(b | a) = co[l][a][b] / seen[l][a]; up to `width` experts scoring at least
    `threshold` and not resident are prefetched into layer l+1; an expert a seen in fewer than `min_seen` steps
    predicts nothing."""

    def __init__(self, layers: list[LruResidency], width: int, threshold: float = 0.25, min_seen: int = 4):
        self.layers = layers
        self.width = width
        self.threshold = threshold
        self.min_seen = min_seen
        num_experts = layers[0].num_experts
        # co: [layers - 1, E, E], seen: [layers - 1, E]
        self.co = torch.zeros(len(layers) - 1, num_experts, num_experts, dtype=torch.float64)
        self.seen = torch.zeros(len(layers) - 1, num_experts, dtype=torch.float64)
        self._prefetched: list[set[int]] = [set() for _ in layers]
        self.name = f"{layers[0].name}+prefetch{width}"

    def _predict(self, layer: int, distinct: Sequence[int]) -> list[int]:
        if not distinct:
            return []
        idx = torch.tensor(distinct)
        seen = self.seen[layer, idx]
        known = seen >= self.min_seen
        if not bool(known.any()):
            return []
        cond = self.co[layer, idx[known]] / seen[known].unsqueeze(1)  # P(b | a) for each known a
        score = cond.max(dim=0).values
        hot = (score >= self.threshold).nonzero().squeeze(1)
        return hot[torch.argsort(score[hot], descending=True, stable=True)].tolist()

    def step(self, routed: Sequence[Sequence[int]]) -> None:
        """One forward step: `routed[l]` is layer l's distinct experts."""
        for l, distinct in enumerate(routed):
            policy = self.layers[l]
            policy.counters.prefetch_used += len(self._prefetched[l] & set(distinct))
            policy.step(distinct)
            self._prefetched[l] = set()
            if l + 1 < len(self.layers):
                nxt = self.layers[l + 1]
                chosen = [b for b in self._predict(l, distinct) if b not in nxt.resident][: self.width]
                nxt.prefetch(chosen)
                self._prefetched[l + 1] = set(chosen)
        for l in range(len(routed) - 1):
            if routed[l]:
                a = torch.tensor(routed[l])
                self.seen[l, a] += 1
                if routed[l + 1]:
                    b = torch.tensor(routed[l + 1])
                    self.co[l, a.unsqueeze(1), b.unsqueeze(0)] += 1

    @property
    def counters(self) -> Counters:
        total = Counters()
        for p in self.layers:
            total.add(p.counters)
        return total


POLICIES = {"lru": LruResidency, "freq-decay": FreqDecayResidency}


def make_policy(name: str, num_slots: int, num_experts: int, **kwargs) -> LruResidency:
    if name not in POLICIES:
        raise ValueError(f"unknown residency policy {name!r}; supported: {', '.join(POLICIES)}")
    return POLICIES[name](num_slots, num_experts, **kwargs)


def replay(steps: Sequence[Sequence[Sequence[int]]], policy: str, num_slots: int, num_experts: int,
           prefetch_width: int = 0, prefetch: dict | None = None, **kwargs) -> Counters:
    """Replay a trace (steps x layers x distinct experts) through per-layer policies (`kwargs` to the policy,
    `prefetch` to NextLayerPrefetch when `prefetch_width` > 0); return the summed counters."""
    num_layers = len(steps[0]) if steps else 0
    layers = [make_policy(policy, num_slots, num_experts, **kwargs) for _ in range(num_layers)]
    if prefetch_width:
        driver = NextLayerPrefetch(layers, prefetch_width, **(prefetch or {}))
        for routed in steps:
            driver.step(routed)
        return driver.counters
    for routed in steps:
        for l, distinct in enumerate(routed):
            layers[l].step(distinct)
    total = Counters()
    for p in layers:
        total.add(p.counters)
    return total
