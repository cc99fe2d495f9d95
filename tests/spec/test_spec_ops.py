"""The torch speculative-decoding ops against slow, obvious Python references (and, for sampling, against the
distribution they must reproduce)."""

import math
import random

import pytest
import torch

from sglang_ext.spec import cache_loc_ops, tree_ops, verify_ops
from sglang_ext.spec.verify_attention import target_verify_attention


def random_tree(n: int, rng: random.Random) -> list[int]:
    """parents[i] < i for i >= 1, parents[0] = -1 (nodes in topological order, as SGLang builds them)."""
    return [-1] + [rng.randrange(i) for i in range(1, n)]


def ancestor_mask(parents: list[int]) -> torch.Tensor:
    n = len(parents)
    m = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j != -1:
            m[i, j] = True
            j = parents[j]
    return m


def links(parents: list[int]) -> tuple[list[int], list[int]]:
    """first child and next sibling, children ordered by index."""
    n = len(parents)
    children = {i: [k for k in range(n) if parents[k] == i] for i in range(n)}
    first = [children[i][0] if children[i] else -1 for i in range(n)]
    sib = [-1] * n
    for i in range(n):
        kids = children[i]
        for a, b in zip(kids, kids[1:]):
            sib[a] = b
    return first, sib


@pytest.mark.parametrize("n,bs,seed", [(1, 1, 0), (4, 2, 1), (8, 3, 2), (16, 2, 3)])
def test_reconstruct_indices_from_tree_mask(n, bs, seed):
    rng = random.Random(seed)
    trees = [random_tree(n, rng) for _ in range(bs)]
    mask = torch.stack([ancestor_mask(p) for p in trees]).flatten()
    seq = torch.tensor([rng.randrange(1, 100) for _ in range(bs)])
    pos = torch.full((bs * n,), -7, dtype=torch.long)
    ridx, nxt, sib = (torch.full((bs, n), -7, dtype=torch.long) for _ in range(3))
    tree_ops.reconstruct_indices_from_tree_mask(mask, seq, pos, ridx, nxt, sib, bs, n)
    for b, parents in enumerate(trees):
        first, nsib = links(parents)
        depth = [ancestor_mask(parents)[i].sum().item() - 1 for i in range(n)]
        assert pos[b * n:(b + 1) * n].tolist() == [d + int(seq[b]) for d in depth]
        assert ridx[b].tolist() == list(range(b * n, (b + 1) * n))
        assert nxt[b].tolist() == first
        assert sib[b].tolist() == nsib


def tree_inputs(trees, rng, vocab):
    bs, n = len(trees), len(trees[0])
    cand = torch.tensor([[rng.randrange(vocab) for _ in range(n)] for _ in range(bs)])
    ridx = torch.arange(bs * n).view(bs, n)
    firsts, sibs = zip(*(links(p) for p in trees))
    return cand, ridx, torch.tensor(firsts), torch.tensor(sibs)


@pytest.mark.parametrize("n,seed", [(2, 0), (4, 1), (6, 2), (8, 3)])
def test_verify_tree_greedy(n, seed):
    rng = random.Random(seed)
    bs, vocab, steps = 4, 3, n  # tiny vocab: many matches
    trees = [random_tree(n, rng) for _ in range(bs)]
    cand, ridx, nxt, sib = tree_inputs(trees, rng, vocab)
    target = torch.tensor([[rng.randrange(vocab) for _ in range(n)] for _ in range(bs)])
    pred = torch.zeros(bs * n, dtype=torch.int32)
    acc = torch.full((bs, steps), -1, dtype=torch.int32)
    num = torch.zeros(bs, dtype=torch.int32)
    verify_ops.verify_tree_greedy(pred, acc, num, cand, ridx, nxt, sib, target)
    for b, parents in enumerate(trees):
        path, node = [0], 0
        while len(path) < steps:
            kids = [k for k in range(n) if parents[k] == node and cand[b, k] == target[b, node]]
            if not kids:
                break
            node = kids[0]
            path.append(node)
        assert num[b] == len(path) - 1
        assert acc[b, :len(path)].tolist() == [b * n + i for i in path]
        assert acc[b, len(path):].tolist() == [-1] * (steps - len(path))
        for i in path:  # the token after each accepted node is the target's argmax there
            assert pred[b * n + i] == target[b, i]


def test_tree_sampling_matches_target_distribution():
    """Rejection sampling must produce tokens distributed as the target: the first emitted token ~ q(root), and
    given it, the second ~ q(that node) or, when the first token was not a draft, the chain stops. Tested with
    a chi-square statistic on 6000 draws of a 2-level tree with two competing root children."""
    torch.manual_seed(0)
    vocab, n = 5, 4
    parents = [-1, 0, 0, 1]  # root children 1, 2; node 3 under 1
    cand = torch.tensor([[0, 1, 2, 3]])
    ridx = torch.arange(n).view(1, n)
    first, sib = links(parents)
    nxt, sib = torch.tensor([first]), torch.tensor([sib])
    q = torch.tensor([[0.1, 0.3, 0.2, 0.25, 0.15], [0.4, 0.1, 0.1, 0.3, 0.1],
                      [0.2, 0.2, 0.2, 0.2, 0.2], [0.05, 0.05, 0.1, 0.2, 0.6]]).view(1, n, vocab)
    draws = 6000
    counts = torch.zeros(vocab)
    counts_after_1 = torch.zeros(vocab)
    for _ in range(draws):
        pred = torch.zeros(n, dtype=torch.int32)
        acc = torch.full((1, 3), -1, dtype=torch.int32)
        num = torch.zeros(1, dtype=torch.int32)
        verify_ops.tree_speculative_sampling_target_only(
            pred, acc, num, cand, ridx, nxt, sib, torch.rand(1, n), torch.rand(1), q.clone(),
            torch.zeros_like(q))
        t1 = int(pred[0])
        counts[t1] += 1
        if t1 == 1:  # draft node 1 accepted: the next token is drawn from q(node 1), through node 3 or not
            assert int(acc[0, 1]) == 1
            counts_after_1[int(pred[1])] += 1
    for observed, probs in ((counts, q[0, 0]), (counts_after_1, q[0, 1])):
        total = observed.sum()
        expected = probs * total
        chi2 = float(((observed - expected) ** 2 / expected).sum())
        # 4 degrees of freedom: P(chi2 > 18.47) = 0.001
        assert chi2 < 18.47, f"chi2 {chi2:.1f} over {int(total)} draws: observed {observed.tolist()} vs {expected.tolist()}"


def test_tree_sampling_accepts_certain_drafts_and_rejects_impossible_ones():
    vocab, n = 4, 3
    cand = torch.tensor([[0, 2, 3]])
    ridx = torch.arange(n).view(1, n)
    nxt, sib = torch.tensor([[1, 2, -1]]), torch.tensor([[-1, -1, -1]])
    q = torch.zeros(1, n, vocab)
    q[0, 0, 2] = 1.0  # target certain of the first draft
    q[0, 1, 1] = 1.0  # and gives the second draft (3) no mass: token 1 must follow
    pred = torch.zeros(n, dtype=torch.int32)
    acc = torch.full((1, n), -1, dtype=torch.int32)
    num = torch.zeros(1, dtype=torch.int32)
    verify_ops.tree_speculative_sampling_target_only(pred, acc, num, cand, ridx, nxt, sib, torch.rand(1, n),
                                                     torch.rand(1), q, torch.zeros_like(q))
    assert int(num[0]) == 1 and acc[0].tolist() == [0, 1, -1]
    assert pred[:2].tolist() == [2, 1]


def reference_top_k(p, k):
    out = []
    for row, kk in zip(p.tolist(), k.tolist()):
        kth = sorted(row, reverse=True)[min(kk, len(row)) - 1]
        kept = [x if x >= kth else 0.0 for x in row]
        s = sum(kept)
        out.append([x / s for x in kept])
    return torch.tensor(out)


def reference_top_p(p, tp):
    out = []
    for row, t in zip(p.tolist(), tp.tolist()):
        order = sorted(range(len(row)), key=lambda i: -row[i])
        kept, mass = [0.0] * len(row), 0.0
        for i in order:
            if mass > t:
                break
            kept[i] = row[i]
            mass += row[i]
        s = sum(kept)
        out.append([x / s for x in kept])
    return torch.tensor(out)


def test_renorm():
    torch.manual_seed(1)
    p = torch.softmax(torch.randn(6, 11, dtype=torch.float64) * 2, -1)
    k = torch.tensor([1, 2, 5, 11, 20, 3])
    torch.testing.assert_close(verify_ops.top_k_renorm_prob(p, k), reference_top_k(p, k).to(p.dtype))
    tp = torch.tensor([0.1, 0.5, 0.9, 1.0, 0.3, 0.75], dtype=torch.float64)
    torch.testing.assert_close(verify_ops.top_p_renorm_prob(p, tp), reference_top_p(p, tp).to(p.dtype))


def test_cache_loc_ops():
    rng = random.Random(5)
    req_to_token = torch.randint(0, 1000, (6, 40), dtype=torch.int32)
    reqs = torch.tensor([4, 1, 3])
    start = torch.tensor([3, 0, 10])
    end = start + torch.tensor([4, 2, 5])
    got = cache_loc_ops.assign_extend_cache_locs(reqs, req_to_token, start, end)
    want = [int(req_to_token[r, c]) for r, s, e in zip(reqs, start, end) for c in range(int(s), int(e))]
    assert got.dtype == torch.int64 and got.tolist() == want

    table = req_to_token.clone()
    locs = torch.tensor([rng.randrange(1000) for _ in range(11)])
    cache_loc_ops.assign_req_to_token_pool(reqs, table, start, end, locs)
    assert cache_loc_ops.assign_extend_cache_locs(reqs, table, start, end).tolist() == locs.tolist()
    untouched = torch.ones_like(table, dtype=torch.bool)
    for r, s, e in zip(reqs, start, end):
        untouched[r, s:e] = False
    assert torch.equal(table[untouched], req_to_token[untouched])

    out_cache_loc = torch.arange(100, 112)  # 3 requests x window 4
    num_front = torch.tensor([1, 4, 2])
    front = torch.full((12,), -1, dtype=torch.int64)
    cache_loc_ops.fill_front_out_cache_loc(num_front, out_cache_loc, front)
    assert front[:7].tolist() == [100, 104, 105, 106, 107, 108, 109]

    accept_index = torch.tensor([[0, 2, -1], [4, -1, -1], [8, 9, 11]])
    acc_out = torch.zeros(9, dtype=torch.int64)
    cache_loc_ops.fill_accept_out_cache_loc(accept_index, out_cache_loc, acc_out)
    assert acc_out[:6].tolist() == [100, 102, 104, 108, 109, 111]

    tokens = torch.tensor([[5, 6, 7], [8, 0, 0], [9, 10, 11]]).flatten()
    bonus = torch.zeros(3, dtype=torch.int64)
    cache_loc_ops.fill_bonus_tokens(tokens, torch.tensor([2, 1, 3]), bonus, 3)
    assert bonus.tolist() == [6, 8, 11]

    seq = torch.tensor([5, 0, 30])
    out = torch.zeros(3 * 2 * 3, dtype=torch.int64)
    positions = torch.zeros(6, dtype=torch.int64)
    cache_loc_ops.assign_draft_cache_locs_contiguous(reqs, req_to_token, seq, out, 2, 3, positions)
    assert out.view(3, 6).tolist() == [req_to_token[r, s:s + 6].tolist() for r, s in zip(reqs, seq)]
    assert positions.tolist() == [5, 5, 0, 0, 30, 30]


def test_target_verify_attention_matches_dense_reference():
    torch.manual_seed(2)
    rng = random.Random(2)
    q_heads, kv_heads, d, n = 6, 2, 8, 4
    slots = 64
    k_cache, v_cache = torch.randn(slots, kv_heads, d), torch.randn(slots, kv_heads, d)
    seq = [5, 9]
    perm = torch.randperm(slots).to(torch.int32)
    req_to_token = perm.view(2, 32)
    reqs = torch.tensor([1, 0])
    out_cache_loc = torch.cat([req_to_token[r, s:s + n] for r, s in zip(reqs, seq)]).long()
    trees = [random_tree(n, rng) for _ in seq]
    mask = torch.cat([torch.cat((torch.ones(n, s, dtype=torch.bool), ancestor_mask(p)), 1).flatten()
                      for s, p in zip(seq, trees)])
    q = torch.randn(2 * n, q_heads * d)
    scale = 1 / math.sqrt(d)
    got = target_verify_attention(q, k_cache, v_cache, req_to_token, reqs, torch.tensor(seq), out_cache_loc, mask,
                                  n, q_heads, scale)
    for b, (r, s, parents) in enumerate(zip(reqs, seq, trees)):
        am = ancestor_mask(parents)
        for i in range(n):
            keys = list(range(s)) + [s + j for j in range(n) if am[i, j]]
            idx = req_to_token[r, keys].long()
            for h in range(q_heads):
                g = h // (q_heads // kv_heads)
                qi = q[b * n + i].view(q_heads, d)[h]
                w = torch.softmax(k_cache[idx, g] @ qi * scale, 0)
                want = w @ v_cache[idx, g]
                torch.testing.assert_close(got[b * n + i].view(q_heads, d)[h], want, rtol=1e-4, atol=1e-5)


def test_chain_speculative_sampling_matches_target_distribution():
    """With proposal q and target p, the first emitted token must follow p(root) whatever q is (chi-square over
    6000 draws), and a draft with q(x) = p(x) is always accepted."""
    torch.manual_seed(3)
    vocab, n = 5, 3
    p = torch.tensor([[0.1, 0.3, 0.2, 0.25, 0.15], [0.4, 0.1, 0.1, 0.3, 0.1],
                      [0.2, 0.2, 0.2, 0.2, 0.2]]).view(1, n, vocab)
    q = torch.tensor([[0.6, 0.1, 0.1, 0.1, 0.1], [0.1, 0.1, 0.6, 0.1, 0.1]]).view(1, n - 1, vocab)
    ridx = torch.arange(n).view(1, n)
    counts = torch.zeros(vocab)
    draws = 6000
    for _ in range(draws):
        d1 = int(torch.multinomial(q[0, 0], 1))
        d2 = int(torch.multinomial(q[0, 1], 1))
        pred = torch.zeros(n, dtype=torch.int32)
        acc = torch.full((1, n), -1, dtype=torch.int32)
        num = torch.zeros(1, dtype=torch.int32)
        verify_ops.chain_speculative_sampling(pred, acc, num, torch.tensor([[9, d1, d2]]), ridx, torch.rand(1, n),
                                              torch.rand(1), p, q)
        counts[int(pred[0])] += 1
    expected = p[0, 0] * draws
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 18.47, f"chi2 {chi2:.1f}: {counts.tolist()} vs {expected.tolist()}"  # df 4, p = 0.001

    pred = torch.zeros(n, dtype=torch.int32)
    acc = torch.full((1, n), -1, dtype=torch.int32)
    num = torch.zeros(1, dtype=torch.int32)
    verify_ops.chain_speculative_sampling(pred, acc, num, torch.tensor([[9, 1, 0]]), ridx, torch.full((1, n), 0.999),
                                          torch.rand(1), p, p[:, :2].clone())
    assert int(num[0]) == 2 and acc[0].tolist() == [0, 1, 2] and pred[:2].tolist() == [1, 0]


def test_eagle_chain_tree_and_commit_outputs():
    from sglang_ext.spec import eagle_ops

    bonus = torch.tensor([7, 8])
    drafts = torch.tensor([[1, 2, 3], [4, 5, 6]])
    seq = torch.tensor([10, 20])
    req_to_token = torch.arange(200, dtype=torch.int32).view(4, 50)
    reqs = torch.tensor([3, 0])
    mask, pos, ridx, nxt, sib, tokens, locs, mrope = eagle_ops.build_chain_tree(bonus, drafts, seq, None, reqs,
                                                                               req_to_token, True)
    assert tokens.tolist() == [7, 1, 2, 3, 8, 4, 5, 6]
    assert pos.tolist() == [10, 11, 12, 13, 20, 21, 22, 23]
    assert torch.equal(mask.view(2, 4, 4), torch.ones(4, 4, dtype=torch.bool).tril().repeat(2, 1, 1))
    assert ridx.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]] and nxt.tolist() == [[1, 2, 3, -1]] * 2
    assert sib.tolist() == [[-1] * 4] * 2
    assert locs.tolist() == [160, 161, 162, 163, 20, 21, 22, 23] and torch.equal(mrope[2], pos)

    predict = torch.tensor([11, 12, 13, 14, 21, 22, 23, 24], dtype=torch.int32)
    accept_index = torch.tensor([[0, 1, 2, -1], [4, -1, -1, -1]], dtype=torch.int32)
    accept_lens = torch.tensor([3, 1], dtype=torch.int32)
    new_lens, bonus_out, (last_steps, _), (correct, select, ids) = eagle_ops.prepare_verify_commit_outputs(
        predict, accept_index, accept_lens, seq, num_draft_tokens=4)
    assert new_lens.tolist() == [13, 21] and bonus_out.tolist() == [13, 21]
    assert last_steps.tolist() == [2, 0] and correct.tolist() == [2, 0] and select.tolist() == [2, 4]
    assert ids.tolist() == predict.tolist()

    prefix, extend, post, (positions, starts, _) = eagle_ops.prepare_draft_extend_layout(seq, 4, False)
    assert prefix.tolist() == [10, 20] and extend.tolist() == [4, 4] and post.tolist() == [14, 24]
    assert positions.tolist() == [10, 11, 12, 13, 20, 21, 22, 23] and starts.tolist() == [0, 4]

    logits = torch.tensor([[0.0, 3.0, 3.0], [float("nan"), -1.0, 0.5]])
    positions = torch.tensor([5, 9])
    draft_tokens = torch.zeros(2, 3, dtype=torch.long)
    p, index = eagle_ops.draft_topk1_postprocess(logits, positions, draft_tokens, 1)
    assert index.view(-1).tolist() == [1, 2] and positions.tolist() == [6, 10] and draft_tokens[:, 1].tolist() == [1, 2]
    assert p.view(-1).tolist() == [1.0, 1.0]


@pytest.mark.parametrize("topk", [1, 2, 4])
def test_draft_step_slots_follow_the_worker_layout(topk):
    """Each draft step's per-row keys: the committed prefix, then the row's branch slots up to this step, the
    last being the slot the worker writes this step (SGLang's per_step_draft_out_cache_loc layout:
    [bs, topk, num_steps] permuted to step-major)."""
    from sglang_ext.spec.draft_backends import check_step_slots, draft_step_slots

    g = torch.Generator().manual_seed(topk)
    num_steps, seq_lens, reqs = 3, [5, 1, 9], [2, 0, 3]
    req_to_token = torch.randperm(4 * 40, generator=g).view(4, 40).to(torch.int32)
    out = torch.empty(len(reqs) * topk * num_steps, dtype=torch.int64)
    cache_loc_ops.assign_draft_cache_locs_contiguous(
        torch.tensor(reqs), req_to_token, torch.tensor(seq_lens), out, topk, num_steps)
    per_step = out.view(len(reqs), topk, num_steps).permute(2, 0, 1).reshape(num_steps, -1)
    for step in range(num_steps - 1):
        table, lengths = draft_step_slots(req_to_token, reqs, seq_lens, topk, num_steps, step)
        assert lengths == [s + step + 1 for s in seq_lens for _ in range(topk)]
        for b, (req, s) in enumerate(zip(reqs, seq_lens)):
            for k in range(topk):
                row = table[b * topk + k, :lengths[b * topk + k]]
                assert row[:s].tolist() == req_to_token[req, :s].tolist()
                branch = req_to_token[req, s + k * num_steps:s + k * num_steps + step + 1]
                assert row[s:].tolist() == branch.tolist()
        check_step_slots(per_step[step], table, lengths)
        if topk > 1:  # branch-major instead of the worker's order: rows would read other branches' slots
            wrong = out.view(len(reqs), topk, num_steps)[:, :, step].t().reshape(-1)
            with pytest.raises(RuntimeError, match="branch slot layout"):
                check_step_slots(wrong, table, lengths)


def test_target_verify_attention_in_batch_invariant_mode_is_sglang_decode_bitwise():
    """bf16-KV verify in `--enable-deterministic-inference`: every chain draft row equals, bit for bit, SGLang's own
    torch_native decode of that token (`_run_sdpa_forward_decode`) over the same cache."""
    from sglang_ext import compat
    from sglang_ext.platform import batch_invariant

    torch.manual_seed(4)
    q_heads, kv_heads, d, n, slots = 9, 3, 64, 4, 256
    k_cache, v_cache = torch.randn(slots, kv_heads, d), torch.randn(slots, kv_heads, d)
    seq = [37, 90]
    req_to_token = torch.randperm(slots).to(torch.int32).view(2, 128)
    reqs = torch.tensor([1, 0])
    out_cache_loc = torch.cat([req_to_token[r, s:s + n] for r, s in zip(reqs, seq)]).long()
    q = torch.randn(2 * n, q_heads * d)
    scale = 1 / math.sqrt(d)
    def verify():
        return target_verify_attention(q, k_cache, v_cache, req_to_token, reqs, torch.tensor(seq), out_cache_loc,
                                       None, n, q_heads, scale).view(2 * n, q_heads, d)

    batch_invariant.enable()
    try:
        with batch_invariant.token_step(True):
            got = verify()
    finally:
        batch_invariant.disable()
    decode = compat.TorchNativeAttnBackend._run_sdpa_forward_decode
    want = torch.empty_like(got)
    for b, (r, s) in enumerate(zip(reqs, seq)):
        for j in range(n):
            decode(None, q[b * n + j:b * n + j + 1].view(1, q_heads, d), want[b * n + j:b * n + j + 1], k_cache,
                   v_cache, req_to_token, r.view(1), torch.tensor([s + j + 1]), scaling=scale, enable_gqa=True,
                   causal=False)
    rows_differing = [i for i in range(2 * n) if not torch.equal(got[i], want[i])]
    assert not rows_differing, f"verify rows {rows_differing} differ from SGLang's decode of the same token"
    # Without the mode the masked 4-row SDPA differs from decode in the last bits (all 8 rows, measured).
    assert not torch.equal(verify(), want), "verify without the mode equals decode bitwise: this test has no power"
