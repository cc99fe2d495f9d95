"""Chunked gated delta rule for extend (prefill): SGLang's `fla.chunk.chunk_gated_delta_rule` in torch.

The recurrence, per value head, with the state S held as [V, K] (SGLang's pool layout [slots, HV, V, K]):

    S_t = exp(g_t) * S_{t-1} + beta_t * (v_t - exp(g_t) * S_{t-1} k_t) k_t^T,    o_t = scale * S_t q_t

Chunks of 64 tokens are solved at once (the WY form: one triangular solve per chunk), then chained through S.
"""


import torch

from sglang_ext.hybrid.ops.errors import UnsupportedGdnOption
from sglang_ext.hybrid.ops.gating import compute_dtype

CHUNK_SIZE = 64  # SGLang's FLA chunk size: the per-chunk states `h` it returns are at multiples of it


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim (FLA's l2norm)."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def _sequence_bounds(cu_seqlens: torch.Tensor | None, batch: int, length: int) -> list[tuple[int, int, int]]:
    """(row in the batch dim, first token, end token) per sequence: varlen rows of batch 0, or one per batch row."""
    if cu_seqlens is None:
        return [(n, 0, length) for n in range(batch)]
    cu = [int(c) for c in cu_seqlens.tolist()]
    return [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]


def chunk_sequence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                   state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """One sequence, all in the compute dtype, heads already matched (GQA expanded, q scaled, q/k normalized).

    q, k: [L, HV, K]; v: [L, HV, V]; g, beta: [L, HV]; state: [HV, V, K] (not modified).
    Returns (o [L, HV, V], final state [HV, V, K], the state at the start of each chunk)."""
    length = q.shape[0]
    o = v.new_empty(v.shape)
    chunk_starts = []
    s = state.transpose(-1, -2)  # [HV, K, V]: the orientation the chunk algebra reads naturally
    for start in range(0, length, CHUNK_SIZE):
        end = min(start + CHUNK_SIZE, length)
        chunk_starts.append(s.transpose(-1, -2))
        qc, kc, vc = (t[start:end].transpose(0, 1) for t in (q, k, v))  # [HV, C, *]
        gc, bc = g[start:end].transpose(0, 1), beta[start:end].transpose(0, 1)  # [HV, C]
        cum = gc.cumsum(-1)  # G_i = g_1 + ... + g_i within the chunk
        c = end - start
        lower = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()  # j <= i
        diff = (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill(~lower, 0.0)
        decay = diff.exp().masked_fill(~lower, 0.0)  # exp(G_i - G_j) for j <= i
        kk = kc @ kc.transpose(-1, -2)  # k_i . k_j
        # (I + L) u = beta v - beta exp(G) S0^T k, with L_ij = beta_i exp(G_i - G_j) k_i.k_j for j < i
        system = torch.eye(c, dtype=q.dtype, device=q.device) + (bc.unsqueeze(-1) * kk * decay).tril(-1)
        rhs_v = bc.unsqueeze(-1) * vc
        rhs_k = (bc * cum.exp()).unsqueeze(-1) * kc
        u_v = torch.linalg.solve_triangular(system, rhs_v, upper=False, unitriangular=True)
        u_k = torch.linalg.solve_triangular(system, rhs_k, upper=False, unitriangular=True)
        u = u_v - u_k @ s  # [HV, C, V]: the values written into the state
        attn = (qc @ kc.transpose(-1, -2)) * decay  # q_i . k_j exp(G_i - G_j), j <= i
        o[start:end] = ((qc * cum.exp().unsqueeze(-1)) @ s + attn @ u).transpose(0, 1)
        tail = (cum[:, -1:] - cum).exp().unsqueeze(-1)  # exp(G_C - G_j)
        s = s * cum[:, -1].exp()[:, None, None] + (kc * tail).transpose(-1, -2) @ u
    return o, s.transpose(-1, -2), chunk_starts


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    initial_state_indices: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    head_first: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    inplace_update: bool = True,
) -> tuple[torch.Tensor, None, torch.Tensor]:
    """SGLang's extend op. q, k: [B, T, H, K]; v: [B, T, HV, V]; g (log decay), beta: [B, T, HV]; with cu_seqlens
    ([N+1]) B is 1 and the N sequences are concatenated along T.

    initial_state: the state pool [slots, HV, V, K]; sequence n starts from initial_state[initial_state_indices[n]]
    and, when inplace_update, its final state is written back there (a negative index: zero start, no write).
    Returns (o [B, T, HV, V] in q's dtype, None, h [B, NT, HV, V, K] in k's dtype): h holds each sequence's state
    at the start of each of its 64-token chunks, chunks numbered through the batch in order."""
    if head_first:
        raise UnsupportedGdnOption("chunk_gated_delta_rule: head_first=True is not supported (SGLang passes False)")
    if cu_seqlens is not None and q.shape[0] != 1:
        raise ValueError(f"chunk_gated_delta_rule: batch must be 1 with cu_seqlens, got {q.shape[0]}")
    if initial_state is not None and initial_state_indices is None:
        raise ValueError("chunk_gated_delta_rule: initial_state needs initial_state_indices (one slot per sequence)")
    batch, length, num_k_heads, head_k = k.shape
    num_v_heads, head_v = v.shape[-2:]
    if num_v_heads % num_k_heads:
        raise ValueError(f"chunk_gated_delta_rule: {num_v_heads} value heads are not a multiple of {num_k_heads}")
    if scale is None:
        scale = head_k ** -0.5
    dt = compute_dtype(q, k, v, g, beta)
    group = num_v_heads // num_k_heads
    qf, kf = q.to(dt), k.to(dt)
    if use_qk_l2norm_in_kernel:
        qf, kf = l2_normalize(qf), l2_normalize(kf)
    qf = (qf * scale).repeat_interleave(group, dim=2)
    kf = kf.repeat_interleave(group, dim=2)
    vf, gf, bf = v.to(dt), g.to(dt), beta.to(dt)
    bounds = _sequence_bounds(cu_seqlens, batch, length)
    if initial_state_indices is not None and initial_state_indices.numel() != len(bounds):
        raise ValueError(f"chunk_gated_delta_rule: {initial_state_indices.numel()} state indices for "
                         f"{len(bounds)} sequences")
    slots = initial_state_indices.tolist() if initial_state_indices is not None else [-1] * len(bounds)
    o = torch.zeros(batch, length, num_v_heads, head_v, dtype=q.dtype, device=q.device)
    states = []
    for (row, start, end), slot in zip(bounds, slots):
        if initial_state is not None and slot >= 0:
            s0 = initial_state[slot].to(dt, copy=True)  # h keeps it after the slot is overwritten
        else:
            s0 = torch.zeros(num_v_heads, head_v, head_k, dtype=dt, device=q.device)
        if end > start:
            out, s_final, starts = chunk_sequence(qf[row, start:end], kf[row, start:end], vf[row, start:end],
                                                  gf[row, start:end], bf[row, start:end], s0)
            o[row, start:end] = out.to(q.dtype)
            states.extend(starts)
        else:
            s_final = s0
        if initial_state is not None and inplace_update and slot >= 0:
            initial_state[slot] = s_final.to(initial_state.dtype)
    if states:
        h = torch.stack(states).to(k.dtype).unsqueeze(0)
    else:
        h = k.new_empty(1, 0, num_v_heads, head_v, head_k)
    if cu_seqlens is None and batch > 1:
        h = h.view(batch, -1, num_v_heads, head_v, head_k)
    return o, None, h
