"""KV bytes per token per KV head for a `--kv-cache-dtype` value. Core: never imports sglang.

SGLang's own dtypes are priced here the way its pool sizes them (K and V, scales included); any other name is
looked up in `sglang_ext.kvformats` (`get_format(name, head_dim, rotary_dim).bytes_per_token_head`).
"""

from __future__ import annotations

# Bytes per stored K or V element, block scales included (mxfp8: one e8m0 scale per 32 elements; the fp4
# recipes: one fp8 scale per 16 elements).
SGLANG_ELEMENT_BYTES = {
    "bf16": 2.0,
    "bfloat16": 2.0,
    "fp16": 2.0,
    "float16": 2.0,
    "fp8_e4m3": 1.0,
    "fp8_e5m2": 1.0,
    "mxfp8": 1.0 + 1.0 / 32.0,
    "nvfp4": 0.5 + 1.0 / 16.0,
    "fp4_mx_block16": 0.5 + 1.0 / 16.0,
}


def kv_bytes_per_token_head(
    kv_cache_dtype: str, head_dim: int, v_head_dim: int, rotary_dim: int, model_dtype_bytes: float = 2.0
) -> float:
    """Bytes one token occupies per KV head (K and V together). "auto" = the model's dtype.

    Raises ValueError naming the known dtypes when `kv_cache_dtype` is neither SGLang's nor a kvformats name.
    """
    if kv_cache_dtype == "auto":
        return (head_dim + v_head_dim) * model_dtype_bytes
    if kv_cache_dtype in SGLANG_ELEMENT_BYTES:
        return (head_dim + v_head_dim) * SGLANG_ELEMENT_BYTES[kv_cache_dtype]
    from sglang_ext.kvformats import FORMAT_NAMES, get_format  # torch import: only for our own formats

    if kv_cache_dtype not in FORMAT_NAMES:
        known = ["auto", *SGLANG_ELEMENT_BYTES, *FORMAT_NAMES]
        raise ValueError(f"unknown --kv-cache-dtype {kv_cache_dtype!r}; known: {', '.join(dict.fromkeys(known))}")
    return float(get_format(kv_cache_dtype, head_dim, rotary_dim).bytes_per_token_head)


def mla_kv_bytes_per_token(kv_cache_dtype: str, kv_dim: int, model_dtype_bytes: float = 2.0) -> float:
    """MLA stores one latent vector (kv_lora_rank + rope dims) per token per layer, not per head."""
    if kv_cache_dtype == "auto":
        return kv_dim * model_dtype_bytes
    if kv_cache_dtype in SGLANG_ELEMENT_BYTES:
        return kv_dim * SGLANG_ELEMENT_BYTES[kv_cache_dtype]
    raise ValueError(f"--kv-cache-dtype {kv_cache_dtype!r} is not priced for MLA models")
