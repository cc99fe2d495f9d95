"""Acceptance simulation: hand-checked accept lengths and decode walk, the batched chain against drafting one
position at a time with explicit sequences, and the batched tree drafts against SGLang's own tree selection
driven one position at a time."""

import pytest
import torch
from tiny_llama import TINY_CONFIG, write_tiny_llama

from sglang_ext.models.mtp_checkpoint import fixed_seed_mtp_weights
from tools.draft_training.draft_acceptance import (
    accept_length,
    chain_drafts,
    decode_walk,
    measure,
    tree_accept_length,
    tree_drafts,
)
from tools.draft_training.draft_corpus import Sequence
from tools.draft_training.mtp_layer import MtpLayer


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


def test_tree_accept_length_takes_the_deepest_matching_path():
    # candidates of one position: [5], [6], [5, 7], [5, 8, 9]; -1 past each candidate's depth
    paths = torch.tensor([[[5, -1, -1], [6, -1, -1], [5, 7, -1], [5, 8, 9]]]).expand(4, -1, -1)
    depths = torch.tensor([[1, 1, 2, 3]]).expand(4, -1)
    targets = torch.tensor([[5, 8, 9], [5, 7, 0], [6, 0, 0], [7, 0, 0]])
    assert tree_accept_length(paths, depths, targets).tolist() == [4, 3, 2, 1]


def test_tree_drafts_with_topk_1_are_the_chain(tmp_path):
    mtp, embed, seq = _tiny(tmp_path)
    paths, depths = tree_drafts(mtp, embed, embed, seq, 3, topk=1, draft_tokens=4)
    assert depths.tolist() == [[1, 2, 3]] * (len(seq.tokens) - 1)
    assert torch.equal(paths[:, 2], chain_drafts(mtp, embed, embed, seq, 3))
    chain, tree = measure(mtp, embed, embed, [seq], 3), measure(mtp, embed, embed, [seq], 3, topk=1, draft_tokens=3)
    assert tree.positions == chain.positions  # draft_tokens 3 < steps + 1: the tree path, the deepest node dropped


def _sglang_tree(mtp, embed, head, seq, t, steps, topk, draft_tokens):
    """The verified candidates' paths at position t, drafted as SGLang's EAGLE worker does for one request:
    its select_top_k_tokens and organize_draft_results pick the tokens; the layer runs once per branch slot
    over an explicit sequence (the target pairs of positions 0..t, then what that slot was fed at earlier
    steps), which is what the slot's draft KV holds."""
    from sglang.srt.speculative.eagle_utils import organize_draft_results
    from sglang.srt.speculative.spec_utils import _select_top_k_tokens_first, _select_top_k_tokens_later
    later = getattr(_select_top_k_tokens_later, "_torchdynamo_orig_callable", _select_top_k_tokens_later)

    def run(hidden, tokens):
        out, _ = mtp(hidden[None], embed[tokens][None], torch.arange(len(tokens))[None])
        return out[0, -1]

    prefix_h, prefix_x = seq.hidden[: t + 1], seq.tokens[1: t + 2]
    h = run(prefix_h, prefix_x)[None]
    topk_p, topk_index = torch.softmax(h @ head.T, -1).topk(topk, dim=-1)
    fed = [([], []) for _ in range(topk)]
    scores, hs = None, h
    score_list, token_list, parents_list, beams = [], [], [], []
    paths = {}  # candidate index -> token path
    for i in range(steps):
        if i == 0:
            ids, hs, scores, info = _select_top_k_tokens_first(topk_p, topk_index, hs, topk)
            for c in range(topk):
                paths[c] = [int(topk_index[0, c])]
            beam_ids = list(range(topk))
        else:
            ids, hs, scores, info = later(i, topk_p, topk_index, hs, scores, topk)
            first = topk + topk * topk * (i - 1)
            for m in range(topk * topk):
                paths[first + m] = paths[beams[-1][m // topk]] + [int(info[1][0, m])]
            beam_ids = info[2][0].tolist()
        beams.append(beam_ids)
        score_list.append(info[0])
        token_list.append(info[1])
        parents_list.append(info[2])
        if i == steps - 1:
            break
        outs = []
        for b in range(topk):
            fed[b][0].append(hs[b])
            fed[b][1].append(int(ids[b]))
            outs.append(run(torch.cat([prefix_h, torch.stack(fed[b][0])]),
                            torch.cat([prefix_x, torch.tensor(fed[b][1])])))
        hs = torch.stack(outs)
        topk_p, topk_index = torch.softmax(hs @ head.T, -1).topk(topk, dim=-1)
    _, chosen, _ = organize_draft_results(score_list, token_list, parents_list, draft_tokens)
    return sorted(paths[c] for c in chosen[0].tolist())


@pytest.mark.parametrize("topk,draft_tokens", [(2, 4), (4, 4), (3, 6)])
def test_tree_drafts_equal_sglangs_selection_one_position_at_a_time(tmp_path, topk, draft_tokens):
    mtp, embed, seq = _tiny(tmp_path)
    # a softer head than the embeddings (top probability about 0.45 here, against 0.9999 with the embeddings):
    # with one-hot drafts every tree is the chain, and the test could not tell the branches apart
    head, steps = embed * 0.4, 3
    paths, depths = tree_drafts(mtp, embed, head, seq, steps, topk, draft_tokens)
    assert set(depths.flatten().tolist()) == {1, 2, 3}
    with torch.no_grad():
        for t in range(len(seq.tokens) - 1):
            ours = sorted(p[:d].tolist() for p, d in zip(paths[t], depths[t]))
            assert ours == _sglang_tree(mtp, embed, head, seq, t, steps, topk, draft_tokens), t
