"""Installs our speculative-decoding ops into SGLang (from the plugin), through HookRegistry and import patches.

On the portable CPU platform: every op SGLang's speculative path needs, as torch ops, plus target-verify
attention for `torch_native`. On CUDA / HIP: the Triton kernels that `gpu_plan.plan` selects for the platform and
`SGLANG_EXT_SPEC_GPU_OPS`. Both go through the same SGLang-signature adapters (`adapters.py`). The GPU install is
unit-tested for what it registers (tests/spec/test_spec_gpu_install.py); SGLang itself does not run on the GPU
machines this project has, so it has not been exercised end to end.
"""

import importlib.util
import logging
import os
import types
from collections.abc import Callable

import torch

from sglang_ext import compat, env, hook_chain
from sglang_ext.import_patch import after_import, provide_module
from sglang_ext.platform import cpu_platform_active
from sglang_ext.spec import adapters, eagle_ops, gpu_plan
from sglang_ext.spec.draft_backends import add_torch_native, compressed_triton_draft
from sglang_ext.spec.verify_attention import target_verify_attention

logger = logging.getLogger(__name__)

_registered = False


def _forward_extend(original, self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
    if not forward_batch.forward_mode.is_target_verify():
        return original(self, q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
    if save_kv_cache and k is not None and v is not None:
        self.token_to_kv_pool.set_kv_buffer(
            layer, compat.KVWriteLoc(forward_batch.out_cache_loc, self.swa_out_cache_loc), k, v)
    spec = forward_batch.spec_info
    return target_verify_attention(
        q.reshape(q.shape[0], -1), self.token_to_kv_pool.get_key_buffer(layer.layer_id),
        self.token_to_kv_pool.get_value_buffer(layer.layer_id), self.req_to_token_pool.req_to_token,
        forward_batch.req_pool_indices, forward_batch.seq_lens, forward_batch.out_cache_loc,
        getattr(spec, "custom_mask", None), spec.draft_token_num, layer.tp_q_head_num, layer.scaling)


def _init_native_kv_move(pool) -> None:
    """MHATokenToKVPool._init_kv_copy_and_warmup on the CPU platform: no Triton copy; move_kv_cache takes the
    pool's torch path (index copy per layer)."""
    pool._kv_copy_config = None
    pool.use_native_move_kv_cache = True


def _provide_reconstruct_tree(fn: Callable):
    def fill(module: types.ModuleType) -> None:
        module.__doc__ = "Provided by sglang_ext.spec on the portable CPU platform."
        setattr(module, compat.SPEC_RECONSTRUCT_TREE_FN, fn)
    return fill


def _set_attrs(impls: dict[str, Callable], names: tuple[str, ...], only_bound: bool = False,
               require_none: bool = True):
    """Set each module attribute in names to impls[name]; with only_bound, only names the module binds at all;
    with require_none, SGLang must have left it None (the CPU platform, tree sampling on HIP)."""
    def fill(module: types.ModuleType) -> None:
        for name in names:
            if only_bound and not hasattr(module, name):
                continue
            current = getattr(module, name, None)
            if current is impls[name]:
                continue  # imported after the source module was patched
            if require_none and current is not None:
                raise RuntimeError(f"{module.__name__}.{name} is not None on this platform: SGLang changed")
            setattr(module, name, impls[name])
    return fill


def _patch_attrs(attrs: dict[str, tuple[str, ...]], impls: dict[str, Callable], require_none: bool,
                 patch=None) -> None:
    patch = patch or after_import
    for module_name, names in attrs.items():
        patch(module_name, _set_attrs(impls, names, require_none=require_none))
        for importer in compat.SPEC_NONE_ATTR_IMPORTERS:
            patch(importer, _set_attrs(impls, names, only_bound=True, require_none=require_none))


def _register_cpu() -> list[str]:
    impls = adapters.SpecAdapters(adapters.TORCH_OPS).functions
    replace = {
        compat.HOOK_SPEC_VERIFY_TREE_GREEDY: impls["verify_tree_greedy_func"],
        compat.HOOK_SPEC_BUILD_TREE: impls["build_tree_kernel_efficient_func"],
        compat.HOOK_SPEC_FILL_FRONT_CACHE_LOC: adapters.fill_front_out_cache_loc_func,
        compat.HOOK_SPEC_ASSIGN_DRAFT_CACHE_LOCS: adapters.assign_draft_cache_locs_contiguous_func,
        compat.HOOK_SPEC_FILL_ACCEPT_CACHE_LOC: adapters.fill_accept_out_cache_loc_func,
        compat.HOOK_SPEC_FILL_BONUS_TOKENS: adapters.fill_bonus_tokens_func,
        compat.HOOK_MHA_POOL_INIT_KV_COPY: _init_native_kv_move,
        compat.HOOK_SPEC_ASSIGN_REQ_TO_TOKEN: adapters.assign_req_to_token_pool_func,
        compat.HOOK_SPEC_CHAIN_SAMPLING: adapters.chain_speculative_sampling_triton,
    }
    for target, fn in replace.items():
        hook_chain.register(target, fn, compat.HookType.REPLACE)
    for module_name, names in compat.SPEC_EAGLE_HELPERS.items():
        for name in names:
            hook_chain.register(f"{module_name}.{name}", getattr(eagle_ops, name), compat.HookType.REPLACE)
    hook_chain.register(compat.HOOK_DRAFT_BACKEND_FACTORY_CREATE, add_torch_native, compat.HookType.AROUND)
    hook_chain.register(compat.HOOK_TORCH_NATIVE_FORWARD_EXTEND, _forward_extend, compat.HookType.AROUND)
    reconstruct = impls[compat.SPEC_RECONSTRUCT_TREE_FN]
    provide_module(compat.SPEC_RECONSTRUCT_TREE_MODULE, _provide_reconstruct_tree(reconstruct))
    _patch_attrs(compat.SPEC_NONE_ATTRS, impls, require_none=True)
    return ["speculative decoding ops (torch) on the cpu platform"]


def gpu_platform() -> str | None:
    """"hip" on ROCm builds of torch with a device, "cuda" on CUDA ones, None otherwise (XPU, NPU, no device)."""
    if not torch.cuda.is_available():
        return None
    return "hip" if torch.version.hip else "cuda"


def install_gpu(chosen: dict[str, str], registry=None, patch=None) -> adapters.SpecAdapters | None:
    """Register the ops of a gpu_plan.plan() result (Triton adapters) with the registry (hook_chain by default)
    and the import patcher (after_import by default). Returns the adapters installed, None when nothing was."""
    if not chosen:
        return None
    registry = registry or hook_chain
    patch = patch or after_import
    installed = adapters.SpecAdapters(adapters.triton_ops())
    impls = installed.functions
    replace = {
        "build_tree": {compat.HOOK_SPEC_BUILD_TREE: impls["build_tree_kernel_efficient_func"]},
        "reconstruct": {compat.HOOK_SPEC_RECONSTRUCT_TREE: impls[compat.SPEC_RECONSTRUCT_TREE_FN]},
        "verify_greedy": {compat.HOOK_SPEC_VERIFY_TREE_GREEDY: impls["verify_tree_greedy_func"]},
        gpu_plan.LIFT_HIP_GREEDY: {compat.HOOK_SPEC_VERIFY_USES_GREEDY: adapters.verify_uses_greedy},
    }
    for op, targets in replace.items():
        if op in chosen:
            for target, fn in targets.items():
                registry.register(target, fn, compat.HookType.REPLACE)
    # Module attributes (None on HIP, a JIT op or a FlashInfer LazyImport on CUDA): set where they are bound.
    if "tree_sampling" in chosen:
        _patch_attrs(compat.SPEC_VERIFY_SAMPLING_ATTRS, impls, require_none=False, patch=patch)
    if "renorm" in chosen:
        _patch_attrs(compat.SPEC_RENORM_ATTRS, impls, require_none=False, patch=patch)
    return installed


def register() -> list[str]:
    global _registered
    if _registered:
        return []
    if cpu_platform_active():
        _registered = True
        return _register_cpu()
    platform = gpu_platform()
    if platform is None:
        return []
    _registered = True
    # Independent of the ops plan below: without it NEXTN over a compressed pool cannot draft on a GPU.
    hook_chain.register(compat.HOOK_DRAFT_BACKEND_FACTORY_CREATE, compressed_triton_draft,
                        compat.HookType.AROUND)
    mode = os.environ.get(env.SPEC_GPU_OPS, "auto")
    flashinfer = importlib.util.find_spec(compat.FLASHINFER_MODULE) is not None
    chosen = gpu_plan.plan(platform, mode, flashinfer)
    done = ["draft attention over compressed KV (triton)"]
    if install_gpu(chosen) is None:
        return done
    ops = ", ".join(f"{op} ({impl})" for op, impl in chosen.items() if op != gpu_plan.LIFT_HIP_GREEDY)
    logger.info("sglang-ext speculative ops on %s (%s=%s): %s", platform, env.SPEC_GPU_OPS, mode, ops)
    return [f"speculative decoding ops on {platform}: {ops}", *done]
