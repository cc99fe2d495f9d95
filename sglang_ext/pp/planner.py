"""Pipeline-parallel partition planner. Core: never imports sglang.

What SGLang 0.5.23 does with a split (read from its code, see docs/pipeline-parallel.md):
  * free memory after loading the weights is MIN-reduced over ALL ranks (utils/common.py
    get_available_gpu_memory(distributed=True)), minus one slack = pre-load free memory x (1 - mem_fraction_static);
  * each rank divides that budget by its own per-token KV bytes (its KV layers), and the token capacity is
    MIN-reduced over the PP ranks (kv_cache_configurator._apply_token_constraints).
So for stages s with GPU memory M_s, weights W_s and A_s KV layers:

    capacity = floor((min_s(M_s - ctx - W_s) - slack) / h / (kv_bytes_per_token_layer * max_s A_s))

with h = 1 + mamba_full_memory_ratio for hybrid (linear-attention) models, whose Mamba state pool takes its
share of the same budget, else 1 (kv_cache_configurator._handle_max_mamba_cache). With --max-mamba-cache-size K
the state pool is fixed instead: h = 1 and the budget first loses (K + 1) x state_bytes x max_s B_s, B_s being
stage s's linear-attention layers (SGLang prices every rank's pool at the fullest stage's share). In both modes
the number of requests whose state fits (`mamba_slots`) falls as max_s B_s grows. Objective of `plan_partition`, lexicographic:
  1. maximise `capacity` (memory unknown: minimise max_s A_s instead);
  2. among splits whose capacity is within `capacity_slack` of the best and not below the default split's,
     minimise the modelled bottleneck stage time max_s T_s (decode step, memory-bandwidth bound: the weights
     the stage reads, its lm_head, and the KV it reads for `decode_batch` sequences of `context_tokens`),
     ties to the smaller sum of T_s^2.
Hard constraints: stage s owns a contiguous, non-empty layer range; layers reading raw input ids on stage 0.

Paged MoE experts (`--enable-paged-experts --paged-experts-num-resident K`): a MoE layer keeps K of its E routed
experts on the GPU (the rest live in host memory), so W_s counts K/E of each MoE layer's routed-expert bytes.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from typing import Callable, Sequence

from .kv_bytes import kv_bytes_per_token_head, mla_kv_bytes_per_token
from .model_shape import ModelShape
from .factorizations import pp_problems
from .partition import PartitionError, check_partition, default_partition

GIB = float(1 << 30)
# Memory the CUDA context and allocator take before SGLang measures free memory (assumed, typical 0.3-0.6 GiB).
CUDA_CONTEXT_GIB = 0.5
DEFAULT_BANDWIDTH_GBS = 1000.0  # GB/s per GPU, RTX 3090/4090 class; only relative stage times matter


def sglang_reserve_gib(gpu_mem_gib: float, tp: int, pp: int) -> float:
    """Per-GPU memory SGLang 0.5.23 keeps out of the static pool at default settings: its
    arg_groups/memory_hook.py formula, 512 MiB + 1.5 MiB x max(chunked_prefill, 2048) + tp*pp/8 GiB +
    2 MiB x decode CUDA-graph max_bs (>= 10 GiB above 60 GiB cards), with its per-memory-class defaults
    for chunked_prefill_size and max_bs. Prefill CUDA graphs (off by default) are not counted."""
    mib = gpu_mem_gib * 1024
    if mib < 20 * 1024:
        chunk, max_bs = 2048, 8
    elif mib < 35 * 1024:
        chunk, max_bs = 4096, (48 if tp < 4 else 160)
    elif mib < 60 * 1024:
        chunk, max_bs = 4096, (32 if tp < 4 else 160)
    elif mib < 160 * 1024:
        chunk, max_bs = 8192, (256 if tp < 4 else 512)
    else:
        chunk, max_bs = 16384, 512
    reserved = 512 + 1.5 * max(chunk, 2048) + tp * pp / 8 * 1024 + 2 * max_bs
    if mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return reserved / 1024


@dataclasses.dataclass(frozen=True)
class PlanOptions:
    """Inputs besides the model. gpu_mem_gib: one entry per GPU in launch order (stage s uses GPUs
    s*tp .. s*tp+tp-1), or one entry for all, or None when unknown (then only layer counts and time matter)."""

    gpu_mem_gib: tuple[float, ...] | None = None
    kv_cache_dtype: str = "auto"
    mem_fraction_static: float | None = None  # None: SGLang's default (sglang_reserve_gib)
    reserve_gib: float | None = None  # overrides the per-GPU non-static memory directly
    decode_batch: int = 32
    context_tokens: int = 4096
    bandwidth_gbs: float = DEFAULT_BANDWIDTH_GBS
    capacity_slack: float = 0.02
    mamba_full_memory_ratio: float = 0.9  # SGLang's default: hybrid models give the state pool r/(1+r) of it
    max_mamba_cache_size: int | None = None  # --max-mamba-cache-size: a fixed state pool of that many requests
    paged_experts_num_resident: int | None = None  # --paged-experts-num-resident with --enable-paged-experts

    def __post_init__(self):
        if self.gpu_mem_gib is not None and (not self.gpu_mem_gib or min(self.gpu_mem_gib) <= 0):
            raise ValueError(f"gpu_mem_gib must be positive GiB values, got {self.gpu_mem_gib}")
        if not 0 <= self.capacity_slack < 1:
            raise ValueError(f"capacity_slack must be in [0, 1), got {self.capacity_slack}")
        if self.paged_experts_num_resident is not None and self.paged_experts_num_resident < 1:
            raise ValueError(f"paged_experts_num_resident must be >= 1, got {self.paged_experts_num_resident}")


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """One partition under one (tp, pp). GiB / ms per stage; capacity None when GPU memory is unknown."""

    partition: tuple[int, ...]
    tp: int
    weight_gib: tuple[float, ...]  # per GPU of each stage
    kv_layers: tuple[int, ...]
    stage_tokens: tuple[int | None, ...] | None  # what each stage alone could hold (None: it has no KV layer)
    stage_ms: tuple[float, ...]
    capacity: int | None  # SGLang 0.5.23's KV token capacity (see module docstring)
    kv_bytes_per_token_layer: float  # per GPU
    state_layers: tuple[int, ...] = ()  # linear-attention layers per stage (recurrent state, no KV)
    mamba_slots: int | None = None  # requests whose recurrent state the Mamba pool holds (hybrids, memory known)

    @property
    def bottleneck_ms(self) -> float:
        return max(self.stage_ms)


class _StageModel:
    """Per-GPU stage costs of one (shape, tp, pp, options), from prefix sums over layers."""

    def __init__(self, shape: ModelShape, tp: int, pp: int, opts: PlanOptions):
        self.shape, self.tp, self.pp, self.opts = shape, tp, pp, opts
        kv_heads = max(1, shape.num_kv_heads // tp)
        if shape.mla_kv_dim:
            self.kv_tok_layer = mla_kv_bytes_per_token(opts.kv_cache_dtype, shape.mla_kv_dim, shape.model_dtype_bytes)
        else:
            per_head = kv_bytes_per_token_head(
                opts.kv_cache_dtype, shape.head_dim, shape.v_head_dim, shape.rotary_dim, shape.model_dtype_bytes
            )
            self.kv_tok_layer = kv_heads * per_head
        touched = shape.touched_expert_fraction(opts.decode_batch)
        resident = 1.0  # share of each MoE layer's routed experts held in GPU memory
        if opts.paged_experts_num_resident is not None and shape.num_experts:
            resident = min(opts.paged_experts_num_resident, shape.num_experts) / shape.num_experts
        self.w = _prefix(
            [(b - r + r * resident) / tp for b, r in zip(shape.layer_weight_bytes, shape.layer_routed_bytes)]
        )
        self.read = _prefix(
            [(b - r + r * touched) / tp for b, r in zip(shape.layer_weight_bytes, shape.layer_routed_bytes)]
        )
        self.a = _prefix([1 if k else 0 for k in shape.layer_has_kv])
        self.b = _prefix([1 if st else 0 for st in shape.layer_has_state])
        self.hybrid = not all(shape.layer_has_kv)
        self.state_layer = shape.linear_state_bytes / tp  # SGLang shards the state's heads over TP
        self.fixed_state = self.hybrid and opts.max_mamba_cache_size is not None
        lm_head = 0.0 if (pp == 1 and shape.tied_embeddings) else shape.lm_head_bytes
        self.embed, self.lm_head = shape.embed_bytes / tp, lm_head / tp
        mem = opts.gpu_mem_gib
        if mem is not None:
            mem = tuple(mem) * (tp * pp) if len(mem) == 1 else tuple(mem)
            if len(mem) != tp * pp:
                raise ValueError(f"{len(mem)} GPU memory sizes given for tp {tp} x pp {pp} = {tp * pp} GPUs")
            self.stage_mem = [min(mem[s * tp : (s + 1) * tp]) * GIB for s in range(pp)]
            pre = min(self.stage_mem) - CUDA_CONTEXT_GIB * GIB
            if opts.reserve_gib is not None:
                self.slack = opts.reserve_gib * GIB
            elif opts.mem_fraction_static is not None:
                self.slack = pre * (1 - opts.mem_fraction_static)
            else:  # SGLang sizes mem_fraction_static from the launcher's GPU (the first one)
                self.slack = pre * sglang_reserve_gib(mem[0], tp, pp) / mem[0]
        else:
            self.stage_mem, self.slack = None, 0.0

    def weights(self, s: int, i: int, j: int) -> float:
        return self.w[j] - self.w[i] + (self.embed if s == 0 else 0.0) + (self.lm_head if s == self.pp - 1 else 0.0)

    def kv_layers(self, i: int, j: int) -> int:
        return self.a[j] - self.a[i]

    def state_layers(self, i: int, j: int) -> int:
        return self.b[j] - self.b[i]

    def free(self, s: int, i: int, j: int) -> float:
        return self.stage_mem[s] - CUDA_CONTEXT_GIB * GIB - self.weights(s, i, j)

    def time_ms(self, s: int, i: int, j: int) -> float:
        o = self.opts
        read = self.read[j] - self.read[i] + (self.lm_head if s == self.pp - 1 else 0.0)
        kv = o.decode_batch * o.context_tokens * self.kv_tok_layer * self.kv_layers(i, j)
        return (read + kv) / (o.bandwidth_gbs * 1e9) * 1e3

    def kv_budget(self, min_free: float, max_state_layers: int) -> float:
        """Bytes each rank gives its KV pool: the static budget less the Mamba state pool
        (_handle_max_mamba_cache: a fixed pool of K + 1 slots at the fullest stage's state, or r / (1 + r))."""
        rest = min_free - self.slack
        if self.fixed_state:
            return rest - (self.opts.max_mamba_cache_size + 1) * self.state_layer * max_state_layers
        if self.hybrid:
            return rest / (1.0 + self.opts.mamba_full_memory_ratio)
        return rest

    def capacity(self, min_free: float, max_kv_layers: int, max_state_layers: int = 0) -> int:
        rest = self.kv_budget(min_free, max_state_layers)
        if rest <= 0 or max_kv_layers == 0:
            return 0
        return int(rest // (self.kv_tok_layer * max_kv_layers))

    def free_needed(self, tokens: int, max_kv_layers: int, max_state_layers: int) -> float:
        """The smallest min_s free memory for which `capacity` reaches `tokens` (inverse of kv_budget)."""
        kv = tokens * self.kv_tok_layer * max(max_kv_layers, 1)
        if self.fixed_state:
            return kv + (self.opts.max_mamba_cache_size + 1) * self.state_layer * max_state_layers + self.slack
        if self.hybrid:
            return kv * (1.0 + self.opts.mamba_full_memory_ratio) + self.slack
        return kv + self.slack

    def mamba_slots(self, min_free: float, max_state_layers: int) -> int | None:
        """Requests the state pool holds: K when fixed, else what r / (1 + r) of the budget buys at the fullest
        stage's state (one slot is SGLang's padding slot)."""
        if not self.hybrid or not self.state_layer or not max_state_layers:
            return None
        if self.fixed_state:
            return self.opts.max_mamba_cache_size
        budget = (min_free - self.slack) * self.opts.mamba_full_memory_ratio / (1.0 + self.opts.mamba_full_memory_ratio)
        per_slot = self.state_layer * max_state_layers
        return max(0, int((budget - per_slot) // per_slot))

    def evaluate(self, partition: Sequence[int]) -> Evaluation:
        ranges, start = [], 0
        for n in partition:
            ranges.append((start, start + n))
            start += n
        kv = tuple(self.kv_layers(i, j) for i, j in ranges)
        state = tuple(self.state_layers(i, j) for i, j in ranges)
        stage_tokens = capacity = slots = None
        if self.stage_mem is not None:
            free = [self.free(s, i, j) for s, (i, j) in enumerate(ranges)]
            stage_tokens = tuple(self.capacity(f, a, b) if a else None for f, a, b in zip(free, kv, state))
            capacity = self.capacity(min(free), max(kv), max(state))
            slots = self.mamba_slots(min(free), max(state))
        return Evaluation(
            partition=tuple(partition),
            tp=self.tp,
            weight_gib=tuple(self.weights(s, i, j) / GIB for s, (i, j) in enumerate(ranges)),
            kv_layers=kv,
            stage_tokens=stage_tokens,
            stage_ms=tuple(self.time_ms(s, i, j) for s, (i, j) in enumerate(ranges)),
            capacity=capacity,
            kv_bytes_per_token_layer=self.kv_tok_layer,
            state_layers=state,
            mamba_slots=slots,
        )


def _prefix(values: Sequence[float]) -> list:
    out = [0]
    for v in values:
        out.append(out[-1] + v)
    return out


def _best_split(
    m: _StageModel,
    kv_bound: int,
    score: Callable[[int, int, int], tuple],
    allowed: Callable[[int, int, int], bool] = lambda s, i, j: True,
) -> tuple[int, ...] | None:
    """Contiguous split, at most kv_bound KV layers per stage, maximising the lexicographic min over stages
    of score(s, i, j) (a tuple (bottleneck, additive...) combined as (min, sum...)), subject to
    allowed(s, i, j). Stage s owns layers [i, j). None if infeasible. O(pp x layers x span)."""
    L, P = m.shape.num_layers, m.pp
    first_min = max(m.shape.raw_id_layers) + 1 if m.shape.raw_id_layers else 1
    NEG = None
    best = [[NEG] * (L + 1) for _ in range(P + 1)]
    back = [[0] * (L + 1) for _ in range(P + 1)]
    best[0][0] = (math.inf,)
    for s in range(P):
        for j in range(s + 1, L - (P - s - 1) + 1):
            lo = max(s, bisect.bisect_left(m.a, m.a[j] - kv_bound))  # first i with a[j] - a[i] <= kv_bound
            for i in range(lo, j):
                prev = best[s][i]
                if prev is NEG or (s == 0 and j < first_min) or not allowed(s, i, j):
                    continue
                v = score(s, i, j)
                cand = (min(prev[0], v[0]),) + tuple(a + b for a, b in zip(prev[1:] or (0,) * (len(v) - 1), v[1:]))
                if best[s + 1][j] is NEG or cand > best[s + 1][j]:
                    best[s + 1][j], back[s + 1][j] = cand, i
    if best[P][L] is NEG:
        return None
    cuts, j = [], L
    for s in range(P, 0, -1):
        i = back[s][j]
        cuts.append(j - i)
        j = i
    return tuple(reversed(cuts))


def plan_partition(shape: ModelShape, tp: int, pp: int, opts: PlanOptions = PlanOptions()) -> Evaluation:
    """The best layer partition for (tp, pp) under the objective in the module docstring.
    Raises PartitionError when no partition satisfies the hard constraints."""
    problems = pp_problems(shape, pp)
    if problems:
        raise PartitionError(f"no valid {pp}-stage partition for {shape.name}: {'; '.join(problems)}")
    m = _StageModel(shape, tp, pp, opts)
    if pp == 1:
        return m.evaluate((shape.num_layers,))
    total_kv = shape.num_kv_layers
    k_values = range(max(1, math.ceil(total_kv / pp)) if total_kv else 0, total_kv + 1)
    time_score = lambda s, i, j: (-m.time_ms(s, i, j), -m.time_ms(s, i, j) ** 2)  # noqa: E731
    if m.stage_mem is None:  # memory unknown: fewest KV layers on the fullest stage, then time
        for k in k_values:
            split = _best_split(m, k, time_score)
            if split is not None:
                return m.evaluate(split)
        raise PartitionError(f"no valid {pp}-stage partition for {shape.name}")

    # 1. best capacity over every bound k on the KV layers of the fullest stage (and, with a fixed Mamba pool,
    #    every bound b on its linear-attention layers, whose state that pool prices at the fullest stage)
    total_free_ub = sum(m.stage_mem) - pp * CUDA_CONTEXT_GIB * GIB - m.w[-1] - m.embed - m.lm_head
    total_state = m.b[-1]
    b_values = list(range(math.ceil(total_state / pp), total_state + 1)) if m.fixed_state else [None]
    best_cap, best_split = -1, None
    for k in k_values:
        b_low = b_values[0] or 0
        if best_split is not None and m.capacity(total_free_ub / pp, max(k, 1), b_low) <= best_cap:
            break  # even a perfectly even spread of free memory cannot beat the best any more
        for b in b_values:
            split = _best_split(m, k, lambda s, i, j: (m.free(s, i, j), -m.time_ms(s, i, j)), _state_bound(m, b))
            if split is not None and m.evaluate(split).capacity > best_cap:
                best_cap, best_split = m.evaluate(split).capacity, split
    if best_split is None:
        raise PartitionError(f"no valid {pp}-stage partition for {shape.name}")
    if best_cap <= 0:
        return m.evaluate(best_split)

    # 2. fastest bottleneck among splits keeping (1 - capacity_slack) of the best capacity, never below the
    #    default split's capacity
    floor_cap = math.ceil(best_cap * (1 - opts.capacity_slack))
    default = default_partition(shape.num_layers, pp)
    if not any(r >= default[0] for r in shape.raw_id_layers):
        floor_cap = max(floor_cap, m.evaluate(default).capacity)
    chosen = m.evaluate(best_split)
    for k in k_values:
        if m.free_needed(floor_cap, k, b_values[0] or 0) > total_free_ub / pp:
            break  # the fullest stage's free memory cannot exceed the mean
        for b in b_values:
            need_free = m.free_needed(floor_cap, k, b or 0)
            in_bound = _state_bound(m, b)
            split = _best_split(m, k, time_score, lambda s, i, j, f=need_free, ok=in_bound: m.free(s, i, j) >= f and ok(s, i, j))
            if split is None:
                continue
            cand = m.evaluate(split)
            faster = (cand.bottleneck_ms, -cand.capacity) < (chosen.bottleneck_ms, -chosen.capacity)
            if cand.capacity >= floor_cap and faster:
                chosen = cand
    return chosen


def _state_bound(m: _StageModel, bound: int | None) -> Callable[[int, int, int], bool]:
    """Stage filter: at most `bound` linear-attention layers (None: any)."""
    if bound is None:
        return lambda s, i, j: True
    return lambda s, i, j: m.state_layers(i, j) <= bound


def evaluate_partition(
    shape: ModelShape, tp: int, partition: Sequence[int], opts: PlanOptions = PlanOptions()
) -> Evaluation:
    """Capacity and stage times of a given partition (checked first: PartitionError if it cannot run)."""
    check_partition(partition, len(partition), shape.num_layers, shape.raw_id_layers, shape.raw_id_reason)
    return _StageModel(shape, tp, len(partition), opts).evaluate(partition)


def evaluate_default(shape: ModelShape, tp: int, pp: int, opts: PlanOptions = PlanOptions()) -> Evaluation:
    """SGLang's even split, evaluated without the raw-input-id check (it may violate it: that is the point)."""
    return _StageModel(shape, tp, pp, opts).evaluate(default_partition(shape.num_layers, pp))
