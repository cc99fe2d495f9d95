"""Verification of a draft tree against the target model, in plain torch: greedy and rejection sampling,
and the top-k / top-p renormalisation applied to target probabilities first. The CPU platform's
implementation and the spec of the Triton kernels (`sglang_ext/kernels/spec_tree.py`, `spec_sampling.py`; the
renormalisation has none and runs as torch on GPUs too). No SGLang import.

Semantics follow SGLang 0.5.23: `verify_tree_greedy` (`spec_tree.py` / `tree.cuh`) and
`tree_speculative_sampling_target_only` (`jit/include/sgl_kernel/speculative/sampling.cuh`). Output
arguments are written in place. Index conventions: a node's "retrieve index" is its row in the flattened
[bs * n] verify batch; `predicts` is indexed by retrieve index; accept_index[b, 0] is the root's retrieve
index and accept_index[b, k] the k-th accepted draft's (the rest is left as the caller filled it, -1).
"""

import numpy as np
import torch


def verify_tree_greedy(
    predicts: torch.Tensor,  # int32 [bs * n] (out)
    accept_index: torch.Tensor,  # int32 [bs, num_spec_steps] (out)
    accept_token_num: torch.Tensor,  # int32 [bs] (out): accepted drafts, bonus excluded
    candidates: torch.Tensor,  # int [bs, n]: draft token of each node (node 0 = last verified token)
    retrieve_index: torch.Tensor,  # int [bs, n]
    retrieve_next_token: torch.Tensor,  # int [bs, n]
    retrieve_next_sibling: torch.Tensor,  # int [bs, n]
    target_predict: torch.Tensor,  # int [bs, n]: the target's argmax after each node
) -> None:
    """Walk the tree from the root: at each level accept the first child (in sibling order) whose token equals
    the target's argmax after the last accepted node; stop at the first level without a match. The target's
    argmax after the last accepted node is the bonus token."""
    bs, n = candidates.shape
    steps = accept_index.shape[1]
    cand, ridx = candidates.tolist(), retrieve_index.tolist()
    nxt, sib = retrieve_next_token.tolist(), retrieve_next_sibling.tolist()
    tgt = target_predict.reshape(-1).tolist()
    for b in range(bs):
        last = ridx[b][0]
        accept_index[b, 0] = last
        accepted, cur = 0, 0
        for _ in range(1, steps):
            cur = nxt[b][cur]
            target_token = tgt[last]
            while cur != -1 and cand[b][cur] != target_token:
                cur = sib[b][cur]
            if cur == -1:
                break
            predicts[last] = target_token
            accepted += 1
            accept_index[b, accepted] = ridx[b][cur]
            last = ridx[b][cur]
        accept_token_num[b] = accepted
        predicts[last] = tgt[last]


def _sample_residual(q: torch.Tensor, p: torch.Tensor | None, coin: float) -> int:
    """Inverse-CDF draw from relu(q - p) (p None: from q), with the CUDA op's edge cases: a coin past the total
    picks the last token with positive mass, or the last token if none has any."""
    w = q if p is None else (q - p).clamp_min(0)
    cdf = torch.cumsum(w, 0)
    u = coin * float(cdf[-1])
    idx = int(torch.searchsorted(cdf, torch.tensor([u], dtype=cdf.dtype), right=True)[0])
    if idx < w.numel() and w[idx] > 0:
        return idx
    positive = torch.nonzero(w > 0)
    return int(positive[-1, 0]) if positive.numel() else w.numel() - 1


def tree_speculative_sampling_target_only(
    predicts: torch.Tensor,  # int32 [bs * n] (out)
    accept_index: torch.Tensor,  # int32 [bs, num_spec_steps] (out)
    accept_token_num: torch.Tensor,  # int32 [bs] (out)
    candidates: torch.Tensor,  # int [bs, n]
    retrieve_index: torch.Tensor,  # int [bs, n]
    retrieve_next_token: torch.Tensor,  # int [bs, n]
    retrieve_next_sibling: torch.Tensor,  # int [bs, n]
    uniform_samples: torch.Tensor,  # float32 [bs, n]: acceptance coin of each node's children
    uniform_samples_for_final_sampling: torch.Tensor,  # float32 [bs]
    target_probs: torch.Tensor,  # float32 [bs, n, vocab]: target distribution after each node
    draft_probs: torch.Tensor,  # float32 [bs, n, vocab] zeros (in; rejected tokens' mass is written here)
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
) -> None:
    """Rejection sampling of a tree of deterministic drafts (NGRAM, top-1 MTP/EAGLE chains and trees).

    At each level the children c1, c2, ... of the last accepted node are tried in sibling order with one coin u:
    child ci is accepted when q(ci) > 0 and u < (q(c1) + ... + q(ci)) / threshold_acc (or q(ci) >=
    threshold_single), q being the target distribution after the last accepted node. With both thresholds 1
    this accepts ci with exactly the probability that a draw from q lands on ci, so the output is distributed
    as plain sampling from the target. When no child is accepted, the next token is drawn from q with the
    rejected children removed (relu(q - p), p holding the rejected children's mass); after a full accepted
    path it is drawn from q itself.
    """
    bs, n = candidates.shape
    steps = accept_index.shape[1]
    cand, ridx = candidates.tolist(), retrieve_index.tolist()
    nxt, sib = retrieve_next_token.tolist(), retrieve_next_sibling.tolist()
    coins = uniform_samples.tolist()
    final_coins = uniform_samples_for_final_sampling.view(-1).tolist()
    tp = target_probs.view(bs, n, -1)
    dp = draft_probs.view(bs, n, -1)
    for b in range(bs):
        row = 0  # node whose target distribution is current
        coin = np.float32(coins[b][0])
        prob_acc = np.float32(0.0)  # float32 like the CUDA op: the accept test compares against this sum
        last = ridx[b][0]
        accept_index[b, 0] = last
        accepted, cur = 0, 0
        for _ in range(1, steps):
            cur = nxt[b][cur]
            while cur != -1:
                token = cand[b][cur]
                q_single = np.float32(tp[b, row, token])
                prob_acc = np.float32(prob_acc + q_single)
                if q_single > 0 and (coin < prob_acc / np.float32(threshold_acc) or q_single >= threshold_single):
                    prob_acc = np.float32(0.0)
                    row = cur
                    coin = np.float32(coins[b][cur])
                    predicts[last] = token
                    accepted += 1
                    accept_index[b, accepted] = ridx[b][cur]
                    last = ridx[b][cur]
                    break
                dp[b, row, token] = tp[b, row, token]
                cur = sib[b][cur]
            if cur == -1:
                break
        accept_token_num[b] = accepted
        p = None if accepted == steps - 1 else dp[b, row]
        predicts[last] = _sample_residual(tp[b, row], p, final_coins[b])


def top_k_renorm_prob(probs: torch.Tensor, top_ks: torch.Tensor) -> torch.Tensor:
    """Keep each row's top_k largest probabilities (ties at the k-th value kept, as FlashInfer's pivot test
    does), zero the rest, renormalise. probs: [rows, vocab]; top_ks: int [rows]; k >= vocab keeps all."""
    vocab = probs.shape[-1]
    k = top_ks.view(-1).clamp(1, vocab).long()
    kth = torch.sort(probs, dim=-1, descending=True).values.gather(1, (k - 1).view(-1, 1))
    kept = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    return kept / kept.sum(-1, keepdim=True)


def top_p_renorm_prob(probs: torch.Tensor, top_ps: torch.Tensor) -> torch.Tensor:
    """Keep the smallest prefix of each row sorted by descending probability whose mass reaches top_p (a token is
    dropped when the mass before it already exceeds top_p, as SGLang's torch sampler does), renormalise."""
    sorted_p, idx = torch.sort(probs, dim=-1, descending=True)
    before = torch.cumsum(sorted_p, -1) - sorted_p
    sorted_p = torch.where(before > top_ps.view(-1, 1).to(probs.dtype), torch.zeros_like(sorted_p), sorted_p)
    kept = torch.zeros_like(probs).scatter_(1, idx, sorted_p)
    return kept / kept.sum(-1, keepdim=True)


def chain_speculative_sampling(
    predicts: torch.Tensor,  # int32 [bs * n] (out)
    accept_index: torch.Tensor,  # int32 [bs, n] (out)
    accept_token_num: torch.Tensor,  # int32 [bs] (out)
    candidates: torch.Tensor,  # int [bs, n]: node 0 the last verified token, node s the s-th draft
    retrieve_index: torch.Tensor,  # int [bs, n]
    uniform_samples: torch.Tensor,  # float32 [bs, n]: coin s - 1 decides draft s
    uniform_samples_for_final_sampling: torch.Tensor,  # float32 [bs]
    target_probs: torch.Tensor,  # float32 [bs, n, vocab]: p after each node
    draft_probs: torch.Tensor,  # float32 [bs, n - 1 or n, vocab]: q that proposed draft s + 1
) -> None:
    """Classic speculative sampling of a draft chain with its proposal distributions (SGLang
    `chain_speculative_sampling_triton` without block verification): draft s is accepted with probability
    min(1, p(x)/q(x)) (a coin u accepts when u * q(x) < p(x), q(x) in (0, 1]); at the first rejection the next
    token is drawn from relu(p - q) normalised, after a full chain from p."""
    bs, n = candidates.shape
    cand, ridx = candidates.tolist(), retrieve_index.tolist()
    coins = uniform_samples.tolist()
    final_coins = uniform_samples_for_final_sampling.view(-1).tolist()
    for b in range(bs):
        last = ridx[b][0]
        accept_index[b, 0] = last
        accepted = 0
        for step in range(1, n):
            token = cand[b][step]
            p = float(target_probs[b, accepted, token])
            q = float(draft_probs[b, accepted, token])
            if 0.0 < q <= 1.0 and coins[b][step - 1] * q < p:
                predicts[last] = token
                accepted += 1
                last = ridx[b][step]
                accept_index[b, accepted] = last
            else:
                break
        accept_token_num[b] = accepted
        p_row = target_probs[b, accepted]
        if accepted == n - 1:
            w = p_row
        else:
            q_row = draft_probs[b, accepted]
            q_row = torch.where((q_row >= 0) & (q_row <= 1), q_row, torch.zeros_like(q_row))
            w = (p_row - q_row).clamp_min(0)
        cdf = torch.cumsum(w, 0)
        u = final_coins[b] * float(cdf[-1])
        hit = torch.nonzero(cdf > u)
        predicts[last] = int(hit[0, 0]) if hit.numel() else w.numel() - 1
