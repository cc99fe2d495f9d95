"""EAGLE/NEXTN (MTP) step bookkeeping in plain torch: the chain tree of a top-1 draft, verify commit outputs,
draft-extend layouts, top-1 draft selection. The CPU platform's implementation of SGLang 0.5.23's Triton
helpers of the same names (`kernels/ops/speculative/eagle.py`, `topk1.py`); same return values. No SGLang import.
"""

import torch


def build_chain_tree(bonus_tokens, draft_tokens, seq_lens, tree_mask_buf=None, req_pool_indices=None,
                     req_to_token=None, with_mrope=False):
    """A top-1 draft chain as a verify tree: node 0 the bonus token, node c the c-th draft.

    Returns (mask [bs*w*w] causal per request, positions [bs*w] = seq_len + c, retrieve_index [bs, w],
    next_token [bs, w] (c + 1, -1 at the end), next_sibling [bs, w] (-1), tokens [bs*w], out_cache_loc
    (req_to_token[req, seq_len + c] if req_to_token is given, else None), mrope ([3, bs*w] positions or None)).
    """
    bs, depth = draft_tokens.shape
    width = depth + 1
    device = seq_lens.device
    mask = tree_mask_buf
    if mask is None:
        mask = torch.empty((bs * width * width,), dtype=torch.bool, device=device)
    col = torch.arange(width, device=device)
    mask[:bs * width * width] = (col[None, :] <= col[:, None]).repeat(bs, 1, 1).flatten()
    positions = (seq_lens.long().view(-1, 1) + col[None, :]).flatten()
    retrieve = torch.empty((3, bs, width), dtype=torch.int64, device=device)
    retrieve[0] = torch.arange(bs * width, device=device).view(bs, width)
    retrieve[1] = torch.where(col + 1 < width, col + 1, -1)[None, :].expand(bs, width)
    retrieve[2] = -1
    dtype = torch.promote_types(bonus_tokens.dtype, draft_tokens.dtype)
    tokens = torch.cat((bonus_tokens.view(-1, 1).to(dtype), draft_tokens.to(dtype)), dim=1).flatten()
    out_cache_loc = None
    if req_to_token is not None:
        out_cache_loc = req_to_token[req_pool_indices.long().view(-1, 1), positions.view(bs, width)].flatten().long()
    mrope = positions.view(1, -1).repeat(3, 1) if with_mrope else None
    return mask, positions, retrieve[0], retrieve[1], retrieve[2], tokens, out_cache_loc, mrope


def prepare_verify_commit_outputs(predict, accept_index, accept_lens, seq_lens, num_draft_tokens=0,
                                  mamba_track_interval=0):
    """new_seq_lens = seq_len + accepted; bonus = predict at the last accepted node. With num_draft_tokens also
    (last_steps, track_steps) and (correct, select, ids) for the draft extend that follows."""
    bs = accept_lens.numel()
    device = seq_lens.device
    accepted = accept_lens.long()
    rows = torch.arange(bs, device=device)
    idx = accept_index[rows, accepted - 1].long() if bs else torch.zeros(0, dtype=torch.long, device=device)
    new_seq_lens = (seq_lens.long() + accepted).to(torch.promote_types(seq_lens.dtype, accept_lens.dtype))
    safe = torch.where(idx < 0, idx + predict.numel(), idx)
    bonus = predict[safe].to(torch.int32) if bs else torch.empty(0, dtype=torch.int32, device=device)
    if not num_draft_tokens:
        return new_seq_lens, bonus
    last_steps = idx - rows * num_draft_tokens
    track_steps = None
    if mamba_track_interval:
        length = seq_lens.long()
        post = length + accepted
        crossing = length // mamba_track_interval != post // mamba_track_interval
        tracking = (post // mamba_track_interval * mamba_track_interval - length - 1).clamp_min(0)
        tracked = accept_index[rows, tracking.clamp_max(accept_index.shape[1] - 1)].long() - rows * num_draft_tokens
        track_steps = torch.where(crossing, tracked, torch.full_like(tracked, -1))
    correct = (accept_lens - 1).contiguous()
    select = rows * num_draft_tokens + accepted - 1
    ids = predict.reshape(-1).to(torch.int64).clone()
    return new_seq_lens, bonus, (last_steps, track_steps), (correct, select, ids)


def prepare_draft_extend_inputs(accept_lens, predict, num_draft_tokens):
    """(correct = accepted - 1, select = row * width + accepted - 1, ids = predict as int64)."""
    bs = accept_lens.numel()
    correct = (accept_lens - 1).to(accept_lens.dtype)
    select = torch.arange(bs, device=accept_lens.device) * num_draft_tokens + accept_lens.long() - 1
    return correct, select, predict.reshape(-1).to(torch.int64).clone()


def prepare_draft_extend_lengths(seq_lens, num_draft_tokens, front_offset):
    """(prefix = max(seq_len - front, 0) int32, extend = width + front int32, post = seq_len + width)."""
    prefix = (seq_lens.long() - front_offset).clamp_min(0).to(torch.int32)
    extend = torch.full_like(prefix, num_draft_tokens + front_offset)
    post = (seq_lens.long() + num_draft_tokens).to(seq_lens.dtype)
    return prefix, extend, post


def prepare_draft_extend_layout(seq_lens, num_draft_tokens, with_mrope):
    """prepare_draft_extend_lengths with front 0, plus (positions [bs*w] = seq_len + c, start_locs = row * w
    int32, mrope [3, bs*w] or None)."""
    bs = seq_lens.numel()
    prefix, extend, post = prepare_draft_extend_lengths(seq_lens, num_draft_tokens, 0)
    col = torch.arange(num_draft_tokens, device=seq_lens.device)
    positions = (prefix.long().view(-1, 1) + col[None, :]).flatten()
    starts = (torch.arange(bs, device=seq_lens.device) * num_draft_tokens).to(torch.int32)
    mrope = positions.view(1, -1).repeat(3, 1) if with_mrope else None
    return prefix, extend, post, (positions, starts, mrope)


def draft_topk1_postprocess(next_token_logits, positions, draft_tokens=None, draft_token_column: int = 0):
    """Argmax of each row (NaN treated as -1e30, first maximum wins), topk_p = 1; positions += 1 in place;
    the argmax is also written to draft_tokens[:, draft_token_column] when given."""
    logits = next_token_logits.float()
    logits = torch.where(logits == logits, logits, torch.full_like(logits, -1e30))
    index = logits.argmax(dim=-1).view(-1, 1).to(torch.int64)
    topk_p = torch.ones((logits.shape[0], 1), dtype=torch.float32, device=logits.device)
    if draft_tokens is not None:
        draft_tokens[:, draft_token_column] = index.view(-1)
    positions.add_(1)
    return topk_p, index


def draft_topk1_argmax_only(next_token_logits):
    scratch = torch.zeros(next_token_logits.shape[0], dtype=torch.long, device=next_token_logits.device)
    return draft_topk1_postprocess(next_token_logits, scratch)
