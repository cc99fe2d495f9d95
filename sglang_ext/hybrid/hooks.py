"""Installs the torch GDN ops (`sglang_ext.hybrid.ops`) into SGLang on the portable CPU platform; elsewhere only the
QSA K/V packers for compressed KV (`register_gpu`).

Every Triton kernel SGLang's Gated DeltaNet path calls there (`compat.GDN_KERNEL_TARGETS`) is replaced through
HookRegistry (REPLACE), which also rebinds the `from X import Y` copies its importers hold. On a GPU nothing of the
GDN path is installed: SGLang's own kernels run. `hook_check` verifies after start-up that every target was
applied, so a server never runs a hybrid model half on Triton-on-CPU.
"""

from sglang_ext import compat, hook_chain
from sglang_ext.hybrid.ops import (
    causal_conv1d,
    gated_delta_rule,
    gated_rmsnorm,
    gating,
    qkvzba_split,
    recurrent,
    shared_expert_gate,
    state_scatter,
    state_track,
)
from sglang_ext.hybrid.ops.errors import UnsupportedGdnOption
from sglang_ext.hybrid.ops.qsa_sparse import gather_compressed_keys, ragged_topk, sparse_gqa_attention
from sglang_ext.hybrid.qsa import (
    qsa_forward_extend,
    qsa_indexer_forward_native,
    qsa_indexer_host_backup,
    qsa_indexer_host_load,
    qsa_kv_extraction,
    qsa_pack_prefill_kv,
    qsa_pool_kv_read,
)
from sglang_ext.platform import cpu_platform_active

_registered = False


def layernorm_fn(x, weight, bias, z=None, eps=1e-6, group_size=None, norm_before_gate=True, is_rms_norm=False,
                 activation: str = "swish"):
    """SGLang's `fla.layernorm_gated.layernorm_fn`, RMS variant only (what the GDN output norm uses)."""
    if not is_rms_norm:
        raise UnsupportedGdnOption("layernorm_fn: only is_rms_norm=True (gated RMSNorm) has a torch op")
    return gated_rmsnorm.rms_norm_gated(x, weight, bias, z=z, eps=eps, group_size=group_size,
                                        norm_before_gate=norm_before_gate, activation=activation)


TORCH_OPS = {
    "chunk_gated_delta_rule": gated_delta_rule.chunk_gated_delta_rule,
    "fused_sigmoid_gating_delta_rule_update": recurrent.fused_sigmoid_gating_delta_rule_update,
    "fused_recurrent_gated_delta_rule_packed_decode": recurrent.fused_recurrent_gated_delta_rule_packed_decode,
    "causal_conv1d_fn": causal_conv1d.causal_conv1d_fn,
    "causal_conv1d_update": causal_conv1d.causal_conv1d_update,
    "fused_gdn_gating": gating.fused_gdn_gating,
    "fused_qkvzba_split_reshape_cat": qkvzba_split.fused_qkvzba_split_reshape_cat,
    "fused_qkvzba_split_reshape_cat_contiguous": qkvzba_split.fused_qkvzba_split_reshape_cat_contiguous,
    "fused_sigmoid_mul": gated_rmsnorm.fused_sigmoid_mul,
    "layernorm_fn": layernorm_fn,
    "fused_gate_sigmoid_mul": shared_expert_gate.fused_gate_sigmoid_mul,
    "fused_gate_sigmoid_mul_add": shared_expert_gate.fused_gate_sigmoid_mul_add,
    "fused_mamba_state_scatter_with_mask": state_scatter.fused_mamba_state_scatter_with_mask,
    "fused_conv_window_scatter_with_mask": state_scatter.fused_conv_window_scatter_with_mask,
    "fused_conv_window_scatter_multi": state_scatter.fused_conv_window_scatter_multi,
    "track_mamba_states_if_needed": state_track.track_mamba_states_if_needed,
    "track_mamba_states_all_layers": state_track.track_mamba_states_all_layers,
}

# qwen4_exp's QSA path (compat.QSA_KERNEL_TARGETS)
QSA_TORCH_OPS = {"gather_qsa_compressed_keys": gather_compressed_keys, "qsa_fast_topk": ragged_topk,
                 "qsa_sparse_attention": sparse_gqa_attention}


def register_gpu() -> list[str]:
    """Off the CPU platform: qwen4_exp's QSA sparse attention reads a compressed (int8) pool through format-aware
    K/V packers (hybrid/qsa.py); each hook passes dense pools through to SGLang unchanged."""
    for target in compat.QSA_POOL_KV_READS:
        hook_chain.register(target, qsa_pool_kv_read, compat.HookType.AROUND)
    hook_chain.register(compat.QSA_GPU_KV_PACKERS["qwen_sparse_kv_extraction_compact_triton"], qsa_kv_extraction,
                        compat.HookType.AROUND)
    hook_chain.register(compat.QSA_GPU_KV_PACKERS["pack_qsa_prefill_kv"], qsa_pack_prefill_kv,
                        compat.HookType.AROUND)
    hook_chain.register(compat.QSA_BACKEND_FORWARD_EXTEND, qsa_forward_extend, compat.HookType.AROUND)
    return ["qwen4_exp QSA K/V packers for compressed KV (gpu)"]


def register() -> list[str]:
    global _registered
    if _registered:
        return []
    _registered = True
    if not cpu_platform_active():
        return register_gpu()
    missing = set(compat.GDN_KERNEL_TARGETS) ^ set(TORCH_OPS)
    if missing:
        raise RuntimeError(f"sglang_ext.hybrid: targets and torch ops differ: {sorted(missing)}")
    for name, target in compat.GDN_KERNEL_TARGETS.items():
        hook_chain.register(target, TORCH_OPS[name], compat.HookType.REPLACE)
    hook_chain.register(compat.QSA_INDEXER_FORWARD_NATIVE, qsa_indexer_forward_native, compat.HookType.REPLACE)
    for name, target in compat.QSA_KERNEL_TARGETS.items():
        hook_chain.register(target, QSA_TORCH_OPS[name], compat.HookType.REPLACE)
    for target in compat.QSA_POOL_KV_READS:
        hook_chain.register(target, qsa_pool_kv_read, compat.HookType.AROUND)
    hook_chain.register(compat.QSA_INDEXER_HOST_BACKUP, qsa_indexer_host_backup, compat.HookType.REPLACE)
    hook_chain.register(compat.QSA_INDEXER_HOST_LOAD, qsa_indexer_host_load, compat.HookType.REPLACE)
    return ["hybrid GDN ops (torch) on the cpu platform"]
