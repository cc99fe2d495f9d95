"""Training loss of the MTP draft layer, unrolled over the draft chain the way NEXTN runs it.

Step 1 at position t takes (target hidden h_t, token x_{t+1}) and should predict the target's greedy token after
x_{t+1}. Step s > 1 at position t+s-1 takes (the layer's own output of step s-1, token x_{t+s}) and attends to
the draft KV of the target-fed positions <= t plus its own chain's earlier steps: what SGLang's EAGLE worker
feeds MiMoMTP (`logits_output.hidden_states` of the previous draft step, after final_layernorm) and what
`draft_acceptance.chain_drafts` simulates. Inputs are teacher-forced on the sequence's tokens; labels are the
target's greedy tokens, so sampled corpus sequences teach what greedy verification accepts.

Per step: soft cross-entropy against the target's own next-token distribution, softmax(lm_head h_{t+s}) (known
for free: lm_head is frozen and h is stored), over a token subset `vocab` (every token of the corpus) because
the lm_head product dominates the cost; plus a relative squared error pulling the output towards h_{t+s}.
Training passes that distribution precomputed (`top_targets`: its TOP_TARGETS most likely tokens, renormalised,
computed once per sequence instead of once per visit); evaluation and the tests compute it in full.

Training calls it with an `OutputHead` made once (the per-call gather of lm_head rows was 5 % of a step) and
`metrics=False` (no argmax over the logits: 7 % of a step); under bf16 autocast the products run in bf16 and
the softmaxes in float32.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tools.draft_training.draft_corpus import Sequence
from tools.draft_training.mtp_layer import MtpLayer


@dataclass
class OutputHead:
    """lm_head rows of a token subset, gathered once. remap: full token id -> row of `weight` (-1 outside)."""
    weight: torch.Tensor  # [V', H]
    remap: torch.Tensor | None

    @classmethod
    def of(cls, lm_head: torch.Tensor, vocab: torch.Tensor | None = None) -> "OutputHead":
        if vocab is None:
            return cls(lm_head, None)
        remap = torch.full((lm_head.shape[0],), -1, dtype=torch.long)
        remap[vocab] = torch.arange(len(vocab))
        return cls(lm_head[vocab].contiguous(), remap)


@dataclass
class StepLosses:
    soft_ce: torch.Tensor  # [steps] soft cross-entropy against the target distribution (training objective)
    hard_ce: torch.Tensor  # [steps] cross-entropy on the greedy token, over `vocab` (reported)
    hidden_err: torch.Tensor  # [steps] relative squared error to the target hidden state
    prefix_match: torch.Tensor  # [steps] share of chains whose steps 1..s all predict the greedy token (NaN
    # with metrics=False)
    counts: list[int]  # labelled positions per step


TOP_TARGETS = 32  # 98.7 % of the target's probability over the corpus vocabulary (64 sequences of SmolLM2 text)


@torch.no_grad()
def top_targets(hidden: torch.Tensor, head: OutputHead, k: int = TOP_TARGETS) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's next-token distribution softmax(head h) at each row of `hidden` [T, H], kept as its `k` most
    likely tokens: (rows of `head` [T, k] int64, probabilities renormalised to sum 1 [T, k] float32). The
    product runs in head.weight's dtype, the softmax in float32."""
    probs = F.softmax((hidden.to(head.weight.dtype) @ head.weight.T).float(), dim=-1)
    top, ids = probs.topk(min(k, probs.shape[-1]), dim=-1)
    return ids, top / top.sum(-1, keepdim=True)


def collate(sequences: list[Sequence], targets: list[tuple[torch.Tensor, torch.Tensor]] | None = None
            ) -> dict[str, torch.Tensor]:
    """Right-pad a batch (right padding is harmless under a causal mask). `label_ok[b, j]`: greedy[b, j] is a
    label to learn, i.e. j >= prompt_len - 1 (it predicts a continuation token) and j < len(sequence).
    targets: `top_targets` of each sequence's hidden states (then `target_ids` / `target_probs` [B, T, k] are
    added and unrolled_losses uses them instead of the full distribution)."""
    length = max(len(s.tokens) for s in sequences)
    hidden_size = sequences[0].hidden.shape[-1]
    tokens = torch.zeros(len(sequences), length, dtype=torch.long)
    greedy = torch.zeros(len(sequences), length, dtype=torch.long)
    hidden = torch.zeros(len(sequences), length, hidden_size)
    label_ok = torch.zeros(len(sequences), length, dtype=torch.bool)
    for b, s in enumerate(sequences):
        n = len(s.tokens)
        tokens[b, :n], greedy[b, :n], hidden[b, :n] = s.tokens, s.greedy, s.hidden.float()
        label_ok[b, max(s.prompt_len - 1, 0):n] = True
    batch = {"tokens": tokens, "greedy": greedy, "hidden": hidden, "label_ok": label_ok}
    if targets is not None:
        k = targets[0][0].shape[-1]
        batch["target_ids"] = torch.zeros(len(sequences), length, k, dtype=torch.long)
        batch["target_probs"] = torch.zeros(len(sequences), length, k)
        for b, (ids, probs) in enumerate(targets):
            batch["target_ids"][b, :len(ids)], batch["target_probs"][b, :len(ids)] = ids, probs
    return batch


def unrolled_losses(mtp: MtpLayer, embed: torch.Tensor, lm_head, batch: dict, steps: int,
                    vocab: torch.Tensor | None = None, metrics: bool = True, rows: torch.Tensor | None = None
                    ) -> StepLosses:
    """Losses of draft steps 1..`steps` at every start position of `batch` (from `collate`), or at `rows`.

    embed: [V, H], lm_head: [V, H] or an OutputHead (then `vocab` is ignored); both frozen. vocab: [V'] sorted
    token ids the logits are restricted to (None: all); labels outside it are dropped from the hard
    cross-entropy and the match counts. metrics=False skips the match counts (prefix_match is NaN). With
    `target_ids` / `target_probs` in `batch` (collate with targets, rows of the head passed) the soft
    cross-entropy is against those instead of the full softmax(head h). rows: sorted start positions [R] (of
    0..T-2) whose chains carry the loss, the same in every sequence; every position still gives step 1 its keys
    and values (None: every start position).
    """
    tokens, greedy, hidden, label_ok = batch["tokens"], batch["greedy"], batch["hidden"], batch["label_ok"]
    bsz, length = tokens.shape
    n = length - 1  # start positions t = 0..n-1 (token x_{t+1} must exist)
    out_head = lm_head if isinstance(lm_head, OutputHead) else OutputHead.of(lm_head, vocab)
    head, remap = out_head.weight, out_head.remap
    starts = torch.arange(n) if rows is None else rows
    r = len(starts)
    out, kv = mtp(hidden[:, :n], embed[tokens[:, 1:]], torch.arange(n).expand(bsz, -1), rows=rows)
    past_k, past_v = [kv[0]], [kv[1]]
    first = starts[:, None] >= torch.arange(n)  # step 1's keys: the target-fed positions <= t
    own = torch.eye(r, dtype=torch.bool)
    soft, hard, herr, match, counts = [], [], [], [], []
    chain_ok = torch.ones(bsz, r, dtype=torch.bool)
    for s in range(1, steps + 1):
        # out[:, i] is step s of the chain started at t = starts[i]: it predicts greedy[:, t+s]; h_{t+s} is its
        # ideal value
        at = starts + s
        inside = at < length
        at = at.clamp_max(length - 1)
        valid = label_ok[:, at] & inside
        labels = greedy[:, at]
        if remap is not None:
            labels = remap[labels]
        o, h, y = out[valid], hidden[:, at][valid], labels[valid]
        logits = (o @ head.T).float()
        logp = F.log_softmax(logits, dim=-1)
        if "target_ids" in batch:
            ids, probs = (batch[key][:, at][valid] for key in ("target_ids", "target_probs"))
            soft.append(-(probs * logp.gather(-1, ids)).sum(-1).mean())
        else:
            with torch.no_grad():
                target = F.softmax((h @ head.T).float(), dim=-1)
            soft.append(-(target * logp).sum(-1).mean())
        known = y >= 0
        hard.append(-logp.detach()[known, y[known]].mean() if known.any() else torch.tensor(0.0))
        o32 = o.float()
        herr.append((o32 - h).pow(2).mean() / h.pow(2).mean().clamp_min(1e-12))
        if metrics:
            hit = torch.zeros(bsz, r, dtype=torch.bool)
            hit[valid] = (logits.argmax(-1) == y).detach()
            chain_ok = chain_ok & hit
            match.append(chain_ok[valid].float().mean() if valid.any() else torch.tensor(0.0))
        else:
            match.append(torch.tensor(float("nan")))
        counts.append(int(valid.sum()))
        if s == steps:
            break
        # step s + 1 of the chain at t: the layer's own output, token x_{t+s+1} (0 past the end: no label there)
        nxt = starts + s + 1
        next_tokens = tokens[:, nxt.clamp_max(length - 1)].masked_fill(nxt >= length, 0)
        mask = torch.cat([first] + [own] * s, dim=1)
        out, kv = mtp(out, embed[next_tokens], (starts + s).expand(bsz, -1),
                      past_kv=(torch.cat(past_k, dim=2), torch.cat(past_v, dim=2)), mask=mask)
        past_k.append(kv[0])
        past_v.append(kv[1])
    return StepLosses(torch.stack(soft), torch.stack(hard), torch.stack(herr), torch.stack(match), counts)


def corpus_vocab(sequences: list[Sequence], limit: int | None = None) -> torch.Tensor:
    """Sorted ids of every token and greedy label in `sequences`; with `limit`, only the `limit` most frequent
    of them (ties: the smaller id)."""
    ids = torch.cat([torch.cat([s.tokens, s.greedy]) for s in sequences])
    if limit is None:
        return torch.unique(ids)
    counts = torch.bincount(ids)
    order = torch.sort(counts, descending=True, stable=True).indices
    return torch.sort(order[:min(limit, int((counts > 0).sum()))]).values


__all__ = ["TOP_TARGETS", "OutputHead", "StepLosses", "collate", "corpus_vocab", "top_targets", "unrolled_losses"]
