"""Token-by-token gated delta rule for decode and target verify, in torch.

Stands in for SGLang's `fused_sigmoid_gating_delta_rule_update` (decode, and verify of chain or tree drafts with
per-draft state snapshots) and `fused_recurrent_gated_delta_rule_packed_decode`. The gates are computed inside
(from A_log, a, dt_bias, b) as those kernels do. States are [HV, V, K] per slot.
"""


import torch

from sglang_ext.hybrid.ops.errors import UnsupportedGdnOption
from sglang_ext.hybrid.ops.gated_delta_rule import l2_normalize
from sglang_ext.hybrid.ops.gating import compute_dtype, gdn_gate

# SGLang's packed decode kernel rounds beta = sigmoid(b) to b's dtype; its verify kernel
# (fused_sigmoid_gating_delta_rule_update) keeps it in float32. In a bf16 model the two then update the recurrent
# state differently, so a token decoded plainly and the same token verified as a draft part in the last bits and
# speculative greedy output can leave plain decoding's. Row-invariant servers (platform/batch_invariant.py) turn the
# rounding off so that decode computes what verify computes; otherwise decode mirrors SGLang's kernel.
_round_decode_beta = True


def round_decode_beta(on: bool) -> None:
    global _round_decode_beta
    _round_decode_beta = on


def delta_rule_step(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                    beta: torch.Tensor) -> torch.Tensor:
    """One token for a batch of states, in place. state: [N, HV, V, K]; q, k: [N, HV, K] (q scaled, normalized);
    v: [N, HV, V]; g, beta: [N, HV]. Returns o: [N, HV, V]."""
    state.mul_(g.exp()[..., None, None])
    delta = (v - (state @ k.unsqueeze(-1)).squeeze(-1)) * beta.unsqueeze(-1)
    state.add_(delta.unsqueeze(-1) * k.unsqueeze(-2))
    return (state @ q.unsqueeze(-1)).squeeze(-1)


def _prepare(q, k, scale, use_qk_l2norm, group, dt):
    qf, kf = q.to(dt), k.to(dt)
    if use_qk_l2norm:
        qf, kf = l2_normalize(qf), l2_normalize(kf)
    return (qf * scale).repeat_interleave(group, dim=-2), kf.repeat_interleave(group, dim=-2)


def fused_sigmoid_gating_delta_rule_update(
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    softplus_beta: float,
    softplus_threshold: float,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    b: torch.Tensor,
    initial_state_source: torch.Tensor | None,
    initial_state_indices: torch.Tensor | None,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    is_kda: bool = False,
    lower_bound: float | None = None,
    disable_state_update: bool = False,
    intermediate_states_buffer: torch.Tensor | None = None,
    intermediate_state_indices: torch.Tensor | None = None,
    cache_steps: int | None = None,
    retrieve_parent_token: torch.Tensor | None = None,
    cache_ring: bool = False,
    replayssm_rawv: torch.Tensor | None = None,
    replayssm_rawk: torch.Tensor | None = None,
    replayssm_g: torch.Tensor | None = None,
    replayssm_beta: torch.Tensor | None = None,
    match_cutedsl_decode: bool = False,
) -> torch.Tensor:
    """q, k: [B, T, H, K]; v: [B, T, HV, V]; a, b: [B*T, HV] or [B, T, HV]; with cu_seqlens ([N+1]) B is 1.

    Sequence n starts from initial_state_source[initial_state_indices[n]] (zeros for a negative index) and, unless
    disable_state_update, its final state is written back there. With intermediate_states_buffer
    ([slots, steps, HV, V, K]) the state after draft step t of sequence n goes to
    buffer[intermediate_state_indices[n], t] (skipped for a negative index). With retrieve_parent_token ([N, T],
    tree drafts) step t > 0 starts from the snapshot of its parent step instead of step t - 1.
    Returns o: [B, T, HV, V] in q's dtype."""
    if is_kda or lower_bound is not None or cache_ring or match_cutedsl_decode:
        raise UnsupportedGdnOption("fused_sigmoid_gating_delta_rule_update: KDA gates, lower_bound, the ReplaySSM "
                                   "ring and CuTe-DSL parity are not supported by the torch GDN op")
    if retrieve_parent_token is not None and intermediate_states_buffer is None:
        raise UnsupportedGdnOption("fused_sigmoid_gating_delta_rule_update: tree drafts need "
                                   "intermediate_states_buffer (the parents' snapshots)")
    batch, length, num_k_heads, head_k = k.shape
    num_v_heads, head_v = v.shape[-2:]
    if scale is None:
        scale = head_k ** -0.5
    dt = compute_dtype(q, k, v, a, b)
    qf, kf = _prepare(q, k, scale, use_qk_l2norm_in_kernel, num_v_heads // num_k_heads, dt)
    vf = v.to(dt)
    g = gdn_gate(A_log, a.reshape(batch * length, num_v_heads), dt_bias, softplus_beta, softplus_threshold)
    g = g.to(dt).view(batch, length, num_v_heads)
    beta = torch.sigmoid(b.reshape(batch, length, num_v_heads).to(dt))
    if cu_seqlens is None:
        bounds = [(n, 0, length) for n in range(batch)]
    else:
        cu = [int(c) for c in cu_seqlens.tolist()]
        bounds = [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]
    slots = (initial_state_indices.tolist() if initial_state_source is not None
             else [-1] * len(bounds))
    snap_slots = (intermediate_state_indices.tolist() if intermediate_states_buffer is not None
                  else [-1] * len(bounds))
    parents = retrieve_parent_token.tolist() if retrieve_parent_token is not None else None
    buffer = intermediate_states_buffer
    o = torch.zeros(batch, length, num_v_heads, head_v, dtype=q.dtype, device=q.device)
    # Sequences of equal length run together; a batch's lengths (cu_seqlens) decide the grouping.
    groups: dict[int, list[int]] = {}
    for n, (_, start, end) in enumerate(bounds):
        groups.setdefault(end - start, []).append(n)
    for steps, members in groups.items():
        state = torch.zeros(len(members), num_v_heads, head_v, head_k, dtype=dt, device=q.device)
        for i, n in enumerate(members):
            if slots[n] >= 0:
                state[i] = initial_state_source[slots[n]].to(dt)
        rows = [bounds[n][0] for n in members]
        firsts = [bounds[n][1] for n in members]
        for t in range(steps):
            if parents is not None and t > 0:  # a tree draft continues from its parent's snapshot
                for i, n in enumerate(members):
                    if snap_slots[n] >= 0:
                        state[i] = buffer[snap_slots[n], parents[n][t]].to(dt)
            idx = (rows, [f + t for f in firsts])
            out = delta_rule_step(state, qf[idx], kf[idx], vf[idx], g[idx], beta[idx])
            o[idx] = out.to(q.dtype)
            if buffer is not None:
                for i, n in enumerate(members):
                    if snap_slots[n] >= 0:
                        buffer[snap_slots[n], t] = state[i].to(buffer.dtype)
        if not disable_state_update and initial_state_source is not None:
            for i, n in enumerate(members):
                if slots[n] >= 0:
                    initial_state_source[slots[n]] = state[i].to(initial_state_source.dtype)
    return o


def fused_recurrent_gated_delta_rule_packed_decode(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor,
    out: torch.Tensor,
    ssm_state_indices: torch.Tensor,
    use_qk_l2norm_in_kernel: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode token per row from the packed projection. mixed_qkv: [B, 2*H*K + HV*V] ([q | k | v] after the
    conv); a, b: [B, HV]; initial_state: pool [slots, HV, V, K], read and written at ssm_state_indices[B] (a
    negative index: output zeros, no write). Writes out [B, 1, HV, V]; returns (out, initial_state).

    As the Triton kernel does, beta is sigmoid(b) rounded to b's dtype, unless round_decode_beta(False) (then as
    fused_sigmoid_gating_delta_rule_update: float32)."""
    batch = mixed_qkv.shape[0]
    num_v_heads, head_v, head_k = initial_state.shape[-3:]
    qk_dim = mixed_qkv.shape[1] - num_v_heads * head_v
    num_k_heads = qk_dim // 2 // head_k
    if qk_dim <= 0 or num_k_heads * head_k * 2 != qk_dim or num_v_heads % num_k_heads:
        raise ValueError(f"fused_recurrent_gated_delta_rule_packed_decode: packed width {mixed_qkv.shape[1]} does "
                         f"not fit HV={num_v_heads}, V={head_v}, K={head_k}")
    if out.shape != (batch, 1, num_v_heads, head_v):
        raise ValueError(f"fused_recurrent_gated_delta_rule_packed_decode: out must be {(batch, 1, num_v_heads, head_v)},"
                         f" got {tuple(out.shape)}")
    dt = compute_dtype(mixed_qkv, a, b)
    q, k, v = torch.split(mixed_qkv, [qk_dim // 2, qk_dim // 2, num_v_heads * head_v], dim=-1)
    qf, kf = _prepare(q.view(batch, num_k_heads, head_k), k.view(batch, num_k_heads, head_k), scale,
                      use_qk_l2norm_in_kernel, num_v_heads // num_k_heads, dt)
    g = gdn_gate(A_log, a, dt_bias).to(dt)
    beta = torch.sigmoid(b.to(dt))
    if _round_decode_beta:
        beta = beta.to(b.dtype).to(dt)
    slots = ssm_state_indices.tolist()
    live = [i for i, s in enumerate(slots) if s >= 0]
    out.zero_()
    if live:
        live_slots = [slots[i] for i in live]
        state = initial_state[live_slots].to(dt)
        o = delta_rule_step(state, qf[live], kf[live], v.view(batch, num_v_heads, head_v)[live].to(dt), g[live],
                            beta[live])
        out[live, 0] = o.to(out.dtype)
        initial_state[live_slots] = state.to(initial_state.dtype)
    return out, initial_state
