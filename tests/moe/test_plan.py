"""`python -m sglang_ext.moe plan`: K is the largest count that fits next to the KV pool, moves the right way with
memory and context, refuses below top-k, and the decode model follows its formula."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_ext.moe.plan import GIB, PlanError, plan_paged_experts
from sglang_ext.pp.model_shape import ModelShape

CONFIG = Path(__file__).parent / "configs" / "qwen3_5_122b_a10b_w4a16.json"


@pytest.fixture(scope="module")
def model():
    config = json.loads(CONFIG.read_text())
    return config, ModelShape.from_config(config, name="q122")


def test_expert_bytes_from_config(model):
    config, shape = model
    plan = plan_paged_experts(config, shape, gpus=2, gpu_mem_gib=24, tp=2)
    # W4A16, group 128: 4 bits + one 16-bit scale per 128 weights; gate, up and down of 3072 x 1024
    assert plan.expert_bytes == 3 * 3072 * 1024 * (0.5 + 2 / 128)


@pytest.mark.parametrize("gpus,mem,tp", [(2, 24, 2), (4, 24, 2), (2, 32, 2), (2, 48, 1)])
def test_k_is_the_largest_that_fits(model, gpus, mem, tp):
    config, shape = model
    plan = plan_paged_experts(config, shape, gpus=gpus, gpu_mem_gib=mem, tp=tp)
    for free, layers in zip(plan.stage_free_gib, plan.stage_moe_layers):
        per_k = layers * plan.expert_bytes / tp / GIB
        assert plan.num_resident * per_k <= free
    if plan.num_resident < plan.num_experts:
        assert any((plan.num_resident + 1) * n * plan.expert_bytes / tp / GIB > f
                   for f, n in zip(plan.stage_free_gib, plan.stage_moe_layers))


def test_k_moves_with_memory_and_context(model):
    config, shape = model
    k = lambda **kw: plan_paged_experts(config, shape, **{"gpus": 2, "tp": 2, "gpu_mem_gib": 24, **kw}).num_resident
    assert k(gpu_mem_gib=20) < k() < k(gpu_mem_gib=32)
    assert k(context_tokens=262144) < k(context_tokens=8192)
    assert k(kv_cache_dtype="fp8_e4m3", context_tokens=262144) > k(context_tokens=262144)


def test_refuses_below_top_k(model):
    config, shape = model
    with pytest.raises(PlanError, match="at least top-k = 8"):
        plan_paged_experts(config, shape, gpus=1, gpu_mem_gib=12, tp=1)


def test_decode_model(model):
    config, shape = model
    plan = plan_paged_experts(config, shape, gpus=2, gpu_mem_gib=24, tp=2)
    speeds = [plan.decode_tokens_per_s(shape, h, 936.0, 25.0) for h in (0.5, 0.9, 1.0)]
    assert speeds == sorted(speeds)
    # at hit rate 1 only GPU reads remain: a host link 10x faster changes nothing
    assert plan.decode_tokens_per_s(shape, 1.0, 936.0, 250.0) == pytest.approx(speeds[-1])
    # at hit rate 0 each token copies top_k experts per MoE layer per rank over the host link
    t0 = 1 / plan.decode_tokens_per_s(shape, 0.0, 936.0, 25.0) - 1 / speeds[-1]
    assert t0 == pytest.approx(48 * 8 * plan.expert_bytes / 2 / 25e9, rel=1e-9)


def test_cli_prints_the_flag():
    out = subprocess.run([sys.executable, "-m", "sglang_ext.moe", "plan", "--model-path", str(CONFIG), "--gpus", "2",
                          "--gpu-mem", "24"], capture_output=True, text=True, check=True).stdout
    assert "--enable-paged-experts --paged-experts-num-resident " in out
    bad = subprocess.run([sys.executable, "-m", "sglang_ext.moe", "plan", "--model-path", str(CONFIG), "--gpus", "1",
                          "--gpu-mem", "12"], capture_output=True, text=True, check=False)
    assert bad.returncode == 1 and "at least top-k" in bad.stderr
