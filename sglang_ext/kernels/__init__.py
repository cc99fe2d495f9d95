"""Triton kernels over the KV formats of sglang_ext.kvformats. Core code: never imports sglang.

    store_kv(fmt, planes, loc, k, v)
    decode_attention(fmt, q, planes, o, kv_indptr, kv_indices, sm_scale, num_kv_splits=None, max_kv_splits=16,
                     page_size=1, logit_cap=0.0, ...tuning knobs)
    extend_attention(fmt, q_extend, k_extend, v_extend, o_extend, planes, qo_indptr, kv_indptr, kv_indices,
                     max_len_extend, sm_scale, is_causal=True, page_size=1, logit_cap=0.0, ...tuning knobs)
    dequantize_tokens(fmt, planes, loc) -> (k, v)
"""

from .decode import decode_attention
from .dequant import dequantize_tokens
from .extend import extend_attention
from .store import store_kv

__all__ = ["decode_attention", "dequantize_tokens", "extend_attention", "store_kv"]
