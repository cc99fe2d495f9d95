"""Acceptance simulation: hand-checked accept lengths and decode walk, and the batched chain against
drafting one position at a time with explicit sequences."""

import torch

from sglang_ext.models.draft_acceptance import accept_length, chain_drafts, decode_walk, measure
from sglang_ext.models.draft_corpus import Sequence
from sglang_ext.models.mtp_checkpoint import fixed_seed_mtp_weights
from sglang_ext.models.mtp_layer import MtpLayer
from tiny_llama import TINY_CONFIG, write_tiny_llama


def test_accept_length_counts_the_matching_prefix_plus_the_bonus_token():
    drafts = torch.tensor([[5, 6, 7], [5, 0, 7], [0, 6, 7], [5, 6, 8]])
    targets = torch.tensor([[5, 6, 7], [5, 6, 7], [5, 6, 7], [5, 6, 7]])
    assert accept_length(drafts, targets).tolist() == [4, 2, 1, 3]


def test_decode_walk_jumps_by_each_rounds_accept_length():
    # rounds start at 0 (accepts 2) -> 2 (accepts 4) -> 6 (accepts 1) -> 7 (accepts 3) -> 10: past the end
    assert decode_walk([2, 9, 4, 9, 9, 9, 1, 3, 9, 9]) == [2, 4, 1, 3]


def _tiny(tmp_path):
    mtp = MtpLayer(TINY_CONFIG)
    mtp.load_state_dict(fixed_seed_mtp_weights(write_tiny_llama(tmp_path / "base"), seed=2))
    g = torch.Generator().manual_seed(4)
    embed = torch.randn(TINY_CONFIG["vocab_size"], TINY_CONFIG["hidden_size"], generator=g)
    tokens = torch.randint(0, TINY_CONFIG["vocab_size"], (12,), generator=g)
    seq = Sequence(tokens, torch.randn(12, TINY_CONFIG["hidden_size"], generator=g), tokens.roll(-1), prompt_len=3)
    return mtp.eval(), embed, seq


def test_chain_drafts_equal_drafting_each_position_from_an_explicit_sequence(tmp_path):
    mtp, embed, seq = _tiny(tmp_path)
    steps = 3
    drafts = chain_drafts(mtp, embed, embed, seq, steps)
    with torch.no_grad():
        for t in range(len(seq.tokens) - 1):
            # draft KV: pairs (h_j, x_{j+1}) at positions 0..t, then each draft step appended as one more position
            hidden, tokens = seq.hidden[: t + 1], seq.tokens[1: t + 2]
            expected = []
            for step in range(steps):
                out, _ = mtp(hidden[None], embed[tokens][None], torch.arange(len(tokens))[None])
                token = int((out[0, -1] @ embed.T).argmax())
                expected.append(token)
                hidden = torch.cat([hidden, out[0, -1:]])
                tokens = torch.cat([tokens, torch.tensor([token])])
            assert drafts[t].tolist() == expected, t


def test_measure_walks_greedy_continuations(tmp_path):
    mtp, embed, seq = _tiny(tmp_path)
    steps = 2
    drafts = chain_drafts(mtp, embed, embed, seq, steps)
    ts = range(seq.prompt_len - 1, len(seq.tokens) - 1 - steps + 1)
    per_position = [int(accept_length(drafts[t], seq.greedy[t + 1: t + 1 + steps])) for t in ts]
    result = measure(mtp, embed, embed, [seq], steps)
    rounds = decode_walk(per_position)
    assert result.rounds == len(rounds) and result.mean_accept_length == sum(rounds) / len(rounds)
    assert result.positions == len(per_position)
    assert result.per_step_match[0] == sum(a > 1 for a in per_position) / len(per_position)
