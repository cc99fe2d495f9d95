"""`--attention-backend triton` on the portable CPU platform: Triton kernels run on CPU tensors only under
Triton's interpreter (TRITON_INTERPRET=1), which makes that backend usable for testing the GPU attention path
(SGLang's Triton metadata kernels and sglang-ext's compressed-KV kernels) on a machine without a GPU.

No SGLang import here: the check runs on the parsed server arguments.
"""

import os

from sglang_ext.env import TRITON_INTERPRET


def check_triton_interpreted(server_args) -> None:
    """Triton kernels launch on CPU tensors only under its interpreter: refuse a triton attention backend (target
    or draft) in one line unless TRITON_INTERPRET=1, instead of failing at the first request."""
    from sglang_ext.startup_checks import StartupError

    fields = ("attention_backend", "prefill_attention_backend", "decode_attention_backend",
              "speculative_draft_attention_backend")
    chosen = [f for f in fields if getattr(server_args, f, None) == "triton"]
    if chosen and os.environ.get(TRITON_INTERPRET) != "1":
        raise StartupError(f"--{chosen[0].replace('_', '-')} triton on the portable CPU platform needs "
                           f"{TRITON_INTERPRET}=1 (Triton's interpreter; slow, for testing the GPU path); "
                           "the CPU backend is torch_native (the default)")
