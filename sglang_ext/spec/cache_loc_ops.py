"""KV slot bookkeeping of speculative decoding in plain torch: which pool slots the draft tokens are written to,
and which of them the accepted tokens are moved from and to. The CPU platform's implementation and the spec of
the Triton kernels (`sglang_ext/kernels/spec_cache_locs.py`). No SGLang import.

Semantics follow SGLang 0.5.23 `kernels/ops/speculative/cache_locs.py` and `eagle.py`. `req_to_token` is the
request-to-slot table [max_reqs, max_context] (int32); slot ids come back as int64.
"""

import torch


def assign_extend_cache_locs(
    req_pool_indices: torch.Tensor,  # int [bs]
    req_to_token: torch.Tensor,  # int32 [max_reqs, max_context]
    start_offset: torch.Tensor,  # int [bs]
    end_offset: torch.Tensor,  # int [bs]
) -> torch.Tensor:
    """Concatenation over requests of req_to_token[req, start:end]: int64 [sum(end - start)]."""
    lengths = (end_offset - start_offset).long()
    total = int(lengths.sum())
    if total == 0:
        return torch.empty(0, dtype=torch.int64, device=req_to_token.device)
    owner = torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths)
    starts_in_out = torch.cumsum(lengths, 0) - lengths
    col = torch.arange(total, device=lengths.device) - starts_in_out[owner] + start_offset.long()[owner]
    return req_to_token[req_pool_indices.long()[owner], col].to(torch.int64)


def fill_front_out_cache_loc(
    num_front: torch.Tensor,  # int [bs]
    out_cache_loc: torch.Tensor,  # int [bs * window]
    front_out_cache_loc: torch.Tensor,  # int64 (out): packed first num_front[i] slots of each window
) -> None:
    bs = num_front.numel()
    window = out_cache_loc.view(bs, -1)
    keep = torch.arange(window.shape[1], device=window.device)[None, :] < num_front.view(-1, 1)
    packed = window[keep]
    front_out_cache_loc[:packed.numel()] = packed.to(front_out_cache_loc.dtype)


def fill_accept_out_cache_loc(
    accept_index: torch.Tensor,  # int [bs, steps] or flat; -1 = nothing accepted there
    out_cache_loc: torch.Tensor,  # int [bs * n]
    accept_out_cache_loc: torch.Tensor,  # int64 (out): out_cache_loc of the accepted entries, packed in order
) -> None:
    flat = accept_index.reshape(-1).long()
    picked = out_cache_loc[flat[flat != -1]]
    accept_out_cache_loc[:picked.numel()] = picked.to(accept_out_cache_loc.dtype)


def fill_bonus_tokens(
    accept_tokens: torch.Tensor,  # int [bs * accept_stride]
    accept_lens: torch.Tensor,  # int [bs]: accepted tokens including the bonus
    bonus_tokens: torch.Tensor,  # (out) [bs]
    accept_stride: int,
) -> None:
    """bonus_tokens[i] = the last accepted token of request i."""
    bs = accept_lens.numel()
    idx = torch.arange(bs, device=accept_lens.device) * accept_stride + accept_lens.long() - 1
    bonus_tokens.copy_(accept_tokens.reshape(-1)[idx].to(bonus_tokens.dtype))


def assign_draft_cache_locs_contiguous(
    req_pool_indices: torch.Tensor,  # int [bs]
    req_to_token: torch.Tensor,  # int32 [max_reqs, max_context]
    seq_lens: torch.Tensor,  # int [bs]
    out_cache_loc: torch.Tensor,  # (out) [bs * topk * num_cols]
    topk: int,
    num_cols: int,
    positions: torch.Tensor | None = None,  # (out) [bs * topk]: seq_len of each request, if given
) -> None:
    """Each request's topk * num_cols slots from seq_len on, row-major per request."""
    width = topk * num_cols
    bs = seq_lens.numel()
    if bs == 0:
        return
    col = seq_lens.long().view(-1, 1) + torch.arange(width, device=seq_lens.device)[None, :]
    slots = req_to_token[req_pool_indices.long().view(-1, 1), col]
    out_cache_loc[:bs * width] = slots.reshape(-1).to(out_cache_loc.dtype)
    if positions is not None:
        positions[:bs * topk] = seq_lens.repeat_interleave(topk).to(positions.dtype)


def assign_req_to_token_pool(
    req_pool_indices: torch.Tensor,  # int [bs]
    req_to_token: torch.Tensor,  # int32 [max_reqs, max_context] (out)
    start_offset: torch.Tensor,  # int [bs]
    end_offset: torch.Tensor,  # int [bs]
    out_cache_loc: torch.Tensor,  # int [sum(end - start)]
) -> None:
    """Inverse of assign_extend_cache_locs: req_to_token[req, start:end] = the request's run of out_cache_loc."""
    lengths = (end_offset - start_offset).long()
    total = int(lengths.sum())
    if total == 0:
        return
    owner = torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths)
    starts_in_out = torch.cumsum(lengths, 0) - lengths
    col = torch.arange(total, device=lengths.device) - starts_in_out[owner] + start_offset.long()[owner]
    req_to_token[req_pool_indices.long()[owner], col] = out_cache_loc[:total].to(req_to_token.dtype)
