"""Which `--kv-cache-dtype` values are sglang-ext formats, and the format object for a model.

Pure: imports `sglang_ext.kvformats` only, so the mapping and its errors are testable without SGLang.
"""

from __future__ import annotations

from sglang_ext.kvformats import get_format
from sglang_ext.kvformats.base import KVFormat

# The `--kv-cache-dtype` values this package adds; each is also the kvformats registry name.
KV_CACHE_DTYPES: tuple[str, ...] = ("int8", "octave_k3v4", "octave_k3v3")

# Attention backends that read the compressed pool directly: triton (GPU, our Triton kernels) and
# torch_native (CPU, the torch reference over the slots a batch touches).
SUPPORTED_ATTENTION_BACKENDS: tuple[str, ...] = ("triton", "torch_native")


def is_compressed_kv_dtype(kv_cache_dtype: str | None) -> bool:
    return kv_cache_dtype in KV_CACHE_DTYPES


def rotary_dim_of(hf_text_config, head_dim: int) -> int:
    """Dimensions of each head that RoPE rotates (all of them unless the config says partial)."""
    rotary_dim = getattr(hf_text_config, "rotary_dim", None)
    if rotary_dim:
        return int(rotary_dim)
    factor = getattr(hf_text_config, "partial_rotary_factor", None) or 1.0
    return int(head_dim * factor)


def resolve_kv_format(kv_cache_dtype: str, *, head_dim: int, v_head_dim: int, rotary_dim: int, model: str) -> KVFormat:
    """The format object for `--kv-cache-dtype kv_cache_dtype` on a model with these head sizes.

    Raises ValueError naming what is supported when the model's heads do not fit the format.
    """
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"--kv-cache-dtype {kv_cache_dtype!r} is not an sglang-ext format; those are {KV_CACHE_DTYPES}")
    if head_dim != v_head_dim:
        raise ValueError(
            f"--kv-cache-dtype {kv_cache_dtype} needs equal K and V head sizes; model {model} has "
            f"head_dim={head_dim}, v_head_dim={v_head_dim}"
        )
    try:
        return get_format(kv_cache_dtype, head_dim, rotary_dim)
    except ValueError as exc:
        # from None: the message already carries the format's reason; one ValueError line in the traceback
        raise ValueError(f"--kv-cache-dtype {kv_cache_dtype} cannot serve model {model}: {exc}") from None
