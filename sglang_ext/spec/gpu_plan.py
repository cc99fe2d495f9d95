"""Which of our speculative-decoding ops replace SGLang 0.5.23's on a GPU platform. Pure: no SGLang import.

What SGLang 0.5.23 runs on CUDA and HIP for each op we have (sglang/kernels/ops/speculative, .../sampling/renorm.py,
srt/speculative/eagle_utils.py):

| op (our name)  | CUDA                                         | HIP                                                  |
| build_tree     | JIT C++ (speculative/tree.cuh, nvcc)         | the same source through hipcc                        |
| reconstruct    | JIT C++ (tree.cuh)                           | the same, hipcc                                      |
| verify_greedy  | JIT C++ (tree.cuh)                           | the same, hipcc                                      |
| tree_sampling  | JIT C++ (sampling.cuh), FlashInfer headers   | None: eagle_sample verifies every request greedily   |
|                |                                              | (`_verify_uses_greedy`) unless rejection sampling    |
|                |                                              | with draft probabilities is on                       |
| renorm         | FlashInfer (imported at first call)          | SGLang's Triton renorm                               |

The KV-slot ops, bonus-token fill, EAGLE step helpers and chain rejection sampling are SGLang Triton kernels on both
platforms and are never replaced on a GPU.

Modes (`SGLANG_EXT_SPEC_GPU_OPS`): "auto" installs ours only where SGLang's op is missing or greedy-only: on HIP
tree sampling (and greedy-only verification is lifted); on CUDA tree sampling and renorm when FlashInfer is not
installed (both need it). "all" installs every op above on either platform (e.g. CUDA machines without the CUDA
toolkit the JIT builds need). "off" installs none.
"""

from __future__ import annotations

MODES = ("auto", "all", "off")
PLATFORMS = ("cuda", "hip")
# op -> implementation we install for it on a GPU
IMPLEMENTATION = {
    "build_tree": "triton",
    "reconstruct": "triton",
    "verify_greedy": "triton",
    "tree_sampling": "triton",
    "renorm": "torch",  # no Triton kernel: the torch ops run on the GPU tensors
}
# Not an op: stop eagle_sample from forcing greedy verification on HIP (only with our tree sampling installed).
LIFT_HIP_GREEDY = "lift_hip_greedy"


def plan(platform: str, mode: str, flashinfer_installed: bool) -> dict[str, str]:
    """{op: implementation} to install, plus {LIFT_HIP_GREEDY: "hook"} where it applies."""
    if platform not in PLATFORMS:
        raise ValueError(f"GPU platform {platform!r}: expected one of {', '.join(PLATFORMS)}")
    if mode not in MODES:
        raise ValueError(f"SGLANG_EXT_SPEC_GPU_OPS={mode!r}: expected one of {', '.join(MODES)}")
    if mode == "off":
        return {}
    if mode == "all":
        ops = list(IMPLEMENTATION)
    elif platform == "hip":
        ops = ["tree_sampling"]
    else:
        ops = [] if flashinfer_installed else ["tree_sampling", "renorm"]
    chosen = {op: IMPLEMENTATION[op] for op in ops}
    if platform == "hip" and "tree_sampling" in chosen:
        chosen[LIFT_HIP_GREEDY] = "hook"
    return chosen
