"""Attention for a whole batch over a compressed pool in one call per layer (the CPU torch path).

Pure torch (no SGLang). Per forward step `pad_batch` turns a `BatchPlan` into a padded layout: B sequences x M
query rows, each attending to L cached slots (read from the pool) and, when the new tokens' K/V come in with
the call (target verify, draft extend), to the M new tokens under a causal or custom (tree) mask. Per layer
`batched_attention` gathers the planes at the batch's slots once, straight into the padded [B, L] layout (only
the rows the batch touches; never a whole layer), dequantizes those rows and attends with one masked softmax,
in the format's attention basis (octave: q and the output are rotated once, no cached row is un-rotated).

The spec is the per-request `sglang_ext.kvformats.reference` attention; tests compare the two.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_ext.kvcache.batch_plan import BatchPlan
from sglang_ext.kvformats.base import KVFormat
from sglang_ext.kvformats.reference import gather_planes


@dataclass(frozen=True)
class PaddedBatch:
    # kv_slots: [B, L] int64, sequence b's l-th cached slot; padding repeats a slot of the batch (masked out)
    kv_slots: torch.Tensor
    # q_rows: [B, M] int64, row in q (and in the new K/V) of sequence b's m-th query (0 where padding)
    q_rows: torch.Tensor
    # q_valid: [B, M] bool, False on padding
    q_valid: torch.Tensor
    # mask: [B, M, L + M'] bool, True = query m of sequence b sees that key; M' = M when the new tokens come
    # in with the call (new_tokens), else 0. Padding keys are False. (After read_new_tokens_from_pool, the
    # M new-token columns are pool slots: kv_slots is [B, L + M] and new_tokens False.)
    mask: torch.Tensor
    new_tokens: bool


def _padded_rows(indptr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR indptr [B+1] -> (rows [B, W] int64 into the flat array, valid [B, W] bool), W = the longest run."""
    lens = indptr[1:] - indptr[:-1]
    width = int(lens.max()) if lens.numel() else 0
    pos = torch.arange(width, dtype=torch.int64, device=indptr.device)
    valid = pos[None, :] < lens[:, None]
    rows = torch.where(valid, indptr[:-1, None] + pos[None, :], torch.zeros_like(pos)[None, :])
    return rows, valid


def pad_batch(
    plan: BatchPlan,
    *,
    new_tokens: bool,
    custom_mask: torch.Tensor | None = None,
    mask_indptr: torch.Tensor | None = None,
) -> PaddedBatch:
    """Padded layout of `plan` for `batched_attention`.

    new_tokens False: every key is in the pool (decode: each sequence's new token is stored before attending).
    new_tokens True: sequence b's qo rows also are its new keys, seen causally, or through `custom_mask` when
    given: SGLang's speculative-verify layout, for sequence b a row-major bool [m_b, l_b + m_b] block starting
    at mask_indptr[b] (m_b queries; columns = its l_b cached slots, then its m_b new tokens).
    """
    device = plan.kv_indices.device
    kv_rows, kv_valid = _padded_rows(plan.kv_indptr)
    q_rows, q_valid = _padded_rows(plan.qo_indptr)
    batch, width_q = q_rows.shape
    width_kv = kv_rows.shape[1]
    mask = kv_valid[:, None, :].expand(batch, width_q, width_kv)
    if new_tokens:
        if custom_mask is None:
            causal = torch.ones(width_q, width_q, dtype=torch.bool, device=device).tril()
            new = causal[None] & q_valid[:, None, :]
        else:
            new = torch.zeros(batch, width_q, width_q, dtype=torch.bool, device=device)
            mask = mask.clone()
            qo, kv, starts = plan.qo_indptr.tolist(), plan.kv_indptr.tolist(), mask_indptr.tolist()
            for b in range(batch):
                m, lp = qo[b + 1] - qo[b], kv[b + 1] - kv[b]
                block = custom_mask[starts[b] : starts[b] + m * (lp + m)].view(m, lp + m).to(torch.bool)
                mask[b, :m, :lp] = block[:, :lp]
                new[b, :m, :m] = block[:, lp:]
        mask = torch.cat([mask, new], dim=2)
    kv_slots = plan.kv_indices.long()[kv_rows] if width_kv else kv_rows
    return PaddedBatch(kv_slots, q_rows, q_valid, mask.contiguous(), new_tokens)


def read_new_tokens_from_pool(batch: PaddedBatch, new_slots: torch.Tensor) -> PaddedBatch:
    """`batch` (laid out with new_tokens) with the new tokens' keys read back from the pool at new_slots
    [T] (their slots, rows laid out like q; stored before attending) instead of taken at full precision.

    Speculative target verify: decode attends to its current token through the lossy format (stored, then read
    like every cached key), so verify must read each draft the same way, or its logits differ from decode's.
    The mask is unchanged: its new-token columns now index the appended slot columns.
    """
    if not batch.new_tokens:
        raise ValueError("read_new_tokens_from_pool needs a batch laid out with new_tokens")
    # padding rows (q_rows 0) read a real slot; their columns are masked out
    new_cols = new_slots.long()[batch.q_rows]
    return PaddedBatch(torch.cat([batch.kv_slots, new_cols], dim=1), batch.q_rows, batch.q_valid, batch.mask, False)


def one_query_batches(batch: PaddedBatch) -> list[tuple[int, PaddedBatch]]:
    """`batch` (every key in the pool: decode, or verify after read_new_tokens_from_pool) split into one batch per
    query: (its row in q, a 1 x 1 batch over exactly the slots it sees, in order). Attended with q[row:row + 1],
    each is the computation a batch-1 decode step of that query would do (batch-invariant mode: a query's output
    does not depend on the other queries, the padding, or how many drafts a verify step carries)."""
    if batch.new_tokens:
        raise ValueError("one_query_batches needs every key in the pool (new_tokens False)")
    if batch.q_valid.numel() == 1 and bool(batch.q_valid.all()) and bool(batch.mask.all()):
        return [(int(batch.q_rows[0, 0]), batch)]  # already one query over exactly its keys (decode at batch 1)
    out = []
    for b, m in batch.q_valid.nonzero().tolist():
        slots = batch.kv_slots[b][batch.mask[b, m]]
        mask = torch.ones(1, 1, slots.numel(), dtype=torch.bool, device=slots.device)
        zero = torch.zeros(1, 1, dtype=torch.int64, device=slots.device)
        out.append((int(batch.q_rows[b, m]), PaddedBatch(slots[None], zero, mask[:, :, 0], mask, False)))
    return out


def batched_attention(
    fmt: KVFormat,
    q: torch.Tensor,
    planes: dict[str, torch.Tensor],
    batch: PaddedBatch,
    sm_scale: float,
    logit_cap: float = 0.0,
    k_new: torch.Tensor | None = None,
    v_new: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [T, Hq, D] (rows laid out by the plan's qo_indptr) -> o float32 [T, Hq, D].

    planes: the layer's {name: [slots, Hkv, *tail]}; only the rows at batch.kv_slots are read.
    k_new / v_new [T, Hkv, D]: the new tokens' K/V at full precision, required iff batch.new_tokens.
    A query that sees no key gets a zero output (as in the reference).
    """
    t, hq, d = q.shape
    nb, width_q = batch.q_rows.shape
    out = torch.zeros(t, hq, d, dtype=torch.float32, device=q.device)
    if nb == 0:
        return out
    # Attention runs in the format's basis (octave: rotated): q, the new K/V and the output are rotated once
    # each, so no cached row is ever un-rotated.
    keys, values = [], []
    if batch.kv_slots.shape[1]:
        # The compressed rows are gathered straight into the padded layout, heads first (bytes, not floats, are
        # moved): codes [Hkv, B * L, *tail] -> k_rows, v_rows [Hkv, B * L, D] float32 -> [Hkv, B, L, D].
        gathered = {name: t[batch.kv_slots.flatten()].transpose(0, 1).contiguous() for name, t in planes.items()}
        k_rows, v_rows = fmt.dequantize_rotated_kv(gathered)
        keys.append(k_rows.view(k_rows.shape[0], nb, -1, d))
        values.append(v_rows.view(v_rows.shape[0], nb, -1, d))
    if batch.new_tokens:
        if k_new is None or v_new is None:
            raise ValueError("this batch's new tokens attend to each other: pass k_new and v_new")
        keys.append(fmt.rotate_k(k_new)[batch.q_rows].permute(2, 0, 1, 3))
        values.append(fmt.rotate_v(v_new)[batch.q_rows].permute(2, 0, 1, 3))
    if not keys:
        return out
    # k, v: [Hkv, B, S, D]
    k = torch.cat(keys, dim=2) if len(keys) > 1 else keys[0]
    v = torch.cat(values, dim=2) if len(values) > 1 else values[0]
    h_kv, width_s = k.shape[0], k.shape[2]
    group = hq // h_kv
    # qh: [Hkv, B, M * G, D], rows (m, g)
    qh = (fmt.rotate_k(q) * sm_scale)[batch.q_rows].view(nb, width_q, h_kv, group, d).permute(2, 0, 1, 3, 4)
    qh = qh.reshape(h_kv, nb, width_q * group, d)
    s = torch.matmul(qh, k.transpose(-1, -2)).view(h_kv, nb, width_q, group, width_s)
    if logit_cap > 0:
        s = logit_cap * torch.tanh(s / logit_cap)
    sees_any = batch.mask.any(dim=-1)  # [B, M]
    # Rows that see nothing (padding, or an empty sequence) attend everywhere and are zeroed below: no NaN.
    mask = batch.mask | ~sees_any[:, :, None]
    s = s.masked_fill(~mask[None, :, :, None, :], float("-inf"))
    p = torch.softmax(s, dim=-1).view(h_kv, nb, width_q * group, width_s)
    o = torch.matmul(p, v).view(h_kv, nb, width_q, group, d).permute(1, 2, 0, 3, 4).reshape(nb, width_q, hq, d)
    keep = batch.q_valid & sees_any
    out[batch.q_rows[keep]] = fmt.unrotate_v(o[keep])
    return out
