"""Start-up checks for a compressed KV pool: every refusal names what is supported instead.

Run on each model worker before memory sizing (the first moment the model config, the resolved attention
backends and the pool family are all known), so an unsupported setup fails before any allocation.
"""

from __future__ import annotations

import os

from sglang_ext import compat
from sglang_ext.kvcache.formats import SUPPORTED_ATTENTION_BACKENDS, resolve_kv_format, rotary_dim_of
from sglang_ext.kvformats.base import KVFormat

# (server_args attribute, value meaning "off", what the user asked for) -- features whose KV paths move or
# read the pool's bytes in a dense-layout way this package does not implement yet.
_UNSUPPORTED_FLAGS: tuple[tuple[str, object, str], ...] = (
    ("enable_lmcache", False, "--enable-lmcache"),
    ("enable_hisparse", False, "--enable-hisparse"),
    ("disaggregation_mode", "null", "--disaggregation-mode (PD disaggregation)"),
    ("enable_page_major_kv_layout", False, "--enable-page-major-kv-layout"),
    ("enable_unified_memory", False, "--enable-unified-memory"),
    ("enable_kv_cache_sharding", False, "--enable-kv-cache-sharding"),
    ("prefill_only_disable_kv_cache", False, "--prefill-only-disable-kv-cache"),
)

# Formats whose QSA sparse attention (qwen4_exp) runs off the CPU platform (hybrid/qsa.py, kernels/qsa_gather.py:
# gathers that write plain K/V, octave's un-rotated). A format added to KV_CACHE_DTYPES without them is refused.
QSA_GPU_FORMATS = ("int8", "octave_k3v4", "octave_k3v3")


def _one_of(names: tuple[str, ...]) -> str:
    """'a', 'a or b', 'a, b or c'."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def kv_format_for(kvc) -> KVFormat:
    """The format object for a KVCacheConfigurator whose kv_cache_dtype_str is an sglang-ext format."""
    mc = kvc.model_config
    head_dim = int(mc.head_dim)
    return resolve_kv_format(
        kvc.kv_cache_dtype_str,
        head_dim=head_dim,
        v_head_dim=int(mc.v_head_dim),
        rotary_dim=rotary_dim_of(mc.hf_text_config, head_dim),
        model=mc.model_path,
    )


def check_supported(kvc) -> KVFormat:
    """Raise ValueError for any setup the compressed pool cannot serve; return the format otherwise."""
    name = kvc.kv_cache_dtype_str
    flag = f"--kv-cache-dtype {name}"
    model = kvc.model_config.model_path
    if kvc.use_mla_backend:
        raise ValueError(
            f"{flag} supports multi-head / grouped-query attention models only; {model} uses MLA "
            "(use --kv-cache-dtype auto, fp8_e4m3 or fp4 for MLA models)"
        )
    if kvc.is_hybrid_swa:
        raise ValueError(
            f"{flag} supports full-attention models and linear-attention hybrids (Gated DeltaNet / Mamba layers "
            f"beside full attention); {model} has sliding-window attention layers (use --kv-cache-dtype auto)"
        )
    if kvc.mambaish_config is not None and getattr(kvc.model_config.hf_text_config, "indexer_n_heads", None):
        from sglang_ext.platform import cpu_platform_active

        # The CPU platform's sparse attention dequantizes the rows it selects (hybrid/qsa.py); on a GPU,
        # format-aware packers hand SGLang's sparse kernels plain model-dtype K/V (QSA_GPU_FORMATS), without
        # prefill context parallelism.
        if not cpu_platform_active():
            if name not in QSA_GPU_FORMATS:
                raise ValueError(
                    f"{flag} serves QSA sparse-attention hybrids ({model}) on the CPU platform only; on a GPU use "
                    f"--kv-cache-dtype {_one_of(QSA_GPU_FORMATS)} (or auto)"
                )
            parallel = compat.get_parallel()
            if getattr(parallel, "enable_prefill_cp", False) and getattr(parallel, "attn_cp_size", 1) > 1:
                raise ValueError(
                    f"{flag} does not support prefill context parallelism for QSA sparse-attention hybrids "
                    f"({model}) yet; run without it or with --kv-cache-dtype auto"
                )
    prefill, decode = compat.attention_backends()
    for phase, backend in (("prefill", prefill), ("decode", decode)):
        if backend is not None and backend not in SUPPORTED_ATTENTION_BACKENDS:
            raise ValueError(
                f"{flag}: the {phase} attention backend {backend!r} cannot read this format; supported: "
                f"{', '.join(SUPPORTED_ATTENTION_BACKENDS)} (--attention-backend triton on GPU, torch_native on CPU)"
            )
    server_args = kvc.server_args
    for attr, off, what in _UNSUPPORTED_FLAGS:
        value = getattr(server_args, attr, off)
        if value not in (off, None):
            raise ValueError(f"{flag} does not support {what} yet; run without it or with --kv-cache-dtype auto")
    if compat.get_parallel().attn_dcp_size > 1:
        raise ValueError(f"{flag} does not support decode context parallelism (--dcp-size > 1) yet")
    if getattr(server_args, "enable_hierarchical_cache", False):
        from sglang_ext.hicache.support import check_hicache_supported

        check_hicache_supported(name, server_args)
    if os.environ.get("SGLANG_USE_HND_KVCACHE", "").lower() in ("1", "true"):
        raise ValueError(f"{flag} needs the NHD KV layout; unset SGLANG_USE_HND_KVCACHE")
    return kv_format_for(kvc)
