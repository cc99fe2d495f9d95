"""Installs the torch speculative-decoding ops into SGLang on the portable CPU platform (from the plugin).

Each SGLang entry point below keeps its own signature; the adapters translate to the ops in `tree_ops`,
`verify_ops`, `cache_loc_ops` and to `verify_attention`. Nothing here runs on a GPU host: `register()` returns
at once unless the portable CPU platform is the one that activates.
"""

import types

import torch

from sglang_ext import compat
from sglang_ext.platform import activate
from sglang_ext.spec import cache_loc_ops, eagle_ops, tree_ops, verify_ops
from sglang_ext.spec.draft_backends import add_torch_native
from sglang_ext.spec.import_patch import after_import, provide_module
from sglang_ext.spec.verify_attention import target_verify_attention

_registered = False


def verify_tree_greedy_func(predicts, accept_index, accept_token_num, candidates, retrieve_index,
                            retrieve_next_token, retrieve_next_sibling, target_predict, topk: int = -1):
    verify_ops.verify_tree_greedy(predicts, accept_index, accept_token_num, candidates, retrieve_index,
                                  retrieve_next_token, retrieve_next_sibling, target_predict)
    return predicts, accept_index, accept_token_num


def build_tree_kernel_efficient_func(parent_list, top_scores_index, seq_lens, tree_mask, positions, retrieve_index,
                                     retrieve_next_token, retrieve_next_sibling, topk, spec_steps,
                                     num_verify_tokens, tree_mask_mode) -> None:
    mode = int(tree_mask_mode)
    if mode not in (compat.SPEC_TREE_MASK_FULL, compat.SPEC_TREE_MASK_QLEN_ONLY):
        raise NotImplementedError(f"tree mask mode {tree_mask_mode!r} on the CPU platform (FULL_MASK, QLEN_ONLY only)")
    tree_ops.build_tree_efficient(parent_list, top_scores_index, seq_lens, tree_mask, positions, retrieve_index,
                                  retrieve_next_token, retrieve_next_sibling, topk, spec_steps, num_verify_tokens,
                                  full_mask=mode == compat.SPEC_TREE_MASK_FULL)


def assign_extend_cache_locs_func(*, req_pool_indices, req_to_token, start_offset, end_offset, batch_size,
                                  draft_token_num, device):
    return cache_loc_ops.assign_extend_cache_locs(req_pool_indices, req_to_token, start_offset, end_offset)


def fill_front_out_cache_loc_func(num_front, out_cache_loc, front_out_cache_loc) -> None:
    cache_loc_ops.fill_front_out_cache_loc(num_front, out_cache_loc, front_out_cache_loc)


def assign_draft_cache_locs_contiguous_func(req_pool_indices, req_to_token, seq_lens, out_cache_loc, topk, num_cols,
                                            positions=None, mrope=None) -> None:
    cache_loc_ops.assign_draft_cache_locs_contiguous(req_pool_indices, req_to_token, seq_lens, out_cache_loc, topk,
                                                     num_cols, positions)
    if mrope is not None:
        bs = seq_lens.numel()
        mrope.view(3, -1)[:, :bs * topk] = seq_lens.repeat_interleave(topk).to(mrope.dtype)


def assign_req_to_token_pool_func(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                  batch_size) -> None:
    cache_loc_ops.assign_req_to_token_pool(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc)


def fill_accept_out_cache_loc_func(accept_index, out_cache_loc, accept_out_cache_loc, size) -> None:
    cache_loc_ops.fill_accept_out_cache_loc(accept_index, out_cache_loc, accept_out_cache_loc)


def fill_bonus_tokens_func(accept_tokens, accept_lens, bonus_tokens, accept_stride, batch_size) -> None:
    cache_loc_ops.fill_bonus_tokens(accept_tokens, accept_lens, bonus_tokens, accept_stride)


def tree_speculative_sampling_target_only(*, predicts, accept_index, accept_token_num, candidates, retrive_index,
                                          retrive_next_token, retrive_next_sibling, uniform_samples,
                                          uniform_samples_for_final_sampling, target_probs, draft_probs,
                                          threshold_single=1.0, threshold_acc=1.0, deterministic=True) -> None:
    verify_ops.tree_speculative_sampling_target_only(
        predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
        retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs, draft_probs,
        threshold_single, threshold_acc)


def chain_speculative_sampling_triton(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                     retrive_next_token, retrive_next_sibling, uniform_samples,
                                     uniform_samples_for_final_sampling, target_probs, draft_probs, threshold_single,
                                     threshold_acc, deterministic, *, block_verification: bool = False) -> None:
    if block_verification:
        raise NotImplementedError("--speculative-use-block-verification on the CPU platform")
    verify_ops.chain_speculative_sampling(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                          uniform_samples, uniform_samples_for_final_sampling, target_probs,
                                          draft_probs)


def _per_row(value, rows: int, dtype, device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.view(-1)
    return torch.full((rows,), value, dtype=dtype, device=device)


def top_k_renorm_prob(probs, top_k):
    return verify_ops.top_k_renorm_prob(probs, _per_row(top_k, probs.shape[0], torch.int64, probs.device))


def top_p_renorm_prob(probs, top_p):
    return verify_ops.top_p_renorm_prob(probs, _per_row(top_p, probs.shape[0], probs.dtype, probs.device))


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


def _fill_reconstruct_tree(module: types.ModuleType) -> None:
    module.__doc__ = "Provided by sglang_ext.spec on the portable CPU platform (torch op)."
    setattr(module, compat.SPEC_RECONSTRUCT_TREE_FN, tree_ops.reconstruct_indices_from_tree_mask)


_NONE_ATTR_IMPLS = {
    "tree_speculative_sampling_target_only": tree_speculative_sampling_target_only,
    "top_k_renorm_prob": top_k_renorm_prob,
    "top_p_renorm_prob": top_p_renorm_prob,
}


def _fill_none_attrs(names: tuple[str, ...], only_bound: bool = False):
    """Set each name (None on this platform) to our op; with only_bound, only names the module binds at all."""
    def fill(module: types.ModuleType) -> None:
        for name in names:
            if only_bound and not hasattr(module, name):
                continue
            current = getattr(module, name, None)
            if current is _NONE_ATTR_IMPLS[name]:
                continue  # imported after the source module was patched
            if current is not None:
                raise RuntimeError(f"{module.__name__}.{name} is not None on the CPU platform: SGLang changed")
            setattr(module, name, _NONE_ATTR_IMPLS[name])
    return fill


def register() -> list[str]:
    global _registered
    if _registered or activate() is None:
        return []
    _registered = True
    replace = {
        compat.HOOK_SPEC_VERIFY_TREE_GREEDY: verify_tree_greedy_func,
        compat.HOOK_SPEC_BUILD_TREE: build_tree_kernel_efficient_func,
        compat.HOOK_SPEC_FILL_FRONT_CACHE_LOC: fill_front_out_cache_loc_func,
        compat.HOOK_SPEC_ASSIGN_DRAFT_CACHE_LOCS: assign_draft_cache_locs_contiguous_func,
        compat.HOOK_SPEC_FILL_ACCEPT_CACHE_LOC: fill_accept_out_cache_loc_func,
        compat.HOOK_SPEC_FILL_BONUS_TOKENS: fill_bonus_tokens_func,
        compat.HOOK_MHA_POOL_INIT_KV_COPY: _init_native_kv_move,
        compat.HOOK_SPEC_ASSIGN_REQ_TO_TOKEN: assign_req_to_token_pool_func,
        compat.HOOK_SPEC_CHAIN_SAMPLING: chain_speculative_sampling_triton,
    }
    for target, fn in replace.items():
        compat.HookRegistry.register(target, fn, compat.HookType.REPLACE)
    for module_name, names in compat.SPEC_EAGLE_HELPERS.items():
        for name in names:
            compat.HookRegistry.register(f"{module_name}.{name}", getattr(eagle_ops, name), compat.HookType.REPLACE)
    compat.HookRegistry.register(compat.HOOK_DRAFT_BACKEND_FACTORY_CREATE, add_torch_native, compat.HookType.AROUND)
    compat.HookRegistry.register(compat.HOOK_TORCH_NATIVE_FORWARD_EXTEND, _forward_extend, compat.HookType.AROUND)
    provide_module(compat.SPEC_RECONSTRUCT_TREE_MODULE, _fill_reconstruct_tree)
    for module_name, names in compat.SPEC_NONE_ATTRS.items():
        after_import(module_name, _fill_none_attrs(names))
        for importer in compat.SPEC_NONE_ATTR_IMPORTERS:
            after_import(importer, _fill_none_attrs(names, only_bound=True))
    return ["speculative decoding ops (torch) on the cpu platform"]
