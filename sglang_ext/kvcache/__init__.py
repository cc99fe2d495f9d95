"""Compressed KV cache inside SGLang: `--kv-cache-dtype int8 | octave_k3v4 | octave_k3v3`.

The SGLang-facing side of `sglang_ext.kvformats`: the CLI values, memory sizing by the format's real bytes,
a device pool holding the format's planes (`pool.py`), and attention that reads those planes directly
(`torch_backend.py` on CPU, `triton_backend.py` on GPU). The radix cache is untouched: it stores slot
indices, and a slot means the same thing in the compressed pool. `hooks.py` lists every point where SGLang
is entered. See docs/kv-formats.md.
"""

from sglang_ext.kvcache.formats import KV_CACHE_DTYPES, SUPPORTED_ATTENTION_BACKENDS, is_compressed_kv_dtype

__all__ = ["KV_CACHE_DTYPES", "SUPPORTED_ATTENTION_BACKENDS", "is_compressed_kv_dtype", "register"]


def register() -> list[str]:
    """Install the hooks in this process (called by `sglang_ext.plugin` in every SGLang process)."""
    from sglang_ext.kvcache import hooks

    return hooks.register()
