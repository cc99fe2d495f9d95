"""One SGLang process on a faked GPU under the portable GPU platform (run by test_portable_gpu.py).

argv[1]: "cuda" (an H200) or "hip" (an RX 7900 XTX, gfx1100, chosen by the platform itself); argv[2]: a model
folder; argv[3] (optional): a hybrid checkpoint folder. Only torch's device queries are faked (availability, name, capability, properties, and torch.version for a
ROCm build). flashinfer and DeepGEMM are made absent, as on a bare GPU machine; sgl_kernel is installed here and
must never be loaded; aiter is not installed here, and SGLang imports it unconditionally on ROCm. Prints one JSON line: the platform SGLang resolved, its server-argument defaults, what
`sgl_kernel` is in this process, the served modules that failed to import, and two refusals (one line each).
"""

import importlib
import importlib.abc
import importlib.util
import json
import sys
import types

import torch

device, model = sys.argv[1], sys.argv[2]
hybrid = sys.argv[3] if len(sys.argv) > 3 else None  # a Qwen3.5-style hybrid checkpoint folder
ABSENT = ("flashinfer", "deep_gemm", "deep_ep", "sgl_flash_mla", "flash_mla")


class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] in ABSENT:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


sys.meta_path.insert(0, Absent())
_find_spec = importlib.util.find_spec
importlib.util.find_spec = lambda name, package=None: (
    None if name.partition(".")[0] in ABSENT else _find_spec(name, package))

name, cap, arch = ("NVIDIA H200", (9, 0), "") if device == "cuda" else ("AMD Radeon RX 7900 XTX", (11, 0), "gfx1100")
props = types.SimpleNamespace(total_memory=24 << 30, name=name, major=cap[0], minor=cap[1],
                              multi_processor_count=96, gcnArchName=f"{arch}:sramecc-:xnack-", warp_size=32)
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 1
torch.cuda.current_device = lambda: 0
torch.cuda.get_device_name = lambda device=None: name
torch.cuda.get_device_capability = lambda device=None: cap
torch.cuda.get_device_properties = lambda device=None: props
if device == "hip":
    torch.version.hip, torch.version.cuda = "6.4.0", None

from sglang.srt.platforms import current_platform

SERVED = [
    "sglang.srt.models.llama", "sglang.srt.models.qwen3", "sglang.srt.models.qwen3_moe", "sglang.srt.models.qwen3_5",
    "sglang.srt.layers.attention.triton_backend", "sglang.srt.layers.attention.hybrid_linear_attn_backend",
    "sglang.srt.layers.moe.fused_moe_triton.layer", "sglang.srt.layers.sampler", "sglang.srt.mem_cache.radix_cache",
    "sglang.srt.mem_cache.memory_pool_host", "sglang.srt.managers.cache_controller",
    "sglang.srt.speculative.eagle_worker_v2", "sglang.srt.speculative.ngram_worker",
    "sglang.srt.model_executor.model_runner", "sglang.srt.managers.scheduler", "sglang.launch_server",
    # what launch_server's run_server imports when it starts (not at its own import)
    "sglang.srt.entrypoints.http_server", "sglang.srt.managers.tokenizer_manager",
    "sglang.srt.managers.detokenizer_manager",
]
failed = {}
for module in SERVED:
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 (reported; the test fails on any)
        failed[module] = f"{type(exc).__name__}: {exc}"

from sglang.srt.arg_groups.model_override_base import resolving_view
from sglang.srt.server_args import prepare_server_args
from sglang.srt.utils.common import assert_pkg_version

FIELDS = ("device", "attention_backend", "sampling_backend", "moe_runner_backend",
          "speculative_draft_attention_backend", "disable_cuda_graph", "disable_custom_all_reduce")


def resolved(extra, model_path=model):
    args = prepare_server_args(["--model-path", model_path, *extra])
    args.resolve_once()
    view = resolving_view(args)
    graphs = view.cuda_graph_config
    return {**{field: getattr(view, field) for field in FIELDS},
            "graphs": [graphs.decode.backend, graphs.prefill.backend]}


def hybrid_resolved():
    """A hybrid's Mamba radix-cache strategy and linear-attention kernels with SGLang's defaults (overlap on)."""
    args = prepare_server_args(["--model-path", hybrid])
    args.resolve_once()
    view = resolving_view(args)
    return {field: getattr(view, field) for field in (
        "mamba_radix_cache_strategy", "disable_overlap_schedule", "linear_attn_prefill_backend",
        "linear_attn_decode_backend", "linear_attn_verify_backend")}


def hybrid_float32():
    """What the launcher says to a hybrid with --dtype float32 once the plugins are loaded (SGLang's GPU prefill
    kernel for Gated DeltaNet asserts bf16 / fp16 at the first prefill)."""
    from sglang.srt.plugins import load_plugins

    load_plugins()
    args = prepare_server_args(["--model-path", hybrid, "--dtype", "float32"])
    try:
        args.resolve_once()
    except SystemExit as exc:
        return getattr(exc, "message", f"exit {exc.code}")
    return None


def refusal(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 (the refusal is the result)
        return f"{type(exc).__name__}: {exc}"
    return None


import aiter
import sgl_kernel
import sgl_kernel.kvcacheio


def dual_gemm_mode():
    """DualGemm's choice for a bf16 gate/up projection on a CUDA device once the plugins' hooks are applied (SGLang
    picks its CuTe DSL kernel, which needs nvidia-cutlass-dsl; the platform keeps the unfused path)."""
    from sglang.srt.layers import dual_gemm
    from sglang.srt.plugins import load_plugins

    load_plugins()
    dual_gemm.is_cuda = lambda: True  # what SGLang reads on an NVIDIA GPU
    gemm = object.__new__(dual_gemm.DualGemm)
    try:
        return repr(dual_gemm.DualGemm._select_mode(gemm, None, 256))
    except Exception as exc:  # noqa: BLE001 (reported: the test expects None)
        return f"{type(exc).__name__}: {exc}"


def flashmla_backend():
    """What SGLang's EAGLE worker imports on a CUDA device to list the draft-extend graph backends (flash_mla is
    absent here, as on a bare GPU machine), and what choosing that backend says."""
    from sglang.srt.plugins import load_plugins

    load_plugins()
    try:  # the two lazy imports of EAGLEWorkerV2._capture_cuda_graphs on a CUDA device
        from sglang.srt.layers.attention.flashattention_backend import FlashAttentionBackend  # noqa: F401
        from sglang.srt.layers.attention.flashmla_backend import FlashMLABackend
    except Exception as exc:  # noqa: BLE001 (reported: the test expects the import to work)
        return {"import": f"{type(exc).__name__}: {exc}"}
    return {"import": "ok", "construct": refusal(lambda: FlashMLABackend(None))}


print(json.dumps({
    "platform": type(current_platform).__name__,
    "out_of_tree": current_platform.is_out_of_tree(),
    "defaults": resolved([]),
    "user_choice_kept": resolved(["--disable-cuda-graph"])["disable_cuda_graph"],
    "user_prefill_graphs": resolved(["--cuda-graph-backend-prefill", "breakable"])["graphs"],
    "sgl_kernel": type(sgl_kernel).__name__,
    "aiter": type(aiter).__name__,
    "silu_and_mul": f"{sgl_kernel.silu_and_mul.__module__}.{sgl_kernel.silu_and_mul.__name__}",
    "failed_imports": failed,
    "sgl_kernel_version_check": refusal(lambda: assert_pkg_version("sglang-kernel", "99.0", "")),
    "unprovided_call": refusal(lambda: sgl_kernel.kvcacheio.transfer_kv_per_layer(None)),
    "flashinfer_backend": refusal(lambda: resolved(["--attention-backend", "flashinfer"])),
    "hybrid": None if hybrid is None else (refusal(hybrid_resolved) or hybrid_resolved()),
    "dual_gemm_mode": dual_gemm_mode(),
    "flashmla_backend": flashmla_backend(),
    "hybrid_float32": None if hybrid is None else hybrid_float32(),
    "graph_runners": {
        "decode": getattr(current_platform.get_graph_runner_cls(), "__name__", None),
        **{phase: getattr(current_platform.get_speculative_graph_runner_cls("EAGLE", phase), "__name__", None)
           for phase in ("draft_decode", "draft_extend")}},
}))
