"""Every SGLang 0.5.23 name sglang-ext depends on, in one place.

Public extension points (plugin loader, platform base classes) and private internals (hook targets, pool
classes) are all reached through this module, so a SGLang version bump is one file to read. Names are
resolved lazily (PEP 562): importing SGLang's memory-pool modules while SGLang is still choosing its
platform would re-enter platform discovery.
"""

import importlib

SGLANG_VERSION = "0.5.23"

# name -> "module:attribute", resolved on first access.
_LAZY = {
    # Plugin machinery (public).
    "HookRegistry": "sglang.srt.plugins.hook_registry:HookRegistry",
    "HookType": "sglang.srt.plugins.hook_registry:HookType",
    # Platform base classes (public extension point for out-of-tree platforms).
    "SRTPlatform": "sglang.srt.platforms.interface:SRTPlatform",
    "PlatformCapabilities": "sglang.srt.platforms.interface:PlatformCapabilities",
    "PlatformEnum": "sglang.srt.platforms.device_mixin:PlatformEnum",
    "CpuDeviceMixin": "sglang.srt.platforms.cpu:CpuDeviceMixin",  # CPU device ops: psutil memory, gloo
    # Internal: base class of the CPU HiCache host pool.
    "MHATokenToKVPoolHost": "sglang.srt.mem_cache.pool_host.mha:MHATokenToKVPoolHost",
}

# Hook targets (dotted paths into SGLang internals).
# Picks the HiCache host pool class for an MHA device pool; the CPU platform answers with its own pool.
HOOK_GET_MHA_HOST_POOL_CLS = "sglang.srt.mem_cache.pool_host.mha.get_mha_host_pool_cls"
# Argument parser construction and parsing (pp/server_args.py adds --pp-layer-partition; kvcache/ extends
# --kv-cache-dtype).
HOOK_SERVER_ARGS_ADD_CLI_ARGS = "sglang.srt.server_args.ServerArgs.add_cli_args"  # staticmethod (parser)
HOOK_SERVER_ARGS_FROM_CLI_ARGS = "sglang.srt.server_args.ServerArgs.from_cli_args"  # classmethod (cls, namespace)
# Read by sglang.srt.distributed.utils.get_pp_indices in every PP rank.
ENV_PP_LAYER_PARTITION = "SGLANG_PP_LAYER_PARTITION"
# Llama-family model (tied embeddings under PP): module with ParallelLMHead, add_prefix, get_parallel,
# default_weight_loader; its __init__ and load_weights; the checkpoint name of the tied matrix.
LLAMA_MODULE = "sglang.srt.models.llama"
HOOK_LLAMA_INIT = "sglang.srt.models.llama.LlamaForCausalLM.__init__"
HOOK_LLAMA_LOAD_WEIGHTS = "sglang.srt.models.llama.LlamaForCausalLM.load_weights"
LLAMA_EMBED_WEIGHT_NAME = "model.embed_tokens.weight"
# Resolves the parsed server arguments once, in the launcher, before anything is loaded: start-up checks run here.
HOOK_SERVER_ARGS_RESOLVE = "sglang.srt.server_args.ServerArgs.resolve_once"


# --- speculative decoding on the portable CPU platform (sglang_ext/spec/) ----------------------------------
# Functions replaced (HookRegistry REPLACE) by torch ops: their modules import on any platform, but on an
# out-of-tree platform these functions launch Triton kernels on CPU tensors or refuse the platform.
SPEC_OPS_MODULE = "sglang.kernels.ops.speculative"
HOOK_SPEC_VERIFY_TREE_GREEDY = f"{SPEC_OPS_MODULE}.spec_tree.verify_tree_greedy_func"
HOOK_SPEC_BUILD_TREE = f"{SPEC_OPS_MODULE}.spec_tree.build_tree_kernel_efficient_func"
HOOK_SPEC_FILL_FRONT_CACHE_LOC = f"{SPEC_OPS_MODULE}.cache_locs.fill_front_out_cache_loc_func"
HOOK_SPEC_ASSIGN_DRAFT_CACHE_LOCS = f"{SPEC_OPS_MODULE}.cache_locs.assign_draft_cache_locs_contiguous_func"
HOOK_SPEC_FILL_ACCEPT_CACHE_LOC = f"{SPEC_OPS_MODULE}.eagle.fill_accept_out_cache_loc_func"
HOOK_SPEC_FILL_BONUS_TOKENS = f"{SPEC_OPS_MODULE}.eagle.fill_bonus_tokens_func"
# EAGLE/NEXTN step helpers (Triton on every platform but SGLang's AMX CPU engine); same names in sglang_ext.spec.eagle_ops.
SPEC_EAGLE_HELPERS = {
    f"{SPEC_OPS_MODULE}.eagle": ("build_chain_tree", "prepare_verify_commit_outputs", "prepare_draft_extend_inputs",
                                 "prepare_draft_extend_lengths", "prepare_draft_extend_layout"),
    f"{SPEC_OPS_MODULE}.topk1": ("draft_topk1_postprocess", "draft_topk1_argmax_only"),
}
# Rejection sampling with draft probabilities (--speculative-use-rejection-sampling): a Triton kernel everywhere.
HOOK_SPEC_CHAIN_SAMPLING = f"{SPEC_OPS_MODULE}.reject_sampling.chain_speculative_sampling_triton"
# Writes newly allocated draft slots into req_to_token (spec decode allocation; Triton off the AMX CPU engine).
HOOK_SPEC_ASSIGN_REQ_TO_TOKEN = "sglang.srt.mem_cache.allocation.assign_req_to_token_pool_func"
# TreeMaskMode values passed to build_tree_kernel_efficient_func (FULL_MASK = 0, QLEN_ONLY = 1).
SPEC_TREE_MASK_FULL, SPEC_TREE_MASK_QLEN_ONLY = 0, 1
# Module that cannot be imported without sgl_kernel's CUDA (or CPU/AMX) build: it imports
# `sgl_kernel.speculative` at module level on every platform but XPU. The CPU platform provides a module of the
# same name with the one public function NGRAM calls.
SPEC_RECONSTRUCT_TREE_MODULE = f"{SPEC_OPS_MODULE}.reconstruct_tree"
SPEC_RECONSTRUCT_TREE_FN = "reconstruct_indices_from_tree_mask_func"
# Module attributes that are None on a platform without CUDA/HIP/NPU/MUSA kernels (resolved at import).
SPEC_NONE_ATTRS = {
    f"{SPEC_OPS_MODULE}.verify_sampling": ("tree_speculative_sampling_target_only",),
    "sglang.kernels.ops.sampling.renorm": ("top_k_renorm_prob", "top_p_renorm_prob"),
}
# Modules that bind those names with `from ... import` (they may be imported before the plugin loads, so their
# copies are patched too).
SPEC_NONE_ATTR_IMPORTERS = ("sglang.srt.speculative.eagle_utils", "sglang.srt.speculative.dflash_utils")
# TARGET_VERIFY through torch_native attention: forward_extend assumes a prefill batch.
HOOK_TORCH_NATIVE_FORWARD_EXTEND = (
    "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_extend")
# With speculative decoding the MHA pool warms up a Triton slot-row copy (used by move_kv_cache to move accepted
# drafts' KV); on the CPU platform the pool uses its own torch move (`use_native_move_kv_cache`) instead.
HOOK_MHA_POOL_INIT_KV_COPY = "sglang.srt.mem_cache.memory_pool.MHATokenToKVPool._init_kv_copy_and_warmup"
# EAGLE/NEXTN draft attention: the factory has no torch_native entry; sglang_ext.spec.draft_backends adds one.
HOOK_DRAFT_BACKEND_FACTORY_CREATE = "sglang.srt.speculative.draft_utils.DraftBackendFactory._create_backend"
_LAZY["TorchNativeAttnBackend"] = "sglang.srt.layers.attention.torch_native_backend:TorchNativeAttnBackend"
_LAZY["KVWriteLoc"] = "sglang.srt.mem_cache.memory_pool:KVWriteLoc"
# ------------------------------------------------------------------------------------------------------------


def set_hicache_host_memory_reserve(nbytes: int) -> None:
    """SGLang keeps 10 GiB of host RAM out of reach of the HiCache host pool (a module constant read at each
    sizing call, `pool_host/base.py`). Sized for GPU servers; the CPU platform lowers it."""
    module = importlib.import_module("sglang.srt.mem_cache.pool_host.base")
    if not hasattr(module, "HICACHE_HOST_MEMORY_RESERVE_BYTES"):
        raise RuntimeError("sglang internals changed: pool_host.base.HICACHE_HOST_MEMORY_RESERVE_BYTES is gone")
    module.HICACHE_HOST_MEMORY_RESERVE_BYTES = nbytes


def __getattr__(name: str):
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = target.split(":")
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value
