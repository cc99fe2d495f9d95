"""Hybrid linear-attention models (Gated DeltaNet + full attention: Qwen3.5, Qwen3-Next, qwen4_exp).

`ops/` holds torch implementations of the ops SGLang's Gated DeltaNet path calls, for machines where SGLang only
has CUDA/Triton kernels for them (the portable CPU platform). `ops/` never imports SGLang.
"""


def register() -> list[str]:
    """Install the torch GDN ops on the portable CPU platform (called by `sglang_ext.plugin` in every process)."""
    from sglang_ext.hybrid import hooks

    return hooks.register()
