"""PortableGpuPlatform: SGLang's server on a GPU that torch and Triton drive (CUDA or ROCm torch), without
sgl_kernel, flashinfer or aiter.

It registers as an out-of-tree platform (PlatformEnum.OOT), so every fused op (RMSNorm, SiLU-and-mul, rotary,
top-k, ...) takes its `forward_native` torch path, while keeping SGLang's CUDA device operations (torch.cuda
memory queries, NCCL). Attention is SGLang's Triton backend (ours for the compressed KV formats), sampling is
SGLang's torch sampler, CUDA graphs stay on, custom all-reduce is off (NCCL only).

`activate()` (platform/__init__.py) installs the kernel-library guard (platform/kernel_guard.py) before it
returns this class, so SGLang's `sgl_kernel` imports meet the guard, never the library.
"""

import dataclasses

from sglang_ext import compat
from sglang_ext.platform.kernel_guard import PLATFORM_NAME

# SGLang's CUDA-graph backend names (model_executor/cuda_graph_config.py).
BREAKABLE_GRAPHS, NO_GRAPHS = "breakable", "disabled"


class PortableGpuPlatform(compat.CudaDeviceMixin, compat.SRTPlatform):
    _enum = compat.PlatformEnum.OOT
    device_name = "cuda"
    device_type = "cuda"
    capabilities = compat.PlatformCapabilities(supports_triton=True, graph_capture=True, supports_pynccl=True)

    def apply_server_args_defaults(self, server_args) -> None:
        """Fill defaults the user left unset; refuse choices that need a library this platform lacks."""
        server_args.device = "cuda"
        if server_args.attention_backend is None:
            server_args.attention_backend = "triton"
        if server_args.sampling_backend is None:
            server_args.sampling_backend = "pytorch"
        if server_args.moe_runner_backend == "auto":
            server_args.moe_runner_backend = "triton"
        if server_args.speculative_draft_attention_backend is None:
            server_args.speculative_draft_attention_backend = "triton"
        server_args.disable_custom_all_reduce = True  # sgl_kernel's custom all-reduce: NCCL instead
        # Linear attention (Qwen3.5-family hybrids): SGLang picks FlashInfer's GDN prefill by itself on SM90/SM100;
        # this platform keeps the Triton kernels unless the user chose otherwise.
        for field in LINEAR_ATTN_FIELDS:
            if getattr(server_args, field, None) is None and hasattr(server_args, field):
                setattr(server_args, field, "triton")
        # SGLang's prefill graphs ("breakable", its CUDA default) hold outputs through sgl_kernel's weak_ref_tensor,
        # which this platform does not provide; decode graphs ("full") stay on. A user's explicit choice is kept.
        graphs = server_args.cuda_graph_config
        if (server_args.cuda_graph_backend_prefill is None and graphs is not None
                and graphs.prefill.backend == BREAKABLE_GRAPHS):
            server_args.cuda_graph_config = dataclasses.replace(
                graphs, prefill=dataclasses.replace(graphs.prefill, backend=NO_GRAPHS))
        for field, allowed in SUPPORTED_BACKENDS.items():
            value = getattr(server_args, field)
            if value is not None and value not in allowed:
                raise ValueError(f"--{field.replace('_', '-')} {value} is not supported on the {PLATFORM_NAME} "
                                 f"platform; use {' or '.join(allowed)}")

    def get_default_attention_backend(self) -> str:
        return "triton"

    def get_default_speculative_draft_attention_backend(self, algorithm: str) -> str:
        return "triton"

    def get_dispatch_key_name(self) -> str:
        return "native"

    # CUDA graphs: SGLang stops an out-of-tree platform that names no runner (its in-tree fallback is keyed by
    # device name and would hand "cuda" its CUDA runner without asking). These are the runners SGLang uses on CUDA
    # with the Triton backend: they capture torch and Triton launches, which is all this platform runs.
    def get_graph_runner_cls(self):
        return compat.DecodeCudaGraphRunner

    def get_speculative_graph_runner_cls(self, algorithm: str, phase: str):
        if phase == "draft_decode":
            return compat.EAGLEDraftCudaGraphRunner
        if phase == "draft_extend":
            return compat.EAGLEDraftExtendCudaGraphRunner
        return None  # a phase this SGLang version does not have: run it eagerly

    # Hybrid models' radix cache with the overlap scheduler ("extra_buffer", SGLang's choice on CUDA): the state
    # snapshots are torch copies and SGLang's Triton conv / GDN kernels, the same code CUDA runs.
    def support_mamba_cache_extra_buffer(self) -> bool:
        return True

    # Speculative decoding: the Triton / torch ops of sglang_ext/spec are installed by its register() (plugin).
    def supports_speculative_algorithm(self, algorithm: str) -> bool:
        from sglang_ext.spec import SUPPORTED_ALGORITHMS

        return algorithm.upper() in SUPPORTED_ALGORITHMS


# Linear-attention kernel choices this platform sets to "triton" when the user left them unset.
LINEAR_ATTN_FIELDS = ("linear_attn_prefill_backend", "linear_attn_decode_backend", "linear_attn_verify_backend")

# Backends that reach only torch / Triton code on this platform.
SUPPORTED_BACKENDS = {
    "attention_backend": ("triton",),
    "sampling_backend": ("pytorch",),
    "moe_runner_backend": ("triton",),
}
