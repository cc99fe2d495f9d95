"""Draft simulation: the accept length an MTP layer would reach under NEXTN, in plain torch.

At a verified position t the target has hidden state h_t and its greedy next token x_{t+1}. Draft step 1 runs
the MTP on (h_t, x_{t+1}) at position t, over the draft KV of (h_j, x_{j+1}) for every j < t, and proposes
d_1 for x_{t+2}; step s runs on (MTP output of step s-1, d_{s-1}) at position t+s-1 and proposes d_s.
The verify round accepts the longest prefix of d_1..d_k equal to the target's greedy tokens, plus the target's
own next token: accept length = 1 + matched drafts (what SGLang's server reports as accept length).

With `--speculative-eagle-topk` k > 1 SGLang drafts a tree instead (tree_drafts): each step keeps the k paths of
highest cumulative draft probability, every step's k x k expansions are candidates, the `num_draft_tokens - 1`
candidates of highest score are verified, and the round accepts the deepest selected path that matches the
target's greedy tokens.
"""

from dataclasses import dataclass

import torch

from tools.draft_training.draft_corpus import Sequence
from tools.draft_training.mtp_layer import MtpLayer


def accept_length(drafts: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """drafts, targets: [..., k] token ids. Returns [...] int64: 1 + length of the longest matching prefix."""
    return (drafts == targets).long().cumprod(-1).sum(-1) + 1


def decode_walk(accept_lengths: list[int]) -> list[int]:
    """The verify rounds greedy decoding goes through: starting at position 0, each round at position t accepts
    accept_lengths[t] tokens and the next round starts that many positions later. Returns the rounds' lengths."""
    rounds, t = [], 0
    while t < len(accept_lengths):
        rounds.append(accept_lengths[t])
        t += accept_lengths[t]
    return rounds


def _logits(out: torch.Tensor, lm_head: torch.Tensor) -> torch.Tensor:
    """float32 logits of `out` [..., H]; the product runs in lm_head's dtype (bfloat16: 2.6x the rate of float32
    on an AVX512-BF16 CPU, for fit_temperature's repeated measurements)."""
    return (out.to(lm_head.dtype) @ lm_head.T).float()


def _top_probs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest softmax probabilities and their token ids (a softmax and topk: as fast on the CPU as a
    logsumexp over the row and topk over the logits, 2026-12-04)."""
    return torch.softmax(logits, dim=-1).topk(k, dim=-1)


@torch.no_grad()
def chain_drafts(mtp: MtpLayer, embed: torch.Tensor, lm_head: torch.Tensor, seq: Sequence,
                 steps: int) -> torch.Tensor:
    """Draft tokens for every position of `seq` at once. embed, lm_head: [vocab, H].

    Returns drafts [T-1, steps]: row t holds d_1..d_steps proposed after verifying up to x_{t+1}, with the draft
    KV filled from the target's hidden states of positions 0..t (as SGLang's draft extend fills it).
    """
    n = len(seq.tokens) - 1
    positions = torch.arange(n)[None]
    out, base_kv = mtp(seq.hidden[None, :n], embed[seq.tokens[1:]][None], positions)
    drafts = [_logits(out[0], lm_head).argmax(-1)]
    past_k, past_v = [base_kv[0]], [base_kv[1]]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    own = torch.eye(n, dtype=torch.bool)
    for step in range(1, steps):
        # query t sees the target-filled KV of positions <= t and its own chain's earlier draft steps
        mask = torch.cat([causal] + [own] * step, dim=1)
        out, kv = mtp(out, embed[drafts[-1]][None], positions + step,
                      past_kv=(torch.cat(past_k, dim=2), torch.cat(past_v, dim=2)), mask=mask)
        drafts.append(_logits(out[0], lm_head).argmax(-1))
        past_k.append(kv[0])
        past_v.append(kv[1])
    return torch.stack(drafts, dim=-1)


@torch.no_grad()
def tree_drafts(mtp: MtpLayer, embed: torch.Tensor, lm_head: torch.Tensor, seq: Sequence, steps: int, topk: int,
                draft_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's EAGLE tree drafting (spec_utils.select_top_k_tokens, eagle_utils.organize_draft_results) for every
    position of `seq` at once.

    Step 1 proposes the draft's top-k tokens after x_{t+1}, scored by their draft probabilities; each later step
    runs the layer on each of the k kept paths (hidden: the output of the path's parent; KV: SGLang gives branch
    slot b its own draft KV slots, so branch b attends to the tokens branch b held at earlier steps, which after a
    re-selection may be another path's) and keeps the k best of the k x k products of path score and
    probability. Of all candidates (k from step 1, k x k from each later step) the `draft_tokens - 1` of highest
    score are verified. Returns (paths [T-1, draft_tokens - 1, steps] token ids, -1 past a candidate's depth;
    depths [T-1, draft_tokens - 1]).
    """
    n = len(seq.tokens) - 1
    positions = torch.arange(n)[None].expand(topk, n)
    out, base_kv = mtp(seq.hidden[None, :n], embed[seq.tokens[1:]][None], positions[:1])
    score, token = _top_probs(_logits(out[0], lm_head), topk)  # [n, k]
    path = torch.full((n, topk, steps), -1, dtype=torch.long)
    path[:, :, 0] = token
    cand_score, cand_path, cand_depth = [score], [path], [torch.ones(n, topk, dtype=torch.long)]
    hidden = out.expand(topk, n, -1)
    past_k, past_v = [base_kv[0].expand(topk, -1, -1, -1)], [base_kv[1].expand(topk, -1, -1, -1)]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    own = torch.eye(n, dtype=torch.bool)
    rows = torch.arange(n)[:, None]
    for step in range(1, steps):
        mask = torch.cat([causal] + [own] * step, dim=1)
        out, kv = mtp(hidden, embed[token.T], positions + step,
                      past_kv=(torch.cat(past_k, dim=2), torch.cat(past_v, dim=2)), mask=mask)
        past_k.append(kv[0])
        past_v.append(kv[1])
        p, idx = _top_probs(_logits(out, lm_head), topk)  # [k, n, k]
        expand = score[:, :, None] * p.transpose(0, 1)  # [n, k parents, k children]
        tokens = idx.transpose(0, 1).reshape(n, topk * topk)
        paths = path[:, :, None, :].expand(n, topk, topk, steps).clone()
        paths[:, :, :, step] = idx.transpose(0, 1)
        paths = paths.reshape(n, topk * topk, steps)
        cand_score.append(expand.reshape(n, topk * topk))
        cand_path.append(paths)
        cand_depth.append(torch.full((n, topk * topk), step + 1, dtype=torch.long))
        score, best = expand.reshape(n, topk * topk).topk(topk, dim=-1)
        token, path = tokens.gather(1, best), paths[rows, best]
        hidden = out.transpose(0, 1)[rows, best // topk].transpose(0, 1)  # the parents' outputs, [k, n, H]
    scores = torch.cat(cand_score, dim=1)
    chosen = scores.topk(draft_tokens - 1, dim=-1).indices
    return torch.cat(cand_path, dim=1)[rows, chosen], torch.cat(cand_depth, dim=1)[rows, chosen]


def tree_accept_length(paths: torch.Tensor, depths: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """paths [N, C, k], depths [N, C] (tree_drafts), targets [N, k] -> [N]: 1 + the depth of the deepest
    candidate whose whole path equals the target's tokens."""
    matched = ((paths == targets[:, None]) | (paths < 0)).all(-1)
    return (depths * matched).max(-1).values + 1


@dataclass
class Acceptance:
    mean_accept_length: float  # per verify round, walking the sequence as greedy decoding would
    rounds: int
    per_step_match: list[float]  # over every position: fraction where drafts 1..s all match, s = 1..steps
    positions: int


def measure(mtp: MtpLayer, embed: torch.Tensor, lm_head: torch.Tensor, sequences: list[Sequence],
            steps: int = 3, topk: int = 1, draft_tokens: int | None = None) -> Acceptance:
    """Accept length of greedy NEXTN decoding with `steps` draft tokens over the continuations of `sequences`.

    Every sequence must be a greedy continuation (draft_corpus.generate with temperature 0), so the target's
    greedy tokens after an accepted prefix are `seq.greedy`. Decoding starts after the prompt, each verify
    round advances by its accept length, and rounds whose drafts would run past the recorded greedy tokens end
    the walk. topk > 1 drafts trees of `draft_tokens` - 1 verified tokens (default steps: as many as the chain);
    per_step_match then counts positions whose accepted depth reaches s.
    """
    draft_tokens = draft_tokens or steps + 1
    lengths, prefix_hits, positions = [], torch.zeros(steps), 0
    for seq in sequences:
        last = len(seq.tokens) - 1 - steps  # targets greedy[t+1 .. t+steps] must exist
        ts = torch.arange(seq.prompt_len - 1, last + 1)
        if len(ts) == 0:
            continue
        targets = torch.stack([seq.greedy[ts + s] for s in range(1, steps + 1)], dim=-1)
        if topk == 1 and draft_tokens == steps + 1:
            matches = accept_length(chain_drafts(mtp, embed, lm_head, seq, steps)[ts], targets)
        else:
            paths, depths = tree_drafts(mtp, embed, lm_head, seq, steps, topk, draft_tokens)
            matches = tree_accept_length(paths[ts], depths[ts], targets)
        for s in range(steps):
            prefix_hits[s] += (matches > s + 1).sum()
        positions += len(ts)
        lengths += decode_walk(matches.tolist())
    return Acceptance(
        mean_accept_length=sum(lengths) / max(len(lengths), 1),
        rounds=len(lengths),
        per_step_match=(prefix_hits / max(positions, 1)).tolist(),
        positions=positions,
    )
