"""Speculative decoding (NGRAM, NEXTN/MTP, EAGLE): SGLang's path with our ops where SGLang's cannot run.

SGLang 0.5.23's speculative path calls CUDA-JIT / sgl_kernel / FlashInfer / Triton ops. The torch ops here
(`tree_ops`, `verify_ops`, `cache_loc_ops`, `eagle_ops`: no SGLang import, the spec of the Triton kernels in
`sglang_ext/kernels/spec_*.py`) serve the portable CPU platform, with target-verify attention for `torch_native`
(`verify_attention`); on CUDA/HIP the Triton kernels replace SGLang's ops where `gpu_plan` says. `hooks.register()`
installs either from the plugin, through the shared adapters of `adapters.py`.
"""

# Algorithms the CPU platform answers `supports_speculative_algorithm` for (EAGLE-family and NGRAM).
SUPPORTED_ALGORITHMS = frozenset({"NGRAM", "NEXTN", "EAGLE", "EAGLE3"})


def register() -> list[str]:
    from sglang_ext.spec import hooks

    return hooks.register()
