"""Unrolled draft loss: each step's soft cross-entropy and hidden error against drafting one chain at a time
with explicit sequences (the layer's own output fed back, as NEXTN does), and the label mask of collate."""

import pytest
import torch
import torch.nn.functional as F
from tiny_llama import TINY_CONFIG, write_tiny_llama

from sglang_ext.models.mtp_checkpoint import fixed_seed_mtp_weights
from tools.draft_training.draft_corpus import Sequence
from tools.draft_training.draft_loss import OutputHead, collate, corpus_vocab, top_targets, unrolled_losses
from tools.draft_training.mtp_layer import MtpLayer

H, V = TINY_CONFIG["hidden_size"], TINY_CONFIG["vocab_size"]


def _setup(tmp_path):
    mtp = MtpLayer(TINY_CONFIG)
    mtp.load_state_dict(fixed_seed_mtp_weights(write_tiny_llama(tmp_path / "base"), seed=3))
    g = torch.Generator().manual_seed(7)
    embed = torch.randn(V, H, generator=g)
    head = torch.randn(V, H, generator=g)
    seqs = []
    for length, prompt_len in ((11, 3), (8, 2)):
        tokens = torch.randint(0, V, (length,), generator=g)
        greedy = torch.randint(0, V, (length,), generator=g)  # sampled text: greedy differs from the next token
        seqs.append(Sequence(tokens, torch.randn(length, H, generator=g), greedy, prompt_len))
    return mtp.eval(), embed, head, seqs


def _explicit(mtp, embed, head, seq, steps, starts=None):
    """Per step: (soft CE, hard CE, squared error, squared norm of the ideal) summed over the labelled chains
    (those starting at `starts`, None: all)."""
    sums = torch.zeros(steps, 4)
    counts = [0] * steps
    n = len(seq.tokens)
    for t in range(n - 1) if starts is None else [t for t in starts if t < n - 1]:
        hidden, tokens = seq.hidden[: t + 1], seq.tokens[1: t + 2]
        for s in range(1, steps + 1):
            if t + s > n - 1:
                break
            out, _ = mtp(hidden[None], embed[tokens][None], torch.arange(len(tokens))[None])
            o = out[0, -1]
            if t + s >= seq.prompt_len - 1:
                target = F.softmax(head @ seq.hidden[t + s], -1)
                logp = F.log_softmax(head @ o, -1)
                sums[s - 1] += torch.stack([-(target * logp).sum(), -logp[seq.greedy[t + s]],
                                            (o - seq.hidden[t + s]).pow(2).sum(), seq.hidden[t + s].pow(2).sum()])
                counts[s - 1] += 1
            if t + s + 1 > n - 1:
                break
            hidden = torch.cat([hidden, o[None]])  # the step's own output is the next step's hidden input
            tokens = torch.cat([tokens, seq.tokens[t + s + 1: t + s + 2]])  # teacher-forced next token
    return sums, counts


@pytest.mark.parametrize("rows", [None, [0, 2, 5, 8, 9]])
def test_unrolled_losses_equal_explicit_chains(tmp_path, rows):
    # rows: the loss from chains at some start positions only (the 8-token sequence has none at 8 and 9); every
    # position still gives its keys and values to step 1
    mtp, embed, head, seqs = _setup(tmp_path)
    steps = 3
    with torch.no_grad():
        got = unrolled_losses(mtp, embed, head, collate(seqs), steps,
                              rows=None if rows is None else torch.tensor(rows))
        totals, counts = torch.zeros(steps, 4), [0] * steps
        for seq in seqs:
            sums, c = _explicit(mtp, embed, head, seq, steps, rows)
            totals += sums
            counts = [a + b for a, b in zip(counts, c)]
    assert got.counts == counts
    n = torch.tensor(counts, dtype=torch.float32)
    torch.testing.assert_close(got.soft_ce, totals[:, 0] / n, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got.hard_ce, totals[:, 1] / n, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got.hidden_err, totals[:, 2] / totals[:, 3], rtol=1e-4, atol=1e-4)


def test_vocab_subset_restricts_the_logits(tmp_path):
    mtp, embed, head, seqs = _setup(tmp_path)
    vocab = corpus_vocab(seqs)
    assert torch.equal(vocab, torch.unique(torch.cat([s.tokens for s in seqs] + [s.greedy for s in seqs])))
    with torch.no_grad():
        full = unrolled_losses(mtp, embed, head, collate(seqs), 2)
        sub = unrolled_losses(mtp, embed, head, collate(seqs), 2, vocab)
    assert len(vocab) < V and sub.counts == full.counts
    assert (sub.hard_ce < full.hard_ce).all(), "fewer competing tokens must lower the cross-entropy"
    torch.testing.assert_close(sub.hidden_err, full.hidden_err)


def test_vocab_limit_keeps_the_most_frequent_ids():
    seqs = [Sequence(torch.tensor([5, 5, 5, 9, 2]), torch.zeros(5, 4), torch.tensor([9, 9, 7, 2, 2]), 1),
            Sequence(torch.tensor([7, 3]), torch.zeros(2, 4), torch.tensor([3, 11]), 1)]
    # counts: 2 -> 3, 3 -> 2, 5 -> 3, 7 -> 2, 9 -> 3, 11 -> 1
    assert corpus_vocab(seqs).tolist() == [2, 3, 5, 7, 9, 11]
    assert corpus_vocab(seqs, limit=3).tolist() == [2, 5, 9]
    assert corpus_vocab(seqs, limit=4).tolist() == [2, 3, 5, 9]  # ties: the smaller id
    assert corpus_vocab(seqs, limit=100).tolist() == [2, 3, 5, 7, 9, 11]


def test_collate_marks_continuation_labels():
    seqs = [Sequence(torch.arange(6), torch.zeros(6, 4), torch.arange(6), 3),
            Sequence(torch.arange(4), torch.zeros(4, 4), torch.arange(4), 1)]
    batch = collate(seqs)
    assert batch["label_ok"].tolist() == [[False, False, True, True, True, True],
                                          [True, True, True, True, False, False]]


def test_precomputed_top_targets_give_the_soft_cross_entropy_they_keep(tmp_path):
    mtp, embed, head, seqs = _setup(tmp_path)
    with torch.no_grad():
        full = unrolled_losses(mtp, embed, head, collate(seqs), 3)
        every = [top_targets(s.hidden, OutputHead.of(head), k=V) for s in seqs]
        assert all(torch.allclose(p.sum(-1), torch.ones(len(p))) for _, p in every)
        kept_all = unrolled_losses(mtp, embed, head, collate(seqs, every), 3)
        few = [top_targets(s.hidden, OutputHead.of(head), k=3) for s in seqs]
        kept_few = unrolled_losses(mtp, embed, head, collate(seqs, few), 3)
    torch.testing.assert_close(kept_all.soft_ce, full.soft_ce, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kept_all.hard_ce, full.hard_ce)
    assert torch.isfinite(kept_few.soft_ce).all() and not torch.allclose(kept_few.soft_ce, full.soft_ce)
    # three tokens: the soft CE of step s is against the top 3 of softmax(head h) at position t + s, renormalised
    seq, s = seqs[1], 2
    with torch.no_grad():
        one = unrolled_losses(mtp, embed, head, collate([seq], [few[1]]), s)
    logp_all = []
    for start in range(len(seq.tokens) - 1):
        if start + s > len(seq.tokens) - 1 or start + s < seq.prompt_len - 1:
            continue
        hidden, tokens = seq.hidden[: start + 1], seq.tokens[1: start + 2]
        with torch.no_grad():
            out, _ = mtp(hidden[None], embed[tokens][None], torch.arange(len(tokens))[None])
            hidden = torch.cat([hidden, out[0, -1:]])
            tokens = torch.cat([tokens, seq.tokens[start + 2: start + 3]])
            out, _ = mtp(hidden[None], embed[tokens][None], torch.arange(len(tokens))[None])
        probs = F.softmax(head @ seq.hidden[start + s], -1)
        top, ids = probs.topk(3)
        logp = F.log_softmax(head @ out[0, -1], -1)
        logp_all.append(-(top / top.sum() * logp[ids]).sum())
    assert len(logp_all) >= 3
    torch.testing.assert_close(one.soft_ce[-1], torch.stack(logp_all).mean(), rtol=1e-4, atol=1e-4)
