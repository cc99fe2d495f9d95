"""Target-verify attention for SGLang's `torch_native` backend (the CPU platform's attention).

SGLang 0.5.23's `TorchNativeAttnBackend.forward_extend` reads `extend_prefix_lens` / `extend_seq_lens`, which a
TARGET_VERIFY batch does not set, and applies a plain causal mask, which is wrong for a draft tree whose nodes
must see only their ancestors. In TARGET_VERIFY every request contributes `n` draft rows (n = draft_token_num);
its keys are the committed prefix (req_to_token[req, :seq_len]) followed by the n drafts (written to
`out_cache_loc` first), and `spec_info.custom_mask` says which drafts each draft sees.

Mask layouts (SGLang `TreeMaskMode`): FULL_MASK, per request an [n, seq_len + n] row-major block, blocks
concatenated in batch order; QLEN_ONLY, per request an [n, n] block over the drafts alone (prefix all visible).
No mask means a chain: causal over the drafts.
"""

import torch
from torch.nn.functional import scaled_dot_product_attention

from sglang_ext.platform import batch_invariant


def draft_masks(custom_mask: torch.Tensor | None, seq_lens: list[int], n: int, device) -> list[torch.Tensor]:
    """Per request the bool [n, seq_len + n] visibility of its keys from its draft rows."""
    full = sum(n * (s + n) for s in seq_lens)
    qlen = len(seq_lens) * n * n
    out, offset = [], 0
    for s in seq_lens:
        prefix = torch.ones((n, s), dtype=torch.bool, device=device)
        if custom_mask is None:
            tree = torch.ones((n, n), dtype=torch.bool, device=device).tril()
        elif custom_mask.numel() == full:
            block = custom_mask[offset:offset + n * (s + n)].view(n, s + n).bool()
            offset += n * (s + n)
            out.append(block)
            continue
        elif custom_mask.numel() == qlen:
            tree = custom_mask[offset:offset + n * n].view(n, n).bool()
            offset += n * n
        else:
            raise ValueError(f"target-verify mask of {custom_mask.numel()} entries matches neither FULL_MASK "
                             f"({full}) nor QLEN_ONLY ({qlen}) for seq_lens {seq_lens}, n {n}")
        out.append(torch.cat((prefix, tree), dim=1))
    return out


def target_verify_attention(
    q: torch.Tensor,  # [bs * n, q_heads * head_dim]
    k_cache: torch.Tensor,  # [slots, kv_heads, head_dim]
    v_cache: torch.Tensor,  # [slots, kv_heads, v_head_dim]
    req_to_token: torch.Tensor,  # int32 [max_reqs, max_context]
    req_pool_indices: torch.Tensor,  # int [bs]
    seq_lens: torch.Tensor,  # int [bs]: committed tokens, drafts excluded
    out_cache_loc: torch.Tensor,  # int [bs * n]: slots of the drafts (already written)
    custom_mask: torch.Tensor | None,
    n: int,
    q_heads: int,
    scaling: float,
) -> torch.Tensor:
    """Returns [bs * n, q_heads * v_head_dim]."""
    head_dim = k_cache.shape[-1]
    bs = seq_lens.numel()
    if q.shape[0] != bs * n:
        raise ValueError(f"target verify: {q.shape[0]} query rows for {bs} requests x {n} drafts")
    lens = seq_lens.tolist()
    masks = draft_masks(custom_mask, lens, n, q.device)
    qh = q.view(bs, n, q_heads, head_dim)
    out = q.new_empty((bs * n, q_heads, v_cache.shape[-1]))
    enable_gqa = q_heads != k_cache.shape[1]
    for b in range(bs):
        slots = torch.cat((req_to_token[req_pool_indices[b], :lens[b]].long(),
                           out_cache_loc[b * n:(b + 1) * n].long()))
        if batch_invariant.rows_alone():
            _rows_as_decode(q.view(bs * n, q_heads, head_dim), out, k_cache, v_cache, slots, masks[b], b * n,
                            scaling, enable_gqa)
            continue
        key = k_cache[slots].to(q.dtype).transpose(0, 1)  # [kv_heads, keys, head_dim]
        value = v_cache[slots].to(q.dtype).transpose(0, 1)
        o = scaled_dot_product_attention(qh[b].transpose(0, 1).unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0),
                                         attn_mask=masks[b], scale=scaling, enable_gqa=enable_gqa)
        out[b * n:(b + 1) * n] = o.squeeze(0).transpose(0, 1)
    return out.view(bs * n, -1)


def _rows_as_decode(q3, out, k_cache, v_cache, slots, mask, first_row, scaling, enable_gqa) -> None:
    """Batch-invariant mode: each draft row attends alone over the keys it sees, with the same SDPA call (shapes,
    strides, arguments) as SGLang's torch_native decode (`_run_sdpa_forward_decode`) for that token."""
    query = q3.movedim(0, 1)  # [q_heads, rows, head_dim], as decode views its queries
    for j in range(mask.shape[0]):
        row = first_row + j
        key = k_cache[slots[mask[j]]].movedim(0, 1)
        value = v_cache[slots[mask[j]]].movedim(0, 1)
        per_row_query = query[:, row:row + 1, :]
        if not (per_row_query.dtype == key.dtype == value.dtype):
            key, value = key.to(per_row_query.dtype), value.to(per_row_query.dtype)
        o = scaled_dot_product_attention(per_row_query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0),
                                         attn_mask=None, enable_gqa=enable_gqa, scale=scaling, is_causal=False)
        out[row:row + 1] = o.squeeze(0).movedim(1, 0)
