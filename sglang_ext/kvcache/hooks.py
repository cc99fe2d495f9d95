"""Where the compressed KV formats enter SGLang: one hook per decision SGLang makes about the KV cache.

Each hook passes through to SGLang's own code unless `--kv-cache-dtype` is one of `KV_CACHE_DTYPES`:
  CLI            `--kv-cache-dtype` choices and help gain the three formats.
  dtype          the string resolves to (name, model dtype): the model computes K/V in its own dtype.
  checks         before sizing, `support.check_supported` refuses what the pool cannot serve.
  sizing         bytes per token = KV heads x layers x the format's bytes per (token, head).
  pool           `CompressedMHATokenToKVPool` instead of the dense MHA pool; in SGLang's hybrid linear-attention
                 pool, the class of its full-attention sub-pool (the Mamba state pool stays SGLang's).
  attention      triton / torch_native become the compressed-pool backends; any other backend is refused.
"""

from __future__ import annotations

import logging

from sglang_ext import compat, hook_chain
from sglang_ext.kvcache.formats import KV_CACHE_DTYPES, SUPPORTED_ATTENTION_BACKENDS, is_compressed_kv_dtype

_T_ADD_CLI_ARGS = compat.HOOK_SERVER_ARGS_ADD_CLI_ARGS
_T_CONFIGURE_DTYPE = compat.HOOK_CONFIGURE_KV_CACHE_DTYPE
_T_CONFIGURE_POOLS = compat.HOOK_KV_CACHE_CONFIGURE
_T_CELL_SIZE = compat.HOOK_POOL_CELL_SIZE
_T_BUILD_MHA_POOL = compat.HOOK_BUILD_MHA_KV_POOL
_T_HYBRID_FULL_POOL_CLASS = compat.HOOK_HYBRID_FULL_ATTENTION_POOL_CLASS
_T_BUILD_ATTENTION = compat.HOOK_BUILD_FULL_ATTENTION_BACKEND

logger = logging.getLogger(__name__)

CLI_HELP_SUFFIX = (
    f" sglang-ext adds {', '.join(repr(n) for n in KV_CACHE_DTYPES)}: compressed KV (8, ~4 and ~3.5 bits per "
    "element) read directly by the triton (GPU) and torch_native (CPU) attention backends; see docs/kv-formats.md."
)


def _extend_kv_cache_dtype_flag(result, parser, *args, **kwargs):
    # argparse keeps the action objects; `_actions` is the stdlib's (stable) list of them.
    for action in parser._actions:
        if action.dest == "kv_cache_dtype":
            if action.choices is not None:
                action.choices = [*action.choices, *(n for n in KV_CACHE_DTYPES if n not in action.choices)]
            if CLI_HELP_SUFFIX not in (action.help or ""):
                action.help = (action.help or "") + CLI_HELP_SUFFIX
            return None
    raise RuntimeError("sglang-ext: SGLang's parser has no --kv-cache-dtype; this SGLang version is not supported")


def _configure_kv_cache_dtype(original, *args, **kwargs):
    requested = kwargs.get("server_args_kv_cache_dtype")
    if kwargs.get("is_draft_worker") and kwargs.get("speculative_draft_kv_cache_dtype") is not None:
        requested = kwargs["speculative_draft_kv_cache_dtype"]
    if is_compressed_kv_dtype(requested):
        # The pool stores the format's planes; every tensor SGLang sees from it is in the model dtype.
        return requested, kwargs["model_dtype"]
    return original(*args, **kwargs)


def _check_before_configure(kvc, *args, **kwargs):
    if is_compressed_kv_dtype(kvc.kv_cache_dtype_str):
        from sglang_ext.kvcache.support import check_supported

        fmt = check_supported(kvc)
        logger.info(
            "sglang-ext KV format %s: %d bytes per token per KV head (%.2f bits per element), backends %s",
            fmt.name,
            fmt.bytes_per_token_head,
            fmt.bits_per_element,
            "/".join(SUPPORTED_ATTENTION_BACKENDS),
        )
    return None


def _compute_cell_size(original, self, kvc, num_layers, *args, **kwargs):
    if not is_compressed_kv_dtype(kvc.kv_cache_dtype_str):
        return original(self, kvc, num_layers, *args, **kwargs)
    from sglang_ext.kvcache.support import kv_format_for

    parallel = compat.get_parallel()
    kv_heads = kvc.model_config.get_num_kv_heads(parallel.attn_tp_size, parallel.attn_dcp_size)
    fmt = kv_format_for(kvc)
    cell_size = kv_heads * num_layers * fmt.bytes_per_token_head
    # qwen4_exp's QSA index caches (SGLang's own dtype) sit beside the full-attention K/V: SGLang's bytes for them.
    cell_size += getattr(self, compat.POOL_QSA_CELL_SIZE)(hf_config=kvc.model_config.hf_config, num_layers=num_layers)
    logger.info("sglang-ext KV sizing: %s cell size %d bytes per token", fmt.name, cell_size)
    return cell_size


def _build_mha_kv_pool(original, self, *args, **kwargs):
    if not is_compressed_kv_dtype(self.kv_cache_dtype_str):
        return original(self, *args, **kwargs)
    from sglang_ext.kvcache.pool import CompressedMHATokenToKVPool
    from sglang_ext.kvcache.support import kv_format_for

    parallel = compat.get_parallel()
    mc = self.model_config
    return CompressedMHATokenToKVPool(
        kwargs["max_total_num_tokens"],
        page_size=self.pool_page_size,
        dtype=self.kv_cache_dtype,
        head_num=mc.get_num_kv_heads(parallel.attn_tp_size, parallel.attn_dcp_size),
        head_dim=mc.head_dim,
        v_head_dim=mc.v_head_dim,
        layer_num=self.layer_info.num_effective_layers,
        device=self.device,
        enable_memory_saver=compat.get_exec().features.enable_memory_saver,
        start_layer=self.layer_info.start_layer,
        end_layer=self.layer_info.end_layer,
        enable_alt_stream=False,
        enable_kv_cache_copy=compat.get_spec().speculative_algorithm is not None,
        kv_format=kv_format_for(self),
    )


def _hybrid_full_attention_pool_class(original, self, *args, **kwargs):
    if not is_compressed_kv_dtype(self.kv_cache_dtype_str):
        return original(self, *args, **kwargs)
    from sglang_ext.kvcache.hybrid_pool import full_pool_factory
    from sglang_ext.kvcache.support import kv_format_for

    return full_pool_factory(kv_format_for(self))


def _build_attention_backend(original, *args, **kwargs):
    from sglang_ext.kvcache.hybrid_pool import compressed_pool_of

    runner = kwargs["model_runner"]
    backend = kwargs["backend_str"]
    pool = compressed_pool_of(getattr(runner, "token_to_kv_pool", None))
    if pool is None:
        return original(*args, **kwargs)
    runner.init_new_workspace = kwargs.get("init_new_workspace", False)
    if backend == "torch_native":
        from sglang_ext.kvcache.torch_backend import CompressedTorchNativeAttnBackend

        return CompressedTorchNativeAttnBackend(runner)
    if backend == "triton":
        from sglang_ext.kvcache.triton_backend import CompressedTritonAttnBackend

        return CompressedTritonAttnBackend(runner)
    raise ValueError(
        f"--kv-cache-dtype {pool.kv_format.name}: attention backend {backend!r} cannot read this format; "
        f"supported: {', '.join(SUPPORTED_ATTENTION_BACKENDS)}"
    )


def register() -> list[str]:
    """Register the hooks (HookRegistry applies them after all plugins ran). Returns what was registered."""
    hook_chain.register(_T_ADD_CLI_ARGS, _extend_kv_cache_dtype_flag, compat.HookType.AFTER)
    hook_chain.register(_T_CONFIGURE_DTYPE, _configure_kv_cache_dtype, compat.HookType.AROUND)
    hook_chain.register(_T_CONFIGURE_POOLS, _check_before_configure, compat.HookType.BEFORE)
    hook_chain.register(_T_CELL_SIZE, _compute_cell_size, compat.HookType.AROUND)
    hook_chain.register(_T_BUILD_MHA_POOL, _build_mha_kv_pool, compat.HookType.AROUND)
    hook_chain.register(_T_HYBRID_FULL_POOL_CLASS, _hybrid_full_attention_pool_class, compat.HookType.AROUND)
    hook_chain.register(_T_BUILD_ATTENTION, _build_attention_backend, compat.HookType.AROUND)
    return [f"kv-cache-dtype {'/'.join(KV_CACHE_DTYPES)}"]
