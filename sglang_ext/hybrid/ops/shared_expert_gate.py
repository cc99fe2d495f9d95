"""The gated shared expert of Qwen MoE layers: SGLang's `elementwise.fused_gate_sigmoid_mul(_add)` in torch.

gate = sigmoid(hidden_states @ gate_weight) per token (one scalar), applied to the shared expert's output.
"""

import torch

from sglang_ext.hybrid.ops.gating import compute_dtype


def _gated(hidden_states: torch.Tensor, gate_weight: torch.Tensor, shared_output: torch.Tensor) -> torch.Tensor:
    if hidden_states.shape != shared_output.shape or gate_weight.shape != hidden_states.shape[-1:]:
        raise ValueError(f"shared expert gate: hidden {tuple(hidden_states.shape)}, gate {tuple(gate_weight.shape)}, "
                         f"shared output {tuple(shared_output.shape)} do not match")
    dt = compute_dtype(hidden_states, gate_weight, shared_output)
    gate = torch.sigmoid(hidden_states.to(dt) @ gate_weight.to(dt))
    return gate.unsqueeze(-1) * shared_output.to(dt)


def fused_gate_sigmoid_mul(hidden_states: torch.Tensor, gate_weight: torch.Tensor,
                           shared_output: torch.Tensor) -> torch.Tensor:
    """hidden_states, shared_output: [T, H]; gate_weight: [H]. Returns the gated shared output [T, H] in
    shared_output's dtype."""
    return _gated(hidden_states, gate_weight, shared_output).to(shared_output.dtype)


def fused_gate_sigmoid_mul_add(hidden_states: torch.Tensor, gate_weight: torch.Tensor, shared_output: torch.Tensor,
                               final_hidden_states: torch.Tensor) -> None:
    """final_hidden_states ([T, H], the routed experts' output) += the gated shared output, in place; the sum
    is formed in float32 and stored in final_hidden_states' dtype."""
    total = _gated(hidden_states, gate_weight, shared_output) + final_hidden_states.to(
        compute_dtype(final_hidden_states, shared_output))
    final_hidden_states.copy_(total.to(final_hidden_states.dtype))
