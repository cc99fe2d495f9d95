"""Torch implementations of SGLang 0.5.23's Gated DeltaNet ops (core: no SGLang import).

Each function takes the arguments of the SGLang function it stands in for, with the same shapes, the same
in-place writes to the state pools and the same handling of `cu_seqlens` / cache indices (a negative slot index
is padding: its state is neither read nor written). Arithmetic is float32 (float64 when the inputs are float64),
the outputs are in the inputs' dtype and states are stored in the pool's dtype. Options SGLang's kernels have
that these ops do not implement raise `UnsupportedGdnOption` with one line naming them.

    gated_delta_rule.chunk_gated_delta_rule           extend (prefill) over varlen sequences
    recurrent.fused_sigmoid_gating_delta_rule_update  decode and target verify (chain and tree drafts)
    recurrent.fused_recurrent_gated_delta_rule_packed_decode
    causal_conv1d.causal_conv1d_fn / causal_conv1d_update
    gating.fused_gdn_gating
    gated_rmsnorm.rms_norm_gated / gated_rmsnorm.fused_sigmoid_mul
    qkvzba_split.fused_qkvzba_split_reshape_cat(_contiguous)
    shared_expert_gate.fused_gate_sigmoid_mul(_add)     the gated shared expert of Qwen MoE layers
"""

from sglang_ext.hybrid.ops.errors import UnsupportedGdnOption

__all__ = ["UnsupportedGdnOption"]
