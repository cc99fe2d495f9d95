"""SGLang's own Triton kernels on the portable_gpu served paths, built ahead of time for sm_80 and gfx1100 by
`python -m sglang_ext.kernels.targets --group sglang` (platform/sglang_triton_targets.py), on a representative
subset: GQA decode and extend attention (with the speculative verify's mask), fused MoE (and its paged-experts path),
the GDN conv1d and packed-decode kernels and the Qwen3.5 layer ops. The full run (every kernel x 4 targets) is run by hand; its table
is in docs/portable-gpu.md.

Runs in subprocesses: the conftest sets TRITON_INTERPRET=1, under which Triton's JIT functions are interpreted
and cannot be compiled for a target.
"""

import json
import os
import subprocess
import sys

_ENV = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
_SUBSET = ("q32 kv8 d128 page1 ", "fused_moe up decode", "gdn conv1d prefill", "gdn conv1d decode", "gdn packed decode",
           "qwen3_5", "paged_experts up decode", "paged_experts top-k sum")


def _command(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sglang_ext.kernels.targets", "--group", "sglang", *args],
                          env=_ENV, capture_output=True, text=True, timeout=timeout, check=False)


def _rows(stdout: str) -> dict:
    """{(target, label): first word of the status} of the command's table."""
    rows = {}
    for line in stdout.splitlines():
        for target in ("cuda:80", "hip:gfx1100"):
            label, sep, rest = line.partition(f" {target} ")
            if sep and label.startswith("sglang "):
                rows[(target, label.strip())] = rest.split()[0]
    return rows


def test_sglang_kernels_compile_for_sm80_and_gfx1100_and_are_listed():
    only = [a for s in _SUBSET for a in ("--only", s)]
    out = _command("--target", "cuda:80", "--target", "hip:gfx1100", *only)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    rows = _rows(out.stdout)
    expected = {
        "sglang decode q32 kv8 d128 page1 _fwd_grouped_kernel_stage1",  # GQA stage 1
        "sglang decode q32 kv8 d128 page1 _fwd_kernel_stage2",
        "sglang extend q32 kv8 d128 page1 _fwd_kernel",
        "sglang extend q32 kv8 d128 page1 verify-mask _fwd_kernel",
        "sglang fused_moe up decode E128 top8 2048x768 fused_moe_kernel",
        "sglang gdn conv1d prefill hk16 hv32 d128 _causal_conv1d_fwd_kernel",
        "sglang gdn conv1d decode hk16 hv32 d128 _causal_conv1d_update_kernel",
        "sglang gdn packed decode hk16 hv32 d128 fused_recurrent_gated_delta_rule_packed_decode_kernel",
        "sglang qwen3_5 output-gate q16 d256 _fused_sigmoid_mul_kernel",
        "sglang qwen3_5 gdn split hk16 hv32 d128 fused_qkvzba_split_reshape_cat_contiguous_kernel",
        "sglang qwen3_5 gdn gated-rmsnorm d128 _layer_norm_fwd_1pass_kernel",
    }
    # the q/k norm of Qwen3.5's gated attention: with RoPE fused on CUDA, without on ROCm (RoPE is torch there); the
    # Lean decode SGLang runs for long contexts on ROCm
    # paged experts: the fused MoE GEMM over the K-slot table (masked entries, no_combine) is the unpaged variant
    # (built once, not listed again); its top-k sum is a kernel of its own (Triton at decode on CUDA, at prefill on
    # ROCm)
    only_on = {"cuda:80": {"sglang qwen3_5 qk-norm-rope-gate q16 kv2 d256 rotary64 _fused_qk_rmsnorm_rope_gate_kernel",
                           "sglang paged_experts top-k sum decode top8 h2048 _moe_sum_reduce_kernel"},
               "hip:gfx1100": {"sglang qwen3_5 qk-norm-gate q16 kv2 d256 _fused_qk_gemma_rmsnorm_gate_kernel",
                               "sglang decode lean q32 kv8 d128 page1 _lean_attention_decode_kernel",
                               "sglang paged_experts top-k sum prefill top8 h2048 _moe_sum_reduce_kernel"}}
    for target in ("cuda:80", "hip:gfx1100"):
        built = {label for (t, label), status in rows.items() if t == target and status == "ok"}
        assert built == expected | only_on[target], f"{target}: {sorted(built ^ (expected | only_on[target]))}"
        n = len(expected | only_on[target])
        assert f"sglang {target}: {n} compiled, 0 failed" in out.stdout, out.stdout
    assert rows[("hip:gfx1100", "sglang qwen3_5 qk-norm-rope-gate q16 kv2 d256 rotary64")] == "skipped"
    assert rows[("cuda:80", "sglang qwen3_5 qk-norm-gate q16 kv2 d256")] == "skipped"
    assert rows[("cuda:80", "sglang paged_experts top-k sum prefill top8 h2048")] == "skipped"
    assert not any("paged_experts up decode" in label for _, label in rows), "the unpaged GEMM variant built twice"
    assert "FAIL" not in out.stdout


def test_launches_take_sglangs_per_device_parameters():
    """What is built is what SGLang launches on that device: its extend block table per architecture, the HIP-only
    compile options, programmatic dependent launch from sm_90 on. Every launcher named in compat exists."""
    script = (
        "import importlib, json\n"
        "from sglang_ext import compat\n"
        "from sglang_ext.platform import sglang_triton_targets as t\n"
        "for dotted in compat.SGLANG_TRITON_LAUNCHERS.values():\n"
        "    module, _, attr = dotted.rpartition('.')\n"
        "    getattr(importlib.import_module(module), attr)\n"
        "out = {}\n"
        "for target in ('cuda:80', 'cuda:86', 'cuda:90', 'hip:gfx1100'):\n"
        "    ext = t.recorded_launches(target, 'extend q32 kv8 d128 page1')[0].kwargs\n"
        "    moe = t.recorded_launches(target, 'fused_moe up decode E128 top8 2048x768')[0].kwargs\n"
        "    out[target] = [ext['BLOCK_M'], ext['BLOCK_N'], ext['num_warps'], ext.get('waves_per_eu'),\n"
        "                   moe.get('launch_pdl', False)]\n"
        "print(json.dumps(out))\n")
    out = subprocess.run([sys.executable, "-c", script], env=_ENV, capture_output=True, text=True, timeout=300,
                         check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    # extend_attention._get_block_sizes_for_extend_attention at head_dim 128; fused_moe's PDL launch on sm_90
    assert got == {"cuda:80": [128, 128, 8, None, False], "cuda:86": [64, 128, 8, None, False],
                   "cuda:90": [128, 64, 8, None, True], "hip:gfx1100": [64, 64, 4, 1, False]}, got
