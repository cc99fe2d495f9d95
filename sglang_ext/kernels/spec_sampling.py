"""Triton kernel: rejection-sampling verification of a tree of deterministic drafts (SGLang's
`tree_speculative_sampling_target_only`, CUDA-only in SGLang 0.5.23; greedy-only on HIP). The torch op
`sglang_ext.spec.verify_ops.tree_speculative_sampling_target_only` is the spec; tests compare the two under
TRITON_INTERPRET=1 with the same coins. One program per request: the tree walk is scalar, the final draw from
relu(q - p) is two passes over the vocabulary in BLOCK_V chunks (total mass, then the inverse-CDF search).
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _tree_sampling_kernel(predicts_ptr, accept_index_ptr, accept_num_ptr, candidates_ptr, retrieve_index_ptr,
                          next_token_ptr, next_sibling_ptr, coins_ptr, final_coins_ptr, target_ptr, draft_ptr,
                          vocab, threshold_single, threshold_acc, STEPS: tl.constexpr, N: tl.constexpr,
                          BLOCK_V: tl.constexpr):
    b = tl.program_id(0)
    base = b * N
    row = tl.zeros((), dtype=tl.int64)  # node whose target distribution is current
    coin = tl.load(coins_ptr + base)
    prob_acc = tl.zeros((), dtype=tl.float32)
    last = tl.load(retrieve_index_ptr + base).to(tl.int64)
    tl.store(accept_index_ptr + b * STEPS, last.to(tl.int32))
    accepted = 0
    cur = tl.zeros((), dtype=tl.int64)
    going = 1
    for _ in range(1, STEPS):
        if going == 1:
            cur = tl.load(next_token_ptr + base + cur).to(tl.int64)
            found = 0
            for _s in range(N):
                if found == 0:
                    if cur == -1:
                        found = -1
                    else:
                        token = tl.load(candidates_ptr + base + cur).to(tl.int64)
                        prob_off = ((base + row) * vocab + token).to(tl.int64)
                        q_single = tl.load(target_ptr + prob_off)
                        prob_acc += q_single
                        if (q_single > 0) & ((coin < prob_acc / threshold_acc) | (q_single >= threshold_single)):
                            found = 1
                        else:
                            tl.store(draft_ptr + prob_off, q_single)
                            cur = tl.load(next_sibling_ptr + base + cur).to(tl.int64)
            if found == 1:
                prob_acc = 0.0
                row = cur
                coin = tl.load(coins_ptr + base + cur)
                tl.store(predicts_ptr + last, tl.load(candidates_ptr + base + cur).to(tl.int32))
                accepted += 1
                last = tl.load(retrieve_index_ptr + base + cur).to(tl.int64)
                tl.store(accept_index_ptr + b * STEPS + accepted, last.to(tl.int32))
            else:
                going = 0
    tl.store(accept_num_ptr + b, accepted)
    use_p = accepted != STEPS - 1
    row_off = ((base + row) * vocab).to(tl.int64)
    total = tl.zeros((), dtype=tl.float32)
    for start in range(0, vocab, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        keep = offs < vocab
        q = tl.load(target_ptr + row_off + offs, mask=keep, other=0.0)
        p = tl.load(draft_ptr + row_off + offs, mask=keep & use_p, other=0.0)
        total += tl.sum(tl.maximum(q - p, 0.0))
    u = tl.load(final_coins_ptr + b) * total
    running = tl.zeros((), dtype=tl.float32)
    sampled = tl.zeros((), dtype=tl.int64) - 1
    last_valid = tl.zeros((), dtype=tl.int64) - 1
    for start in range(0, vocab, BLOCK_V):
        if sampled == -1:
            offs = start + tl.arange(0, BLOCK_V)
            keep = offs < vocab
            q = tl.load(target_ptr + row_off + offs, mask=keep, other=0.0)
            p = tl.load(draft_ptr + row_off + offs, mask=keep & use_p, other=0.0)
            w = tl.maximum(q - p, 0.0)
            cdf = running + tl.cumsum(w, axis=0)
            hit = (cdf > u) & (w > 0) & keep
            first = tl.min(tl.where(hit, offs, vocab), axis=0)
            if first < vocab:
                sampled = first.to(tl.int64)
            last_valid = tl.maximum(last_valid, tl.max(tl.where((w > 0) & keep, offs, -1), axis=0).to(tl.int64))
            running += tl.sum(w)
    if sampled == -1:
        sampled = tl.where(last_valid >= 0, last_valid, vocab - 1)
    tl.store(predicts_ptr + last, sampled.to(tl.int32))


def tree_speculative_sampling_target_only(predicts, accept_index, accept_token_num, candidates, retrieve_index,
                                          retrieve_next_token, retrieve_next_sibling, uniform_samples,
                                          uniform_samples_for_final_sampling, target_probs, draft_probs,
                                          threshold_single: float = 1.0, threshold_acc: float = 1.0) -> None:
    """Same contract as sglang_ext.spec.verify_ops.tree_speculative_sampling_target_only (float32 probs)."""
    bs, n = candidates.shape
    vocab = target_probs.shape[-1]
    assert target_probs.dtype == draft_probs.dtype == torch.float32
    assert target_probs.is_contiguous() and draft_probs.is_contiguous() and target_probs.numel() == bs * n * vocab
    assert predicts.dtype == accept_index.dtype == accept_token_num.dtype == torch.int32
    for t in (candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling, uniform_samples):
        assert t.is_contiguous()
    if bs == 0:
        return
    _tree_sampling_kernel[(bs,)](predicts, accept_index, accept_token_num, candidates, retrieve_index,
                                 retrieve_next_token, retrieve_next_sibling, uniform_samples,
                                 uniform_samples_for_final_sampling, target_probs, draft_probs, vocab,
                                 float(threshold_single), float(threshold_acc), STEPS=accept_index.shape[1], N=n,
                                 BLOCK_V=1024)
