"""The portable GPU platform (platform/gpu.py, kernel_guard.py, gpu_ops.py) on a CPU.

Selection runs `chosen_platform()` with torch's device queries faked (availability, ROCm architecture). The two
process cases run `portable_gpu_process.py` in its own interpreter (it fakes torch's device queries for the whole
process and makes flashinfer / DeepGEMM absent): SGLang resolves our platform, imports the served modules and
resolves server arguments there. The ops served for sgl_kernel's names are checked against float64 references at
the served models' shapes.
"""

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from sglang_ext import env
from sglang_ext.models.tiny import prepare_tiny
from sglang_ext.platform import (
    GPU_PLATFORM_NAME,
    PLATFORM_NAME,
    SGL_KERNEL_ROCM_ARCHS,
    chosen_platform,
    gpu_ops,
    kernel_guard,
)

SCRIPT = Path(__file__).with_name("portable_gpu_process.py")
NO_GPU, CUDA = None, "cuda"


def _fake_devices(monkeypatch, gpu: str | None):
    """gpu: None (no device), "cuda", or a ROCm gfx architecture ("gfx1100")."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu is not None)
    monkeypatch.setattr(torch.version, "hip", "6.4.0" if gpu not in (None, CUDA) else None)
    props = types.SimpleNamespace(gcnArchName=f"{gpu}:sramecc-:xnack-")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    if getattr(torch, "xpu", None) is not None:
        monkeypatch.setattr(torch.xpu, "is_available", lambda: False)


@pytest.mark.parametrize("gpu,environ,expected", [
    (NO_GPU, {}, PLATFORM_NAME),
    (CUDA, {}, None),  # SGLang's own CUDA platform
    ("gfx942", {}, None),  # MI300X: sgl-kernel is built for it
    ("gfx950", {}, None),
    ("gfx1100", {}, GPU_PLATFORM_NAME),  # RX 7900 XTX: chosen without being asked
    ("gfx1201", {}, GPU_PLATFORM_NAME),
    (CUDA, {env.PLATFORM_CHOICE: GPU_PLATFORM_NAME}, GPU_PLATFORM_NAME),
    ("gfx942", {env.PLATFORM_CHOICE: GPU_PLATFORM_NAME}, GPU_PLATFORM_NAME),
    ("gfx1100", {env.PLATFORM_CHOICE: PLATFORM_NAME}, PLATFORM_NAME),
    (CUDA, {env.SGLANG_PLATFORM: PLATFORM_NAME}, PLATFORM_NAME),
    (CUDA, {env.SGLANG_PLATFORM: PLATFORM_NAME, env.PLATFORM_CHOICE: GPU_PLATFORM_NAME}, GPU_PLATFORM_NAME),
    (NO_GPU, {"SGLANG_USE_CPU_ENGINE": "1"}, None),
])
def test_selection(monkeypatch, gpu, environ, expected):
    for name in (env.PLATFORM_CHOICE, env.SGLANG_PLATFORM, "SGLANG_USE_CPU_ENGINE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    _fake_devices(monkeypatch, gpu)
    assert chosen_platform() == expected
    assert "gfx1100" not in SGL_KERNEL_ROCM_ARCHS


def test_selection_refusals(monkeypatch):
    _fake_devices(monkeypatch, NO_GPU)
    monkeypatch.setenv(env.PLATFORM_CHOICE, GPU_PLATFORM_NAME)
    with pytest.raises(RuntimeError, match="SGLANG_EXT_PLATFORM=portable_gpu: torch sees no CUDA or ROCm GPU"):
        chosen_platform()
    monkeypatch.setenv(env.PLATFORM_CHOICE, "portable_tpu")
    with pytest.raises(ValueError, match="use portable_cpu or portable_gpu"):
        chosen_platform()


def _run_process(device: str, model_dir: str, environ: dict, hybrid: str | None = None) -> dict:
    run_env = {**os.environ, **environ}
    for name in (env.SGLANG_PLATFORM, *kernel_guard.LIBRARY_SWITCHES):
        run_env.pop(name, None)
    done = subprocess.run([sys.executable, str(SCRIPT), device, model_dir, *([hybrid] if hybrid else [])], check=False, env=run_env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-6000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("device,environ", [
    ("cuda", {env.PLATFORM_CHOICE: GPU_PLATFORM_NAME}),  # an H200, asked for
    ("hip", {}),  # an RX 7900 XTX (gfx1100): chosen by itself
])
def test_sglang_process_on_the_platform(model_dir, device, environ):
    result = _run_process(device, model_dir, environ, hybrid=str(prepare_tiny("qwen3_5")))
    assert result["platform"] == "PortableGpuPlatform" and result["out_of_tree"]
    assert result["defaults"] == {
        "device": "cuda", "attention_backend": "triton", "sampling_backend": "pytorch",
        "moe_runner_backend": "triton", "speculative_draft_attention_backend": "triton",
        "disable_cuda_graph": False, "disable_custom_all_reduce": True,
        "graphs": ["full", "disabled"],  # decode graphs on; prefill's "breakable" needs sgl_kernel.weak_ref_tensor
    }
    assert result["user_choice_kept"] is True  # --disable-cuda-graph stays the user's
    assert result["user_prefill_graphs"] == ["full", "breakable"]  # so does an explicit prefill backend
    # sgl_kernel is installed here, yet the process never loads it; aiter is not installed and still imports
    assert result["sgl_kernel"] == "GuardedModule" and result["aiter"] == "GuardedModule"
    assert result["silu_and_mul"] == "sglang_ext.platform.gpu_ops.silu_and_mul"
    assert result["failed_imports"] == {}
    # Qwen2-layer MLPs: SGLang's CuTe DSL dual GEMM (nvidia-cutlass-dsl) stays off, the platform's hook says None
    assert result["dual_gemm_mode"] == "None"
    # NEXTN: the EAGLE worker imports SGLang's FlashMLA backend module when it captures its draft-extend graphs, and
    # that module needs flash_mla (absent here as on a bare GPU; NEXTN stopped at start-up on the H100 without the
    # platform's replacement); choosing that backend is refused in one line
    assert result["flashmla_backend"]["import"] == "ok", result["flashmla_backend"]
    assert "needs the flash_mla package" in result["flashmla_backend"]["construct"]
    # a hybrid with --dtype float32 is refused in the launcher (SGLang's Gated DeltaNet prefill kernel asserts
    # bf16 / fp16 at the first prefill on a GPU)
    assert (result["hybrid_float32"] or "").endswith(
        "has Gated DeltaNet layers, whose GPU prefill kernel takes bfloat16 or float16 only (use --dtype bfloat16)"), \
        result["hybrid_float32"]
    # CUDA graphs: SGLang refuses an out-of-tree platform that names no runner (the first capture stopped with
    # "provides no CUDA graph runner"); these are its own CUDA runners, imported here without sgl_kernel
    assert result["graph_runners"] == {"decode": "DecodeCudaGraphRunner", "draft_decode": "EAGLEDraftCudaGraphRunner",
                                       "draft_extend": "EAGLEDraftExtendCudaGraphRunner"}
    # the launcher's sglang-kernel version check is skipped (asked for 99.0: it would refuse any installed version)
    assert result["sgl_kernel_version_check"] is None
    assert result["unprovided_call"] == ("NotImplementedError: sgl_kernel.kvcacheio.transfer_kv_per_layer "
                                         "is not provided by the portable_gpu platform")
    assert result["flashinfer_backend"] == ("ValueError: --attention-backend flashinfer is not supported on the "
                                            "portable_gpu platform; use triton")
    # a hybrid with SGLang's defaults: the overlap scheduler's Mamba strategy (SGLang asks the platform whether it
    # can snapshot states) and Triton linear-attention kernels (SGLang would pick FlashInfer's GDN prefill on SM90)
    assert result["hybrid"] == {
        "mamba_radix_cache_strategy": "extra_buffer", "disable_overlap_schedule": False,
        "linear_attn_prefill_backend": "triton", "linear_attn_decode_backend": "triton",
        "linear_attn_verify_backend": "triton"}


def test_guarded_module_names():
    module = kernel_guard.GuardedModule("sgl_kernel")
    assert module.silu_and_mul is gpu_ops.silu_and_mul
    assert kernel_guard.GuardedModule("sgl_kernel.utils").is_arch_support_pdl is gpu_ops.is_arch_support_pdl
    # module-level attribute chains import; only a call fails, with one line
    stand_in = kernel_guard.GuardedModule("sgl_kernel.scalar_type").scalar_types.uint4b8
    with pytest.raises(NotImplementedError) as failure:
        stand_in(1)
    assert str(failure.value) == "sgl_kernel.scalar_type.scalar_types.uint4b8 is not provided by the portable_gpu platform"
    with pytest.raises(NotImplementedError, match="^aiter.gemm_a4w4 is not provided by the portable_gpu platform$"):
        kernel_guard.GuardedModule("aiter").gemm_a4w4()


# Served shapes: Llama-3-8B (hidden 4096, intermediate 14336), Qwen3-30B-A3B experts (hidden 2048, moe
# intermediate 768, top-8), SmolLM2-135M (hidden 576, intermediate 1536); a few tokens.
ACT_SHAPES = [(3, 2 * 14336), (5, 2 * 768), (1, 2 * 1536)]
NORM_SHAPES = [(3, 4096), (5, 2048), (2, 576)]


def _reference_act(act, x):
    d = x.shape[-1] // 2
    x64 = x.double()
    return act(x64[..., :d]) * x64[..., d:]


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("shape", ACT_SHAPES)
@pytest.mark.parametrize("op,act", [
    (gpu_ops.silu_and_mul, F.silu),
    (gpu_ops.gelu_and_mul, F.gelu),
    (gpu_ops.gelu_tanh_and_mul, lambda g: F.gelu(g, approximate="tanh")),
])
def test_act_and_mul(op, act, shape, dtype, tol):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype) * 3
    want = _reference_act(act, x)
    got = op(x)
    assert got.dtype == dtype and got.shape == want.shape
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    out = torch.full_like(got, float("nan"))
    assert op(x, out) is out
    torch.testing.assert_close(out, got, rtol=0, atol=0)


def test_act_and_mul_refuses_bad_shapes():
    with pytest.raises(ValueError, match="is not even"):
        gpu_ops.silu_and_mul(torch.ones(2, 7))
    with pytest.raises(ValueError, match=r"out has shape \(2, 3\), expected \(2, 4\)"):
        gpu_ops.silu_and_mul(torch.ones(2, 8), torch.empty(2, 3))


def _reference_rmsnorm(x, weight, eps):
    x64 = x.double()
    return x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("shape", NORM_SHAPES)
def test_rmsnorm_and_fused_add(shape, dtype, tol):
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(shape, generator=gen) * 4).to(dtype)
    residual = torch.randn(shape, generator=gen).to(dtype)
    weight = (1 + 0.1 * torch.randn(shape[-1], generator=gen)).to(dtype)
    eps = 1e-6
    torch.testing.assert_close(gpu_ops.rmsnorm(x, weight, eps).double(), _reference_rmsnorm(x, weight, eps),
                               rtol=tol, atol=tol)
    out = torch.empty_like(x)
    assert gpu_ops.rmsnorm(x, weight, eps, out=out) is out
    # fused_add_rmsnorm: residual += x, x = rmsnorm(residual), both in place
    summed = residual.double() + x.double()
    x_in, res_in = x.clone(), residual.clone()
    assert gpu_ops.fused_add_rmsnorm(x_in, res_in, weight, eps) is None
    torch.testing.assert_close(res_in.double(), summed, rtol=tol, atol=tol)
    torch.testing.assert_close(x_in.double(), _reference_rmsnorm(res_in, weight, eps), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("tokens,topk,hidden,scale", [(3, 8, 2048, 1.0), (4, 2, 576, 2.5), (1, 8, 4096, 1.0)])
def test_moe_sum_reduce(tokens, topk, hidden, scale, dtype, tol):
    x = torch.randn(tokens, topk, hidden, generator=torch.Generator().manual_seed(2)).to(dtype)
    out = torch.full((tokens, hidden), float("nan"), dtype=dtype)
    gpu_ops.moe_sum_reduce(x, out, scale)
    torch.testing.assert_close(out.double(), x.double().sum(1) * scale, rtol=tol, atol=tol)
    with pytest.raises(ValueError, match="must be \\[tokens, topk, hidden\\]"):
        gpu_ops.moe_sum_reduce(x[0], out, scale)


def test_pdl_is_never_asked_for():
    assert gpu_ops.is_arch_support_pdl() is False


def test_sglang_platform_variable_names_entry_points_only(monkeypatch):
    """SGLANG_PLATFORM matches SGLang's entry-point names, and sglang-ext registers one (portable_cpu): asking SGLang
    for portable_gpu by that variable is refused by SGLang itself, with sglang-ext's plugin skipped; the GPU platform
    is chosen with SGLANG_EXT_PLATFORM (test_sglang_process_on_the_platform)."""
    from sglang.srt import platforms, plugins

    monkeypatch.setenv(env.SGLANG_PLATFORM, GPU_PLATFORM_NAME)
    assert "sglang-ext" in plugins._get_excluded_dists()
    with pytest.raises(RuntimeError, match=r"SGLANG_PLATFORM='portable_gpu' not found .*available: 'portable_cpu'"):
        platforms._resolve_platform()
    monkeypatch.setenv(env.SGLANG_PLATFORM, PLATFORM_NAME)
    assert "sglang-ext" not in plugins._get_excluded_dists()


def _reference_align(topk_ids: torch.Tensor, buckets: int, block: int) -> tuple[list[int], list[int]]:
    """moe_align_block_size's contract in plain Python: pairs grouped by bucket (expert id + 1) in index order, each
    bucket padded with `numel` to a block multiple, one expert id (bucket - 1) per block."""
    flat = [int(i) + 1 for i in topk_ids.reshape(-1)]
    sorted_ids, experts = [], []
    for b in range(buckets):
        pairs = [i for i, x in enumerate(flat) if x == b]
        padded = -(-len(pairs) // block) * block
        sorted_ids += pairs + [len(flat)] * (padded - len(pairs))
        experts += [b - 1] * (padded // block)
    return sorted_ids, experts


def _align_buffers(numel: int, experts: int, block: int):
    """The buffers SGLang's moe_align_block_size wrapper allocates (filled with junk to catch unwritten slots)."""
    padded = numel * block if numel < experts + 1 else numel + (experts + 1) * (block - 1)
    padded = (padded + 3) // 4 * 4
    return (torch.full((padded,), -7, dtype=torch.int32), torch.full((-(-padded // block),), -7, dtype=torch.int32),
            torch.full((1,), -7, dtype=torch.int32), torch.full((experts + 2,), -7, dtype=torch.int32))


@pytest.mark.parametrize("tokens,topk,experts,block,filtered", [
    (1, 8, 128, 16, 0.0), (5, 2, 8, 16, 0.3), (300, 8, 64, 64, 0.1), (2048, 8, 128, 128, 0.0)])
def test_moe_align_block_size(tokens, topk, experts, block, filtered):
    g = torch.Generator().manual_seed(tokens)
    ids = torch.randint(0, experts, (tokens, topk), generator=g, dtype=torch.int32)
    ids[torch.rand(ids.shape, generator=g) < filtered] = -1  # expert-parallel filtered pairs
    sorted_ids, expert_ids, total, cumsum = _align_buffers(ids.numel(), experts, block)
    gpu_ops.moe_align_block_size(ids, experts + 1, block, sorted_ids, expert_ids, total, cumsum, True)
    want_sorted, want_experts = _reference_align(ids, experts + 1, block)
    n = int(total[0])
    assert n == len(want_sorted) == int(cumsum[experts + 1])
    assert sorted_ids[:n].tolist() == want_sorted
    assert expert_ids[: n // block].tolist() == want_experts and (expert_ids[n // block:] == -1).all()
    assert (sorted_ids[n:] == ids.numel()).all()
    with pytest.raises(NotImplementedError, match="ignore_invalid_expert=True is not provided by the portable_gpu"):
        gpu_ops.moe_align_block_size(ids, experts + 1, block, sorted_ids, expert_ids, total, cumsum, True, True)


def test_moe_align_block_size_matches_sglang_triton_kernel():
    """SGLang's own single-launch Triton align (its CUDA small-batch path, same contract, same in-bucket order) under
    the interpreter: equal outputs below the padded total."""
    from sglang.kernels.ops.moe.moe_align_small_numel import moe_align_small_numel

    ids = torch.randint(0, 256, (6, 8), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    ids[0, :3] = -1
    ours, theirs = _align_buffers(ids.numel(), 256, 16), _align_buffers(ids.numel(), 256, 16)
    gpu_ops.moe_align_block_size(ids, 257, 16, *ours, True)
    moe_align_small_numel(ids, 257, 16, *theirs[:3])
    n = int(theirs[2][0])
    assert int(ours[2][0]) == n
    assert torch.equal(ours[0][:n], theirs[0][:n]) and torch.equal(ours[1][: n // 16], theirs[1][: n // 16])
