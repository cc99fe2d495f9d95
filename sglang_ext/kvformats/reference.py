"""Torch reference attention over a format's planes: the spec the Triton kernels are tested against
(and the path a CPU platform can use). Reads only the slots the batch names; float32 math.

Indexing follows SGLang's Triton backend: request b's KV slots are kv_indices[kv_indptr[b]:kv_indptr[b+1]]
(token-level slot ids; with page_size > 1 they come in runs of page_size consecutive slots, which changes
nothing here). A request with no KV tokens gets a zero output.
"""

from __future__ import annotations

import torch

from .base import KVFormat


def gather_planes(planes: dict[str, torch.Tensor], slots: torch.Tensor) -> dict[str, torch.Tensor]:
    return {name: t[slots] for name, t in planes.items()}


def _num_kv_heads(planes: dict[str, torch.Tensor]) -> int:
    return next(iter(planes.values())).shape[1]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float, logit_cap: float,
            mask: torch.Tensor | None) -> torch.Tensor:
    """q [M, Hq, D], k/v [L, Hkv, D] float32, mask [M, L] bool (True = attend) -> [M, Hq, D].

    Without a logit cap this is torch's scaled_dot_product_attention (the same math, blocked, without the
    [Hq, M, L] score tensor: the CPU platform serves prefill through here). Rows that see no key come back
    undefined; callers zero them."""
    if logit_cap <= 0:
        causal = mask is not None and mask.shape[0] == mask.shape[1] and bool(mask.equal(torch.ones_like(mask).tril()))
        out = torch.nn.functional.scaled_dot_product_attention(
            q.movedim(0, 1), k.movedim(0, 1), v.movedim(0, 1), attn_mask=None if causal else mask,
            is_causal=causal, scale=sm_scale, enable_gqa=True)
        return out.movedim(1, 0)
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    s = torch.einsum("mhd,lhd->hml", q, k) * sm_scale
    if logit_cap > 0:
        s = logit_cap * torch.tanh(s / logit_cap)
    if mask is not None:
        s = s.masked_fill(~mask[None], float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.einsum("hml,lhd->mhd", p, v)


def decode_attention(fmt: KVFormat, q: torch.Tensor, planes: dict[str, torch.Tensor], kv_indptr: torch.Tensor,
                     kv_indices: torch.Tensor, sm_scale: float, logit_cap: float = 0.0) -> torch.Tensor:
    """q [B, Hq, D] -> o float32 [B, Hq, D]: each request's one query over its KV slots."""
    batch, hq, d = q.shape
    o = torch.zeros(batch, hq, d, dtype=torch.float32, device=q.device)
    indptr = kv_indptr.tolist()
    for b in range(batch):
        slots = kv_indices[indptr[b]:indptr[b + 1]].long()
        if slots.numel() == 0:
            continue
        k, v = fmt.dequantize(gather_planes(planes, slots))
        o[b] = _attend(q[b:b + 1].float(), k, v, sm_scale, logit_cap, None)[0]
    return o


def extend_attention(fmt: KVFormat, q_extend: torch.Tensor, k_extend: torch.Tensor, v_extend: torch.Tensor,
                     planes: dict[str, torch.Tensor], qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                     kv_indices: torch.Tensor, sm_scale: float, is_causal: bool = True,
                     logit_cap: float = 0.0, custom_mask: torch.Tensor | None = None,
                     mask_indptr: torch.Tensor | None = None, new_slots: torch.Tensor | None = None) -> torch.Tensor:
    """New tokens of each request attend to its compressed prefix (read from planes through kv_indices, which
    cover the prefix only) and to the new tokens themselves, taken at full precision from k_extend/v_extend
    (as SGLang's extend does), causally when is_causal. Attention runs in the format's basis (octave: q and the
    new K/V rotated once, the output un-rotated once; no cached row is un-rotated); the rotation is orthonormal,
    so this is the same attention as in the original basis.

    custom_mask (speculative verify with tree drafts) replaces the causal mask: SGLang's layout, for request b
    a row-major bool block [m_b, l_b + m_b] at mask_indptr[b] (columns: its l_b prefix slots, then its m_b
    new tokens; True = attend). A query that sees no key gets a zero output.

    new_slots [T] (speculative verify): the new tokens' slots, already stored; their K/V are then read back from
    the planes there, through the format (as decode reads its current token), and k_extend/v_extend are unused.

    q_extend [T, Hq, D], k_extend/v_extend [T, Hkv, D], qo_indptr [B+1] over T -> o float32 [T, Hq, D].
    """
    o = torch.zeros(q_extend.shape, dtype=torch.float32, device=q_extend.device)
    qo = qo_indptr.tolist()
    kv = kv_indptr.tolist()
    h_kv = _num_kv_heads(planes)
    for b in range(len(qo) - 1):
        q0, q1 = qo[b], qo[b + 1]
        if q1 == q0:
            continue
        slots = kv_indices[kv[b]:kv[b + 1]].long()
        if slots.numel():
            kp, vp = fmt.dequantize_rotated_kv(gather_planes(planes, slots))
        else:
            kp = vp = torch.zeros(0, h_kv, fmt.head_dim, dtype=torch.float32, device=q_extend.device)
        if new_slots is None:
            kn, vn = fmt.rotate_k(k_extend[q0:q1]), fmt.rotate_v(v_extend[q0:q1])
        else:
            kn, vn = fmt.dequantize_rotated_kv(gather_planes(planes, new_slots[q0:q1].long()))
        k = torch.cat([kp, kn])
        v = torch.cat([vp, vn])
        m, lp = q1 - q0, slots.numel()
        mask = None
        if custom_mask is not None:
            start = int(mask_indptr[b])
            mask = custom_mask[start:start + m * (lp + m)].view(m, lp + m).to(torch.bool)
        elif is_causal:
            cols = torch.arange(lp + m, device=q_extend.device)
            mask = cols[None, :] <= (lp + torch.arange(m, device=q_extend.device))[:, None]
        out = fmt.unrotate_v(_attend(fmt.rotate_k(q_extend[q0:q1]), k, v, sm_scale, logit_cap, mask))
        if mask is not None:
            out = torch.where(mask.any(dim=1)[:, None, None], out, torch.zeros_like(out))
        o[q0:q1] = out
    return o
