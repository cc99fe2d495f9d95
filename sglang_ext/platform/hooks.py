"""Hooks that make SGLang's own code paths work on the portable CPU and GPU platforms (installed from the plugin).

They are registered only when one of those platforms is the one that activates in this process, so on a host
SGLang serves by itself nothing here touches SGLang.
"""

import importlib.util
import sys
import types

from sglang_ext import compat, hook_chain
from sglang_ext.platform import batch_invariant, cpu_platform_active, gpu_platform_active
from sglang_ext.platform.explicit_head_dim import keep_explicit_head_dim
from sglang_ext.platform.host_pool import host_pool_cls_for
from sglang_ext.platform.mamba_snapshots import prepare_for_decode
from sglang_ext.platform.memory import HICACHE_HOST_RESERVE_BYTES
from sglang_ext.platform.prefix_attention import run_sdpa_forward_extend
from sglang_ext.platform.seeded_sampling import murmur_hash32


def register() -> list[str]:
    if gpu_platform_active():
        return register_gpu()
    if not cpu_platform_active():
        return []
    hook_chain.register(compat.HOOK_GET_MHA_HOST_POOL_CLS, host_pool_cls_for, compat.HookType.AROUND)
    compat.set_hicache_host_memory_reserve(HICACHE_HOST_RESERVE_BYTES)
    hook_chain.register(compat.HOOK_TORCH_NATIVE_SDPA_EXTEND, run_sdpa_forward_extend, compat.HookType.AROUND)
    hook_chain.register(compat.HOOK_MURMUR_HASH32, murmur_hash32, compat.HookType.REPLACE)
    hook_chain.register(compat.HOOK_QWEN2_DECODER_LAYER_INIT, keep_explicit_head_dim, compat.HookType.AROUND)
    hook_chain.register(compat.HOOK_SCHEDULE_BATCH_PREPARE_FOR_DECODE, prepare_for_decode, compat.HookType.AROUND)
    registered = ["platform portable_cpu", "cpu hicache host pool (layer_first, page_first, page_first_direct)",
                  "torch_native extend over a cached prefix attends the new rows only",
                  "per-request sampling_seed (MurmurHash3 in torch)", "explicit head_dim of Qwen2-layer models",
                  "Mamba radix cache extra_buffer (recurrent-state snapshots)"]
    # --enable-deterministic-inference (batch_invariant.py). The per-step hooks are installed only in the processes
    # of a server started with the flag (the launcher exports it), so the default path runs no extra code.
    compat.add_deterministic_attention_backend_choices(["torch_native"])
    hook_chain.register(compat.HOOK_SERVER_ARGS_FROM_CLI_ARGS, batch_invariant.export_flag,
                        compat.HookType.AFTER)
    hook_chain.register(compat.HOOK_ENABLE_BATCH_INVARIANT_MODE, batch_invariant.enable_for_runner,
                        compat.HookType.REPLACE)
    if batch_invariant.hooks_wanted():
        hook_chain.register(compat.HOOK_MODEL_RUNNER_FORWARD, batch_invariant.model_runner_forward,
                            compat.HookType.AROUND)
        hook_chain.register(compat.HOOK_UNQUANTIZED_LINEAR_APPLY, batch_invariant.linear_apply,
                            compat.HookType.AROUND)
        hook_chain.register(compat.HOOK_LOGITS_COMPUTE_LM_HEAD, batch_invariant.compute_lm_head,
                            compat.HookType.AROUND)
        registered.append("batch-invariant mode (--enable-deterministic-inference)")
    return registered


def register_gpu() -> list[str]:
    hook_chain.register(compat.HOOK_DUAL_GEMM_SELECT_MODE, unfused_gate_up, compat.HookType.REPLACE)
    registered = ["platform portable_gpu", "MLP gate/up without the CuTe DSL dual GEMM"]
    if importlib.util.find_spec("flash_mla") is None:
        sys.modules[compat.FLASHMLA_BACKEND_MODULE] = flashmla_backend_refusal()
        registered.append("FlashMLA absent (its backend refuses)")
    return registered


def flashmla_backend_refusal() -> types.ModuleType:
    """What SGLang imports as its FlashMLA backend module where the `flash_mla` package is absent. Its EAGLE worker
    imports that module on any CUDA device only to test `isinstance(backend, FlashMLABackend)` when it captures the
    draft-extend CUDA graphs (NEXTN stopped at start-up without it); choosing the backend is refused in one line."""
    module = types.ModuleType(compat.FLASHMLA_BACKEND_MODULE)

    def refuse(self, *args, **kwargs):
        raise RuntimeError("the flashmla attention backend needs the flash_mla package (pip install sgl-flash-mla, "
                           "CUDA sm_90/sm_100 only); use --attention-backend triton")

    module.__dict__[compat.FLASHMLA_BACKEND_CLASS] = type(compat.FLASHMLA_BACKEND_CLASS, (), {"__init__": refuse})
    return module


def unfused_gate_up(self, gate_up_proj, hidden_size):
    """DualGemm's mode on the portable GPU platform: None, the separate gate/up GEMM and activation. SGLang picks its
    CuTe DSL dual GEMM on any CUDA device, which imports nvidia-cutlass-dsl (CUDA only, not a dependency here):
    Qwen2-layer models stopped while building their first MLP."""
