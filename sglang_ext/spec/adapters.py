"""SGLang 0.5.23's speculative-decoding entry points, with their own signatures, over our ops.

One set of adapters serves both installs (`hooks.py`): on the portable CPU platform they call the torch ops
(`TORCH_OPS`), on GPU platforms the Triton kernels of `sglang_ext/kernels/spec_*.py` (`triton_ops()`). What an
adapter does beyond calling its op (argument names, tree-mask modes, returned tuples) is the same for both.
The KV-slot adapters at the bottom exist for the CPU platform only: on CUDA/HIP SGLang's own Triton versions run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from sglang_ext import compat
from sglang_ext.spec import cache_loc_ops, tree_ops, verify_ops


@dataclass(frozen=True)
class SpecOps:
    """One implementation of each op the switchable adapters call; every op has the contract of the torch op of
    the same name in tree_ops / verify_ops."""
    name: str  # "torch" or "triton"
    build_tree_efficient: Callable
    reconstruct_indices_from_tree_mask: Callable
    verify_tree_greedy: Callable
    tree_speculative_sampling_target_only: Callable
    top_k_renorm_prob: Callable
    top_p_renorm_prob: Callable


TORCH_OPS = SpecOps("torch", tree_ops.build_tree_efficient, tree_ops.reconstruct_indices_from_tree_mask,
                    verify_ops.verify_tree_greedy, verify_ops.tree_speculative_sampling_target_only,
                    verify_ops.top_k_renorm_prob, verify_ops.top_p_renorm_prob)


def triton_ops() -> SpecOps:
    """The Triton kernels (imported on demand: the CPU platform never needs them). Top-k / top-p renormalisation
    has no Triton kernel: the torch ops run on the GPU tensors (a sort and a cumulative sum per row, no host sync)."""
    from sglang_ext.kernels import spec_sampling, spec_tree

    return SpecOps("triton", spec_tree.build_tree_efficient, spec_tree.reconstruct_indices_from_tree_mask,
                   spec_tree.verify_tree_greedy, spec_sampling.tree_speculative_sampling_target_only,
                   verify_ops.top_k_renorm_prob, verify_ops.top_p_renorm_prob)


def _per_row(value, rows: int, dtype, device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.view(-1)
    return torch.full((rows,), value, dtype=dtype, device=device)


class SpecAdapters:
    """Adapters bound to one SpecOps. `functions` maps each SGLang function name to the bound method installed for
    it (stable objects, so an install can recognise its own function in a module it patches)."""

    def __init__(self, ops: SpecOps) -> None:
        self.ops = ops
        self.functions: dict[str, Callable] = {
            "build_tree_kernel_efficient_func": self.build_tree_kernel_efficient_func,
            compat.SPEC_RECONSTRUCT_TREE_FN: self.reconstruct_indices_from_tree_mask_func,
            "verify_tree_greedy_func": self.verify_tree_greedy_func,
            "tree_speculative_sampling_target_only": self.tree_speculative_sampling_target_only,
            "top_k_renorm_prob": self.top_k_renorm_prob,
            "top_p_renorm_prob": self.top_p_renorm_prob,
        }

    def build_tree_kernel_efficient_func(self, parent_list, top_scores_index, seq_lens, tree_mask, positions,
                                         retrieve_index, retrieve_next_token, retrieve_next_sibling, topk, spec_steps,
                                         num_verify_tokens, tree_mask_mode) -> None:
        mode = int(tree_mask_mode)
        if mode not in (compat.SPEC_TREE_MASK_FULL, compat.SPEC_TREE_MASK_QLEN_ONLY):
            raise NotImplementedError(
                f"tree mask mode {tree_mask_mode!r} with sglang-ext's {self.ops.name} ops (FULL_MASK, QLEN_ONLY only)")
        self.ops.build_tree_efficient(parent_list, top_scores_index, seq_lens, tree_mask, positions, retrieve_index,
                                      retrieve_next_token, retrieve_next_sibling, topk, spec_steps, num_verify_tokens,
                                      full_mask=mode == compat.SPEC_TREE_MASK_FULL)

    def reconstruct_indices_from_tree_mask_func(self, tree_mask, verified_seq_len, positions, retrieve_index,
                                                retrieve_next_token, retrieve_next_sibling, batch_size,
                                                draft_token_num) -> None:
        self.ops.reconstruct_indices_from_tree_mask(tree_mask, verified_seq_len, positions, retrieve_index,
                                                    retrieve_next_token, retrieve_next_sibling, batch_size,
                                                    draft_token_num)

    def verify_tree_greedy_func(self, predicts, accept_index, accept_token_num, candidates, retrieve_index,
                                retrieve_next_token, retrieve_next_sibling, target_predict, topk: int = -1):
        self.ops.verify_tree_greedy(predicts, accept_index, accept_token_num, candidates, retrieve_index,
                                    retrieve_next_token, retrieve_next_sibling, target_predict)
        return predicts, accept_index, accept_token_num

    def tree_speculative_sampling_target_only(self, *, predicts, accept_index, accept_token_num, candidates,
                                              retrive_index, retrive_next_token, retrive_next_sibling,
                                              uniform_samples, uniform_samples_for_final_sampling, target_probs,
                                              draft_probs, threshold_single=1.0, threshold_acc=1.0,
                                              deterministic=True) -> None:
        # deterministic: both implementations are (one program per request, fixed reduction order)
        self.ops.tree_speculative_sampling_target_only(
            predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
            retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs, draft_probs,
            threshold_single, threshold_acc)

    def top_k_renorm_prob(self, probs, top_k):
        return self.ops.top_k_renorm_prob(probs, _per_row(top_k, probs.shape[0], torch.int64, probs.device))

    def top_p_renorm_prob(self, probs, top_p):
        return self.ops.top_p_renorm_prob(probs, _per_row(top_p, probs.shape[0], probs.dtype, probs.device))


def verify_uses_greedy(*, is_all_greedy: bool, is_cpu: bool, is_hip: bool, is_xpu: bool,
                       use_rejection_sampling: bool) -> bool:
    """eagle_utils._verify_uses_greedy once our tree sampling is installed on HIP: a HIP run verifies non-greedy
    requests by rejection sampling instead of committing the argmax (is_hip no longer forces greedy)."""
    return is_all_greedy or is_cpu or is_xpu


# --- KV slot bookkeeping (CPU platform only) ------------------------------------------------------------------

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


def chain_speculative_sampling_triton(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                     retrive_next_token, retrive_next_sibling, uniform_samples,
                                     uniform_samples_for_final_sampling, target_probs, draft_probs, threshold_single,
                                     threshold_acc, deterministic, *, block_verification: bool = False) -> None:
    if block_verification:
        raise NotImplementedError("--speculative-use-block-verification on the CPU platform")
    verify_ops.chain_speculative_sampling(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                          uniform_samples, uniform_samples_for_final_sampling, target_probs,
                                          draft_probs)
