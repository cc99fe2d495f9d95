"""Per-batch slot lists for attention over a compressed pool: built once per forward step, read by every layer.

Pure torch (no SGLang), the same CSR layout SGLang's Triton backend uses: sequence i's cached slots are
kv_indices[kv_indptr[i]:kv_indptr[i+1]] and its query rows are q[qo_indptr[i]:qo_indptr[i+1]].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class BatchPlan:
    # qo_indptr: [bs + 1] int64, query rows of each sequence
    qo_indptr: torch.Tensor
    # kv_indptr: [bs + 1] int64, offsets into kv_indices
    kv_indptr: torch.Tensor
    # kv_indices: [sum of cached lengths] int64 slot ids into the pool
    kv_indices: torch.Tensor


def _indptr(lengths: list[int], device) -> torch.Tensor:
    out = torch.zeros(len(lengths) + 1, dtype=torch.int64, device=device)
    if lengths:
        out[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64, device=device), dim=0)
    return out


def _gather_slots(req_to_token: torch.Tensor, req_pool_indices: list[int], lengths: list[int]) -> torch.Tensor:
    rows = [req_to_token[r, :n] for r, n in zip(req_pool_indices, lengths, strict=True) if n > 0]
    if not rows:
        return torch.zeros(0, dtype=torch.int64, device=req_to_token.device)
    return torch.cat(rows).to(torch.int64)


def plan_decode(req_to_token: torch.Tensor, req_pool_indices: list[int], seq_lens: list[int]) -> BatchPlan:
    """One query row per sequence; it attends to all seq_lens[i] cached slots (its own new token included,
    which the backend stores before attending)."""
    device = req_to_token.device
    return BatchPlan(
        qo_indptr=torch.arange(len(seq_lens) + 1, dtype=torch.int64, device=device),
        kv_indptr=_indptr(seq_lens, device),
        kv_indices=_gather_slots(req_to_token, req_pool_indices, seq_lens),
    )


def plan_extend(
    req_to_token: torch.Tensor, req_pool_indices: list[int], prefix_lens: list[int], extend_lens: list[int]
) -> BatchPlan:
    """extend_lens[i] new query rows per sequence; kv lists hold only the cached prefix (prefix_lens[i] slots).
    The new tokens' K/V come in with the call, as in SGLang's Triton extend kernel."""
    device = req_to_token.device
    return BatchPlan(
        qo_indptr=_indptr(extend_lens, device),
        kv_indptr=_indptr(prefix_lens, device),
        kv_indices=_gather_slots(req_to_token, req_pool_indices, prefix_lens),
    )
