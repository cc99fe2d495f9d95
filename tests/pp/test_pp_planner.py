"""Planner on published model configs (tests/pp/configs); no weights needed."""

import itertools
import math

import pytest

from sglang_ext.pp import (
    ModelShape,
    PartitionError,
    PlanOptions,
    check_partition,
    default_partition,
    evaluate_default,
    evaluate_partition,
    plan_partition,
)
from sglang_ext.pp.factorizations import tp_problems
from sglang_ext.pp.planner import CUDA_CONTEXT_GIB, GIB


@pytest.mark.parametrize(
    "name, published_params, tolerance",
    [
        ("smollm2_135m", 134.5e6, 0.01),  # tied: embedding counted once
        ("qwen3_32b", 32.8e9, 0.01),
        ("qwen3_30b_a3b", 30.5e9, 0.01),
        ("qwen3_5_27b_like", 27e9, 0.03),  # published as "27B" (text model)
    ],
)
def test_weight_estimate_matches_published_parameter_counts(shape_of, name, published_params, tolerance):
    shape = shape_of(name)
    lm_head = 0 if shape.tied_embeddings else shape.lm_head_bytes
    params = (sum(shape.layer_weight_bytes) + shape.embed_bytes + lm_head) / 2
    error = params / published_params - 1
    assert abs(error) < tolerance, f"{name}: {params:.4g} params, published {published_params:.4g} ({error:+.2%})"


def test_moe_active_parameters(shape_of):
    shape = shape_of("qwen3_30b_a3b")
    assert shape.num_experts == 128 and shape.experts_per_token == 8
    frac = shape.touched_expert_fraction(1)
    active = sum(w - r + r * frac for w, r in zip(shape.layer_weight_bytes, shape.layer_routed_bytes))
    active = (active + shape.embed_bytes + shape.lm_head_bytes) / 2
    assert abs(active / 3.3e9 - 1) < 0.03, f"active params {active:.4g}, published 3.3e9"


def test_paged_experts_count_resident_experts_only(shape_of):
    # --enable-paged-experts --paged-experts-num-resident K: each MoE layer holds K of its E routed experts on the
    # GPU, so a stage's weights are its non-routed bytes plus K/E of its routed bytes, and the KV pool gains the rest
    shape = shape_of("qwen3_30b_a3b")
    whole = PlanOptions(gpu_mem_gib=(24.0,) * 2)
    paged = PlanOptions(gpu_mem_gib=(24.0,) * 2, paged_experts_num_resident=32)
    a, b = evaluate_partition(shape, 1, (24, 24), whole), evaluate_partition(shape, 1, (24, 24), paged)
    routed = [sum(shape.layer_routed_bytes[i:j]) / GIB for i, j in ((0, 24), (24, 48))]
    for s in range(2):
        expected = a.weight_gib[s] - routed[s] * (1 - 32 / 128)
        assert abs(b.weight_gib[s] - expected) < 1e-9, f"stage {s}: {b.weight_gib[s]} GiB, by hand {expected}"
    assert a.capacity == 0 < b.capacity, f"all experts: {a.capacity} tokens; 32 of 128 resident: {b.capacity}"
    assert plan_partition(shape, 1, 2, paged).capacity >= b.capacity
    # K >= E is no paging
    full = PlanOptions(gpu_mem_gib=(24.0,) * 2, paged_experts_num_resident=500)
    assert evaluate_partition(shape, 1, (24, 24), full).weight_gib == a.weight_gib
    with pytest.raises(ValueError, match="paged_experts_num_resident"):
        PlanOptions(paged_experts_num_resident=0)


def test_hybrid_and_partial_rope_read_from_config(shape_of):
    shape = shape_of("qwen3_5_27b_like")
    assert shape.num_kv_layers == 16, f"{shape.num_kv_layers} KV layers"
    assert [i for i, kv in enumerate(shape.layer_has_kv) if kv][:3] == [3, 7, 11]
    assert shape.rotary_dim == 64 and shape.head_dim == 256, (shape.rotary_dim, shape.head_dim)


def _brute_force(shape, tp, pp, opts):
    """Every contiguous split: (best capacity, fastest bottleneck among splits within capacity_slack of it)."""
    evals = []
    for cuts in itertools.combinations(range(1, shape.num_layers), pp - 1):
        bounds = (0, *cuts, shape.num_layers)
        part = tuple(b - a for a, b in zip(bounds, bounds[1:]))
        try:
            evals.append(evaluate_partition(shape, tp, part, opts))
        except PartitionError:
            continue
    best_cap = max(e.capacity for e in evals)
    floor_cap = math.ceil(best_cap * (1 - opts.capacity_slack))
    fastest = min(e.bottleneck_ms for e in evals if e.capacity >= floor_cap)
    return best_cap, floor_cap, fastest


@pytest.mark.parametrize(
    "pp, mem, overrides",
    [
        (3, (1.0, 1.0, 1.0), {}),
        (3, (0.9, 1.2, 0.8), {}),  # heterogeneous memory
        (4, (1.0, 0.8, 1.0, 0.8), {}),
        (3, (1.0, 1.0, 1.0), {"engram_layer_ids": [11]}),  # layer 11 pinned to stage 0
    ],
)
def test_plan_is_optimal_against_brute_force(shape_of, pp, mem, overrides):
    shape = shape_of("smollm2_135m", **overrides)
    opts = PlanOptions(gpu_mem_gib=mem, reserve_gib=0.05)
    plan = plan_partition(shape, 1, pp, opts)
    best_cap, floor_cap, fastest = _brute_force(shape, 1, pp, opts)
    check_partition(plan.partition, pp, shape.num_layers, shape.raw_id_layers)
    assert floor_cap <= plan.capacity <= best_cap, f"plan {plan.partition}: {plan.capacity} tokens, best {best_cap}"
    assert plan.bottleneck_ms <= fastest + 1e-9, f"plan {plan.partition}: {plan.bottleneck_ms} ms, fastest {fastest} ms"


def test_capacity_follows_sglang_min_reductions(shape_of):
    shape = shape_of("smollm2_135m")
    opts = PlanOptions(gpu_mem_gib=(1.0, 0.8), reserve_gib=0.1)
    ev = evaluate_partition(shape, 1, (12, 18), opts)
    kv_bytes = 3 * (64 + 64) * 2  # 3 KV heads, K and V, bf16
    assert ev.kv_bytes_per_token_layer == kv_bytes
    free = min(m - CUDA_CONTEXT_GIB - w for m, w in zip((1.0, 0.8), ev.weight_gib))
    expected = int((free - 0.1) * GIB // (kv_bytes * 18))
    assert ev.capacity == expected, f"capacity {ev.capacity}, by hand {expected}"
    assert min(ev.stage_tokens) >= ev.capacity, f"stage tokens {ev.stage_tokens} vs capacity {ev.capacity}"


def test_embedding_and_lm_head_stages_get_fewer_layers(shape_of):
    for name, gpus in (("qwen3_32b", 6), ("qwen3_5_27b_like", 6)):
        shape = shape_of(name)
        opts = PlanOptions(gpu_mem_gib=(24.0,) * gpus)
        plan, default = plan_partition(shape, 1, gpus, opts), evaluate_default(shape, 1, gpus, opts)
        middle = plan.partition[1:-1]
        assert plan.partition[0] <= min(middle) and plan.partition[-1] <= min(middle), f"{name}: {plan.partition}"
        assert plan.capacity > default.capacity, f"{name}: plan {plan.capacity} vs default {default.capacity}"


def test_heterogeneous_memory_gets_fewer_layers_on_small_cards(shape_of):
    shape = shape_of("qwen3_5_27b_like")
    opts = PlanOptions(gpu_mem_gib=(24.0, 24.0, 16.0, 16.0))
    plan, default = plan_partition(shape, 1, 4, opts), evaluate_default(shape, 1, 4, opts)
    assert default.capacity == 0, f"even split fits? {default.partition}: {default.capacity}"
    assert plan.capacity > 0, f"plan {plan.partition} holds no KV"
    assert max(plan.weight_gib[2:]) < min(plan.weight_gib[:2]), f"weights per stage {plan.weight_gib}"


def test_memory_unknown_balances_layers_then_time(shape_of):
    assert plan_partition(shape_of("smollm2_135m"), 1, 3).partition == (10, 10, 10)
    plan = plan_partition(shape_of("qwen3_32b"), 1, 3)
    assert max(plan.partition) == 22 and plan.partition[-1] == min(plan.partition), plan.partition
    assert plan.capacity is None and plan.stage_tokens is None


def test_raw_id_layer_pinned_to_first_stage(shape_of):
    shape = shape_of("qwen4_exp_like_ple", engram_layer_ids=[19])
    assert shape.raw_id_layers == (19,)
    opts = PlanOptions(gpu_mem_gib=(80.0,) * 8)
    plan = plan_partition(shape, 2, 4, opts)
    assert plan.partition[0] >= 20 and plan.capacity > 0, plan
    with pytest.raises(PartitionError, match=r"layer 19 reads the raw input ids \(engram n-gram embedding\)"):
        evaluate_partition(shape, 2, default_partition(48, 4), opts)


def test_qwen4_exp_ple_layers_may_sit_on_any_stage(shape_of):
    """qwen4_exp prepares its n-gram PLE batch on every stage from that stage's own input ids (served at PP=3 with
    a PLE layer on stage 1 in tests/hybrid/test_qwen4_exp_parallel.py), so its PLE layers pin nothing."""
    shape = shape_of("qwen4_exp_like_ple", ple_layer_ids=[20, 40])
    assert shape.raw_id_layers == ()
    opts = PlanOptions(gpu_mem_gib=(80.0,) * 8)
    default = evaluate_partition(shape, 2, default_partition(48, 4), opts)
    assert default.capacity > 0
    assert plan_partition(shape, 2, 4, opts).capacity >= default.capacity


def test_every_layer_reading_input_ids_forbids_pp(shape_of):
    shape = shape_of("smollm2_135m", hidden_size_per_layer_input=256, vocab_size_per_layer_input=49152)
    assert len(shape.raw_id_layers) == 30
    with pytest.raises(PartitionError, match="per-layer input embedding"):
        plan_partition(shape, 1, 2)
    assert plan_partition(shape, 1, 1).partition == (30,)


def test_tp_rules_follow_sglang_head_sharding(shape_of):
    smol = shape_of("smollm2_135m")
    assert tp_problems(smol, 3) == [] and tp_problems(smol, 1) == []
    assert any("attention heads" in p for p in tp_problems(smol, 2))
    # 3 KV heads replicated twice would be fine; the 9 query heads are not
    assert tp_problems(smol, 6) == ["9 attention heads not divisible by tp 6"], tp_problems(smol, 6)
    assert any("KV heads" in p for p in tp_problems(shape_of("qwen3_32b"), 12))
    qwen = shape_of("qwen3_32b")
    assert tp_problems(qwen, 16) == [], tp_problems(qwen, 16)  # 8 KV heads replicated twice
    opts = PlanOptions(gpu_mem_gib=(80.0,) * 16)
    per_gpu_8 = plan_partition(qwen, 8, 2, opts).kv_bytes_per_token_layer
    per_gpu_16 = plan_partition(qwen, 16, 1, opts).kv_bytes_per_token_layer
    assert per_gpu_8 == per_gpu_16 == 512, (per_gpu_8, per_gpu_16)


def test_kv_cache_dtype_changes_capacity(shape_of):
    shape = shape_of("qwen3_32b")
    mem = (24.0,) * 6
    bf16 = plan_partition(shape, 2, 3, PlanOptions(gpu_mem_gib=mem))
    fp8 = plan_partition(shape, 2, 3, PlanOptions(gpu_mem_gib=mem, kv_cache_dtype="fp8_e4m3"))
    ratio = fp8.capacity / bf16.capacity
    assert 1.99 < ratio < 2.01, f"fp8 / bf16 capacity {ratio:.4f}"


def test_kv_cache_dtype_from_kvformats(shape_of):
    from sglang_ext.kvformats import FORMAT_NAMES, get_format

    shape = shape_of("qwen3_32b")
    for name in FORMAT_NAMES:
        plan = plan_partition(shape, 2, 3, PlanOptions(gpu_mem_gib=(24.0,) * 6, kv_cache_dtype=name))
        expected = 4 * get_format(name, 128, 128).bytes_per_token_head  # 8 KV heads over tp 2
        assert plan.kv_bytes_per_token_layer == expected, f"{name}: {plan.kv_bytes_per_token_layer} vs {expected}"
    with pytest.raises(ValueError, match="unknown --kv-cache-dtype 'int3'"):
        plan_partition(shape, 2, 3, PlanOptions(gpu_mem_gib=(24.0,) * 6, kv_cache_dtype="int3"))


def test_shape_is_plain_data():
    config = {"num_hidden_layers": 2, "hidden_size": 64, "vocab_size": 100, "num_attention_heads": 4}
    shape = ModelShape.from_config(config)
    assert shape.num_kv_heads == 4 and shape.head_dim == 16 and shape.lm_head_bytes == 128 * 64 * 2


def test_recurrent_state_bytes_follow_sglang_state_shape(shape_of):
    # SGLang's GDN state per request and linear layer (configs/qwen3_next.py -> Mamba2StateShape.create at tp 1):
    # temporal (nv, dv, dk) in float32, conv (2*nk*dk + nv*dv, conv - 1) in bf16 (SGLANG_MAMBA_CONV_DTYPE default).
    from sglang.srt.configs.mamba_utils import Mamba2StateShape

    shape = shape_of("qwen3_5_27b_like")
    from pp_configs import load_config

    cfg = load_config("qwen3_5_27b_like").get("text_config")
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    state = Mamba2StateShape.create(tp_world_size=1, intermediate_size=dv * nv, n_groups=nk, num_heads=nv,
                                    head_dim=dv, state_size=dk, conv_kernel=cfg["linear_conv_kernel_dim"])
    expected = math.prod(state.temporal) * 4 + sum(math.prod(c) for c in state.conv) * 2
    assert shape.linear_state_bytes == expected, (shape.linear_state_bytes, expected)
    assert shape.layer_has_state == tuple(not kv for kv in shape.layer_has_kv)
    assert not any(shape_of("smollm2_135m").layer_has_state)


def test_fixed_mamba_pool_is_priced_at_the_fullest_stage(shape_of):
    # --max-mamba-cache-size K: every rank's budget loses (K + 1) x state x the most linear layers any stage has.
    shape = shape_of("qwen3_5_27b_like")
    opts = PlanOptions(gpu_mem_gib=(40.0,) * 2, reserve_gib=1.0, max_mamba_cache_size=64)
    even, skewed = evaluate_partition(shape, 1, (32, 32), opts), evaluate_partition(shape, 1, (28, 36), opts)
    assert even.state_layers == (24, 24) and skewed.state_layers == (21, 27), (even.state_layers, skewed.state_layers)
    free = min(40.0 - CUDA_CONTEXT_GIB - w for w in skewed.weight_gib) * GIB
    budget = free - 1.0 * GIB - 65 * shape.linear_state_bytes * 27
    assert skewed.capacity == int(budget // (skewed.kv_bytes_per_token_layer * max(skewed.kv_layers)))
    assert skewed.mamba_slots == even.mamba_slots == 64


def test_ratio_mamba_pool_slots_fall_with_the_fullest_stage(shape_of):
    # Default (mamba_full_memory_ratio r): KV gets 1 / (1 + r) of the budget whatever the split, the state pool
    # r / (1 + r), divided by the fullest stage's linear layers.
    shape = shape_of("qwen3_5_27b_like")
    opts = PlanOptions(gpu_mem_gib=(40.0,) * 2, reserve_gib=1.0)
    even, skewed = evaluate_partition(shape, 1, (32, 32), opts), evaluate_partition(shape, 1, (28, 36), opts)
    free = min(40.0 - CUDA_CONTEXT_GIB - w for w in even.weight_gib) * GIB
    per_slot = shape.linear_state_bytes * 24
    assert even.mamba_slots == int(((free - GIB) * 0.9 / 1.9 - per_slot) // per_slot), even.mamba_slots
    assert skewed.mamba_slots < even.mamba_slots


@pytest.mark.parametrize("max_mamba", [None, 200])
def test_hybrid_plan_is_optimal_against_brute_force(shape_of, max_mamba):
    shape = shape_of("qwen3_5_27b_like", num_hidden_layers=24, layer_types=None)
    opts = PlanOptions(gpu_mem_gib=(14.0, 16.0, 13.0), reserve_gib=0.5, max_mamba_cache_size=max_mamba)
    plan = plan_partition(shape, 1, 3, opts)
    best_cap, floor_cap, fastest = _brute_force(shape, 1, 3, opts)
    assert floor_cap <= plan.capacity <= best_cap, f"plan {plan.partition}: {plan.capacity} tokens, best {best_cap}"
    assert plan.bottleneck_ms <= fastest + 1e-9, f"plan {plan.partition}: {plan.bottleneck_ms} ms, fastest {fastest} ms"


def test_offloaded_ple_tables_are_not_counted(model_dir):
    """qwen4_exp's n-gram tables count on their layer's GPU unless they stay in host memory or on SSD
    (--ple-offload-embedding / --ple-offload-backend ssd): with them a real checkpoint's table (tens of GB)
    would otherwise decide the split."""
    from safetensors import safe_open

    from sglang_ext.models.tiny import prepare_tiny
    from sglang_ext.pp.loading import load_shape

    folder = prepare_tiny("qwen4_exp")
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        table = [f.get_slice(n) for n in f.keys() if ".ngram_embedding.shard_" in n]
        table_bytes = sum(s.get_shape()[0] * s.get_shape()[1] * 2 for s in table)  # bf16
    on_gpu, offloaded = load_shape(folder), load_shape(folder, ple_offloaded=True)
    assert table_bytes > 0
    assert on_gpu.layer_weight_bytes[0] - offloaded.layer_weight_bytes[0] == table_bytes
    assert on_gpu.layer_weight_bytes[1:] == offloaded.layer_weight_bytes[1:]
