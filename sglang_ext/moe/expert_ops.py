"""Torch compute of routed experts over a slot table: what SGLang's triton MoE runner computes for paged experts
(`no_combine` + `no_combine_keep_router_weight`), for devices without that runner (the portable CPU platform).

No SGLang import: the glue (`sglang_ext/moe/sglang_glue.py`) hands in the layer's tensors.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def routed_expert_entries(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, slot_ids: torch.Tensor,
                          weights: torch.Tensor) -> torch.Tensor:
    """Every routed (token, j) entry's expert output times its router weight, not summed over j.

    x: [T, H]; w13: [K, 2*I, H] (gate rows, then up rows: SGLang's w13 layout); w2: [K, H, I];
    slot_ids: [T, top_k] int, the slot of each entry, < 0 for an entry outside the table (its output is 0);
    weights: [T, top_k] router weights. Returns [T, top_k, H] in x's dtype. Nothing is mutated.
    SiLU-gated experts only (the activation every paged-experts model on the CPU platform uses).
    """
    if x.dim() != 2 or w13.dim() != 3 or w2.dim() != 3 or slot_ids.shape != weights.shape:
        raise ValueError(f"routed_expert_entries: shapes x{tuple(x.shape)} w13{tuple(w13.shape)} "
                         f"w2{tuple(w2.shape)} ids{tuple(slot_ids.shape)} weights{tuple(weights.shape)}")
    num_tokens, top_k = slot_ids.shape
    out = x.new_zeros(num_tokens, top_k, w2.shape[1])
    flat_ids = slot_ids.reshape(-1)
    flat_out = out.view(-1, w2.shape[1])
    flat_w = weights.reshape(-1).to(x.dtype)
    for slot in torch.unique(flat_ids).tolist():
        if slot < 0:
            continue
        entries = (flat_ids == slot).nonzero().squeeze(1)
        gate, up = F.linear(x[entries // top_k], w13[slot]).chunk(2, dim=-1)
        flat_out[entries] = F.linear(F.silu(gate) * up, w2[slot]) * flat_w[entries].unsqueeze(1)
    return out


def sum_top_k(entries: torch.Tensor, out: torch.Tensor, routed_scaling_factor: float) -> None:
    """out[t] = routed_scaling_factor * sum_j entries[t, j]; entries: [T, top_k, H], out: [T, H] (written)."""
    torch.sum(entries, dim=1, out=out)
    if routed_scaling_factor != 1.0:
        out.mul_(routed_scaling_factor)
