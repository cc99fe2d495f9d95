"""Speculative decoding (NGRAM, NEXTN/MTP, EAGLE) on the portable CPU platform.

SGLang 0.5.23's speculative path calls CUDA-JIT / sgl_kernel / Triton ops. Here they are plain torch
(`tree_ops`, `verify_ops`, `cache_loc_ops`: no SGLang import, the spec of the Triton kernels in
`sglang_ext/kernels/spec_*.py`), installed into SGLang by `hooks.register()` from the plugin, plus target-verify
attention for the `torch_native` backend (`verify_attention`).
"""

# Algorithms the CPU platform answers `supports_speculative_algorithm` for (EAGLE-family and NGRAM).
SUPPORTED_ALGORITHMS = frozenset({"NGRAM", "NEXTN", "EAGLE", "EAGLE3"})


def register() -> list[str]:
    from sglang_ext.spec import hooks

    return hooks.register()
