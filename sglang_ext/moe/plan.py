"""How many routed experts per MoE layer fit on each GPU next to the KV pool, and the decode speed that follows.
Core: never imports sglang; the model facts come from `sglang_ext.pp.model_shape` (config.json estimate).

Per GPU of pipeline stage s (tensor parallel size tp; every rank pages its own 1/tp shard of each expert):

    free_s   = G - reserve - (non-routed weights of the stage's layers + embedding / lm_head on the first / last
               stage) / tp - KV pool share - recurrent-state share
    K_s      = min(E, floor(free_s / (moe_layers_s * expert_bytes / tp)))      must be >= top-k
    SGLang takes one --paged-experts-num-resident for every layer: K = min_s K_s.

KV pool share: `context_tokens` x KV bytes per token of the stage's attention layers / tp (the pp planner's
`kv_bytes`); recurrent state of linear-attention layers: `max_running` requests x (SSM state in float32 + conv
state) / tp. Reserve: SGLang 0.5.23's default non-static memory (`pp.planner.sglang_reserve_gib`).

Decode at batch 1, one token through the stages in order (memory-bandwidth bound):

    t_token = sum over layers [ read_bytes_l / tp / gpu_bw  +  (1 - hit) * top_k * expert_bytes / tp / h2d_bw ]
              + lm_head / tp / gpu_bw

read_bytes_l: the layer's non-routed weights plus top_k routed experts (the resident ones are read from GPU
memory; a miss is first copied from host memory over the host link, `h2d_bw` per GPU, in parallel on the tp
ranks). Prefetch, overlap of copies with compute and the KV read are not modelled (the KV read at batch 1 is
small next to the weights).
"""

from __future__ import annotations

import dataclasses
import math

from sglang_ext.pp.kv_bytes import kv_bytes_per_token_head
from sglang_ext.pp.model_shape import ModelShape, text_config
from sglang_ext.pp.partition import default_partition
from sglang_ext.pp.planner import CUDA_CONTEXT_GIB, GIB, sglang_reserve_gib


class PlanError(ValueError):
    """The model does not fit as asked; the message says what is missing."""


@dataclasses.dataclass(frozen=True)
class PagedPlan:
    tp: int
    pp: int
    partition: tuple[int, ...]
    expert_bytes: float  # one routed expert, whole (all tp shards)
    stage_free_gib: tuple[float, ...]  # per GPU, for routed experts
    stage_moe_layers: tuple[int, ...]
    num_resident: int  # K for --paged-experts-num-resident
    num_experts: int
    top_k: int
    host_store_gib: float  # per rank: every expert of its layers' shards
    kv_gib: float  # per GPU, largest stage
    state_gib: float  # per GPU, largest stage

    def decode_tokens_per_s(self, shape: ModelShape, hit_rate: float, gpu_bw_gbs: float, h2d_gbps: float) -> float:
        if not 0.0 <= hit_rate <= 1.0:
            raise ValueError(f"hit rate must be in [0, 1], got {hit_rate}")
        t = shape.lm_head_bytes / self.tp / (gpu_bw_gbs * 1e9)
        for total, routed in zip(shape.layer_weight_bytes, shape.layer_routed_bytes):
            if routed:
                read = total - routed + self.top_k * self.expert_bytes
                t += (1.0 - hit_rate) * self.top_k * self.expert_bytes / self.tp / (h2d_gbps * 1e9)
            else:
                read = total
            t += read / self.tp / (gpu_bw_gbs * 1e9)
        return 1.0 / t


def _state_bytes_per_request(cfg: dict, dtype_bytes: float) -> float:
    """Recurrent state of one request over all linear-attention layers: SSM state in float32 (nv x dk x dv)
    and the conv window ((conv - 1) x conv channels) in the model dtype."""
    types = cfg.get("layer_types") or []
    linear = sum(1 for t in types if "linear" in str(t)) if types else 0
    if not linear and cfg.get("full_attention_interval"):
        interval = int(cfg["full_attention_interval"])
        linear = sum(1 for i in range(int(cfg["num_hidden_layers"])) if (i + 1) % interval)
    nk, nv = int(cfg.get("linear_num_key_heads") or 0), int(cfg.get("linear_num_value_heads") or 0)
    dk, dv = int(cfg.get("linear_key_head_dim") or 0), int(cfg.get("linear_value_head_dim") or 0)
    conv = int(cfg.get("linear_conv_kernel_dim") or 4)
    ssm = nv * dk * dv * 4.0
    conv_state = (conv - 1) * (2 * nk * dk + nv * dv) * dtype_bytes
    return linear * (ssm + conv_state)


def plan_paged_experts(config: dict, shape: ModelShape, *, gpus: int, gpu_mem_gib: float, tp: int,
                       kv_cache_dtype: str = "auto", context_tokens: int = 32768, max_running: int = 8) -> PagedPlan:
    if not shape.num_experts:
        raise PlanError(f"{shape.name}: no routed experts in the config (num_experts / n_routed_experts)")
    if gpus % tp:
        raise PlanError(f"--tp {tp} must divide --gpus {gpus}")
    pp = gpus // tp
    cfg = text_config(config)
    partition = tuple(default_partition(shape.num_layers, pp))
    moe_ids = [i for i, r in enumerate(shape.layer_routed_bytes) if r]
    expert_bytes = shape.layer_routed_bytes[moe_ids[0]] / shape.num_experts
    per_head = kv_bytes_per_token_head(kv_cache_dtype, shape.head_dim, shape.v_head_dim, shape.rotary_dim,
                                       shape.model_dtype_bytes)
    kv_heads_per_rank = max(1, shape.num_kv_heads // tp)
    reserve = sglang_reserve_gib(gpu_mem_gib, tp, pp) + CUDA_CONTEXT_GIB
    state_req = _state_bytes_per_request(cfg, shape.model_dtype_bytes)
    linear_total = sum(1 for kv in shape.layer_has_kv if not kv) or 1
    frees, moe_counts, kv_max, state_max, ks = [], [], 0.0, 0.0, []
    start = 0
    for s, n in enumerate(partition):
        layers = range(start, start + n)
        start += n
        fixed = sum(shape.layer_weight_bytes[i] - shape.layer_routed_bytes[i] for i in layers)
        fixed += (shape.embed_bytes if s == 0 else 0.0) + (shape.lm_head_bytes if s == pp - 1 else 0.0)
        kv = context_tokens * per_head * kv_heads_per_rank * sum(1 for i in layers if shape.layer_has_kv[i])
        linear_here = sum(1 for i in layers if not shape.layer_has_kv[i])
        state = max_running * state_req * linear_here / linear_total / tp
        free = gpu_mem_gib - reserve - (fixed / tp + kv + state) / GIB
        moe_here = sum(1 for i in layers if shape.layer_routed_bytes[i])
        frees.append(free)
        moe_counts.append(moe_here)
        kv_max, state_max = max(kv_max, kv / GIB), max(state_max, state / GIB)
        if moe_here:
            ks.append(math.floor(max(0.0, free) * GIB / (moe_here * expert_bytes / tp)))
    k = min(shape.num_experts, min(ks))
    if k < shape.experts_per_token:
        worst = min(range(pp), key=lambda s: frees[s])
        raise PlanError(
            f"{shape.name} on {gpus} x {gpu_mem_gib:g} GiB (tp {tp}, pp {pp}): stage {worst} has {frees[worst]:.2f} "
            f"GiB per GPU for experts, room for {k} per layer; paged experts needs at least top-k = "
            f"{shape.experts_per_token}. Lower --context-tokens or --max-running, use a smaller --kv-cache-dtype, "
            "or add GPUs")
    host = max(moe_counts) * shape.num_experts * expert_bytes / tp / GIB
    return PagedPlan(tp=tp, pp=pp, partition=partition, expert_bytes=expert_bytes, stage_free_gib=tuple(frees),
                     stage_moe_layers=tuple(moe_counts), num_resident=k, num_experts=shape.num_experts,
                     top_k=shape.experts_per_token, host_store_gib=host, kv_gib=kv_max, state_gib=state_max)
