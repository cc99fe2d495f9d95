"""Extend attention over a cached prefix on the CPU platform, without recomputing the prefix's queries.

SGLang 0.5.23's `torch_native` backend (the CPU platform's attention) handles an extend of m new tokens over a
cached prefix of p tokens by building a query tensor of all p + m rows (the first p uninitialised), running causal
SDPA over all of them, and keeping the last m rows. A warm agent turn (p = 2k cached, m = 20 new) therefore costs
as much attention as prefilling the whole history. Here only the m new rows are attended, with the causal mask
aligned to the end of the sequence (new row i sees keys 0 .. p + i): the same outputs, m x L work instead of L x L.

Installed (AROUND `_run_sdpa_forward_extend`) only on the portable CPU platform; cross-attention, encoder
lengths and sliding windows keep SGLang's own path.
"""

from __future__ import annotations

import torch
from torch.nn.functional import scaled_dot_product_attention


def prefix_causal_mask(prefix_len: int, new_len: int, device: torch.device) -> torch.Tensor:
    """[new_len, prefix_len + new_len] bool, True = attend: new row i sees keys 0 .. prefix_len + i."""
    cols = torch.arange(prefix_len + new_len, device=device)
    rows = prefix_len + torch.arange(new_len, device=device)
    return cols[None, :] <= rows[:, None]


def sdpa_extend_new_rows(query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                         extend_prefix_lens, extend_seq_lens, *, scaling, enable_gqa: bool, causal: bool) -> None:
    """`_run_sdpa_forward_extend` for decoder self-attention: query/output [T, Hq, D] (output written),
    k_cache/v_cache [slots, Hkv, D]; each request's new rows attend its cached prefix and its own new tokens."""
    seq = seq_lens.tolist()
    new = extend_seq_lens.tolist()
    prefix = extend_prefix_lens.tolist()
    start = 0
    for b in range(len(seq)):
        m, p, kv_len = new[b], prefix[b], seq[b]
        if m == 0:
            continue
        q = query[start:start + m].movedim(0, 1)  # [Hq, m, D]
        slots = req_to_token[req_pool_indices[b], :kv_len]
        k = k_cache[slots].movedim(0, 1)
        v = v_cache[slots].movedim(0, 1)
        if k.dtype != q.dtype:
            k, v = k.to(q.dtype), v.to(q.dtype)
        mask, is_causal = None, False
        if causal:
            if p == 0:
                is_causal = True
            else:
                mask = prefix_causal_mask(p, m, q.device)
        out = scaled_dot_product_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), attn_mask=mask,
                                           is_causal=is_causal, scale=scaling, enable_gqa=enable_gqa)
        output[start:start + m] = out.squeeze(0).movedim(0, 1)
        start += m


def run_sdpa_forward_extend(original, backend, query, output, k_cache, v_cache, req_to_token, req_pool_indices,
                            seq_lens, extend_prefix_lens, extend_seq_lens, encoder_lens=None, scaling=None,
                            enable_gqa=False, causal=False, is_cross_attn=False, sliding_window_size=None):
    """AROUND hook body: the new-rows-only path where it applies, SGLang's own otherwise."""
    if encoder_lens is not None or is_cross_attn or (sliding_window_size is not None and sliding_window_size > -1):
        return original(backend, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                        extend_prefix_lens, extend_seq_lens, encoder_lens, scaling=scaling, enable_gqa=enable_gqa,
                        causal=causal, is_cross_attn=is_cross_attn, sliding_window_size=sliding_window_size)
    sdpa_extend_new_rows(query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                         extend_prefix_lens, extend_seq_lens, scaling=scaling, enable_gqa=enable_gqa, causal=causal)
    return output
