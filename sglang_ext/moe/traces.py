"""Routing traces for the residency simulator: read from a server's paged-experts trace file, or synthesized.

A trace is `steps[t][l]` = the distinct experts MoE layer l routed in forward step t (what SGLang's wave planner
sees). No SGLang import.
"""

from __future__ import annotations

import json
import random
from pathlib import Path


def read_server_trace(path: str | Path) -> tuple[list[list[list[int]]], dict[int, dict]]:
    """Steps and per-layer store records from a `SGLANG_EXT_PAGED_EXPERTS_TRACE` file of one scheduler process.

    Planner lines come in layer order within a forward step; a new step starts when a layer id does not exceed
    the previous line's."""
    steps: list[list[list[int]]] = []
    stores: dict[int, dict] = {}
    last_layer = None
    for line in Path(path).read_text().splitlines():
        rec = json.loads(line)
        if "store" in rec:
            stores[rec["store"]] = rec
            continue
        if last_layer is None or rec["layer"] <= last_layer:
            steps.append([])
        steps[-1].append(rec["experts"])
        last_layer = rec["layer"]
    return steps, stores


def server_trace_loads(path: str | Path) -> list[dict]:
    """The planner lines of a trace file, in order: layer, experts, loads."""
    return [rec for rec in map(json.loads, Path(path).read_text().splitlines()) if "layer" in rec]


def synthetic_trace(*, num_layers: int, num_experts: int, top_k: int, steps: int, batch: int = 1,
                    zipf_s: float = 1.0, p_repeat: float = 0.3, p_follow: float = 0.3,
                    seed: int = 0) -> list[list[list[int]]]:
    """A SYNTHETIC decode trace (not a real model's routing), `batch` sequences decoding together.

    Per layer, expert popularity is Zipf(`zipf_s`) over a random permutation of the experts. A sequence's j-th
    pick at layer l is, with probability `p_repeat`, its own j-th pick at layer l on the previous token (temporal
    locality); else with probability `p_follow`, a fixed random image of its j-th pick at layer l-1 (cross-layer
    correlation, what a next-layer prefetch can exploit); else a fresh Zipf draw. Duplicates within a token are
    redrawn from Zipf."""
    rng = random.Random(seed)
    ranks = list(range(1, num_experts + 1))
    weights = [r ** -zipf_s for r in ranks]
    order = [rng.sample(range(num_experts), num_experts) for _ in range(num_layers)]
    follow = [rng.sample(range(num_experts), num_experts) for _ in range(num_layers)]

    def zipf(l: int) -> int:
        return order[l][rng.choices(range(num_experts), weights)[0]]

    prev: list[list[list[int] | None]] = [[None] * num_layers for _ in range(batch)]
    trace = []
    for _ in range(steps):
        step = [set() for _ in range(num_layers)]
        for b in range(batch):
            below = None
            for l in range(num_layers):
                picks: list[int] = []
                for j in range(top_k):
                    u = rng.random()
                    if prev[b][l] is not None and u < p_repeat:
                        e = prev[b][l][j]
                    elif below is not None and u < p_repeat + p_follow:
                        e = follow[l][below[j]]
                    else:
                        e = zipf(l)
                    while e in picks:
                        e = zipf(l)
                    picks.append(e)
                prev[b][l] = picks
                below = picks
                step[l].update(picks)
        trace.append([sorted(s) for s in step])
    return trace
