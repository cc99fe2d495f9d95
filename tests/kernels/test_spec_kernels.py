"""Triton speculative-decoding kernels against the torch ops (sglang_ext/spec) under the interpreter."""

import math
import random

import pytest
import torch

from sglang_ext.kernels import spec_cache_locs, spec_tree
from sglang_ext.spec import cache_loc_ops, tree_ops, verify_ops


def _random_parents(n, rng):
    return [-1] + [rng.randrange(i) for i in range(1, n)]


def _ancestor_mask(parents):
    n = len(parents)
    m = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j != -1:
            m[i, j] = True
            j = parents[j]
    return m


@pytest.mark.parametrize("n,bs", [(1, 1), (3, 2), (4, 3), (8, 2), (16, 1)])
def test_reconstruct_tree_kernel_matches_torch(n, bs, device):
    rng = random.Random(n * 10 + bs)
    mask = torch.stack([_ancestor_mask(_random_parents(n, rng)) for _ in range(bs)]).flatten().to(device)
    seq = torch.randint(1, 50, (bs,), device=device)
    want = [torch.full((bs, n), -9, dtype=torch.int64, device=device) for _ in range(4)]
    got = [t.clone() for t in want]
    tree_ops.reconstruct_indices_from_tree_mask(mask, seq, want[0].view(-1), *want[1:], bs, n)
    spec_tree.reconstruct_indices_from_tree_mask(mask, seq, got[0].view(-1), *got[1:], bs, n)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@pytest.mark.parametrize("n,seed", [(2, 0), (4, 1), (8, 2)])
def test_verify_tree_greedy_kernel_matches_torch(n, seed, device):
    rng = random.Random(seed)
    bs, vocab = 4, 3
    mask = torch.stack([_ancestor_mask(_random_parents(n, rng)) for _ in range(bs)]).flatten()
    links = [torch.empty((bs, n), dtype=torch.int64) for _ in range(4)]
    tree_ops.reconstruct_indices_from_tree_mask(mask, torch.zeros(bs, dtype=torch.long), links[0].view(-1),
                                                *links[1:], bs, n)
    ridx, nxt, sib = (t.to(device) for t in links[1:])
    cand = torch.randint(0, vocab, (bs, n), device=device)
    target = torch.randint(0, vocab, (bs, n), device=device)
    outs = []
    for fn in (verify_ops.verify_tree_greedy, spec_tree.verify_tree_greedy):
        pred = torch.zeros(bs * n, dtype=torch.int32, device=device)
        acc = torch.full((bs, n), -1, dtype=torch.int32, device=device)
        num = torch.zeros(bs, dtype=torch.int32, device=device)
        fn(pred, acc, num, cand, ridx, nxt, sib, target)
        outs.append((pred, acc, num))
    for g, w in zip(outs[1], outs[0]):
        assert torch.equal(g, w)


def test_cache_loc_kernels_match_torch(device):
    req_to_token = torch.randint(0, 1000, (6, 40), dtype=torch.int32, device=device)
    reqs = torch.tensor([4, 1, 3], device=device)
    start = torch.tensor([3, 0, 10], device=device)
    end = start + torch.tensor([4, 2, 5], device=device)
    want = cache_loc_ops.assign_extend_cache_locs(reqs, req_to_token, start, end)
    got = spec_cache_locs.assign_extend_cache_locs(reqs, req_to_token, start, end)
    assert torch.equal(got, want)

    accept_index = torch.tensor([[0, 2, -1], [4, -1, -1], [8, 9, 11]], dtype=torch.int32, device=device)
    out_cache_loc = torch.arange(100, 112, device=device)
    want = torch.zeros(9, dtype=torch.int64, device=device)
    got = torch.zeros(9, dtype=torch.int64, device=device)
    cache_loc_ops.fill_accept_out_cache_loc(accept_index, out_cache_loc, want)
    spec_cache_locs.fill_accept_out_cache_loc(accept_index, out_cache_loc, got)
    assert torch.equal(got, want)


@pytest.mark.parametrize("n,vocab,seed", [(2, 7, 0), (4, 50, 1), (6, 1500, 2)])
def test_tree_sampling_kernel_matches_torch(n, vocab, seed, device):
    """Same coins, same result: accepted path, counts, every predicted token, and the rejected-mass buffer."""
    from sglang_ext.kernels import spec_sampling

    rng = random.Random(seed)
    torch.manual_seed(seed)
    bs = 5
    mask = torch.stack([_ancestor_mask(_random_parents(n, rng)) for _ in range(bs)]).flatten()
    links = [torch.empty((bs, n), dtype=torch.int64) for _ in range(4)]
    tree_ops.reconstruct_indices_from_tree_mask(mask, torch.zeros(bs, dtype=torch.long), links[0].view(-1),
                                                *links[1:], bs, n)
    ridx, nxt, sib = (t.to(device) for t in links[1:])
    logits = torch.randn(bs, n, vocab) * 3
    logits[:, :, :3] += 4 + math.log(vocab)  # a few likely tokens, so drafts among them get accepted
    target = torch.softmax(logits, -1).to(device)
    cand = torch.randint(0, 3, (bs, n), device=device)
    coins, final = torch.rand(bs, n, device=device), torch.rand(bs, device=device)
    outs = []
    # the torch op indexes through numpy: it runs on CPU copies when the kernel runs on a GPU
    for fn, dev in ((verify_ops.tree_speculative_sampling_target_only, "cpu"),
                    (spec_sampling.tree_speculative_sampling_target_only, device)):
        pred = torch.zeros(bs * n, dtype=torch.int32, device=dev)
        acc = torch.full((bs, n), -1, dtype=torch.int32, device=dev)
        num = torch.zeros(bs, dtype=torch.int32, device=dev)
        draft = torch.zeros(target.shape, dtype=target.dtype, device=dev)
        inputs = (t.to(dev) for t in (cand, ridx, nxt, sib, coins, final))
        fn(pred, acc, num, *inputs, target.to(dev).clone(), draft)
        outs.append(tuple(t.cpu() for t in (pred, acc, num, draft)))
    assert int(outs[0][2].sum()) > 0, "no draft accepted: the comparison would not cover the accept path"
    for g, w in zip(outs[1], outs[0]):
        assert torch.equal(g, w)


def _random_draft(bs, topk, depth, n, rng):
    """EAGLE draft-step outputs as SGLang's organize_draft_results lays them out: parent_list [bs, topk*(depth-1)+1]
    (-1, the step-0 tokens, then each later step's expanded tokens as flat score indices) and the sorted flat
    indices of the n - 1 selected tokens. Selections are random, so some parents are not selected (linked to none)."""
    total = topk + (depth - 1) * topk * topk
    parents, selected = [], []
    for _ in range(bs):
        row = [-1] + list(range(topk))
        for step in range(1, depth - 1):
            row += [topk + topk * topk * (step - 1) + c for c in rng.sample(range(topk * topk), topk)]
        parents.append(row)
        # step-0 token 0 always, so the root has a child; later tokens' parents may or may not be selected
        selected.append(sorted([0] + rng.sample(range(1, total), n - 2)) if n > 1 else [])
    return torch.tensor(parents, dtype=torch.int64), torch.tensor(selected, dtype=torch.int64)


@pytest.mark.parametrize("topk,depth,n,bs,full", [(1, 4, 4, 3, True), (2, 3, 5, 2, True), (4, 4, 8, 3, True),
                                                  (4, 4, 8, 2, False), (8, 5, 16, 2, True), (1, 1, 1, 2, False)])
def test_build_tree_kernel_matches_torch(topk, depth, n, bs, full, device):
    """Every output buffer equal to the torch op's; the full mask's prefix columns left as the caller filled them."""
    rng = random.Random(topk * 100 + n * 10 + bs)
    parent_list, selected = _random_draft(bs, topk, depth, n, rng)
    selected = selected.view(bs, n - 1)
    seq = torch.tensor([rng.randrange(1, 20) for _ in range(bs)], dtype=torch.int64)
    mask_len = (int(seq.sum()) * n if full else 0) + n * n * bs
    outs = []
    for fn in (tree_ops.build_tree_efficient, spec_tree.build_tree_efficient):
        mask = torch.ones(mask_len, dtype=torch.bool)
        pos = torch.full((bs * n,), -7, dtype=torch.int64)
        ridx, nxt, sib = torch.full((3, bs, n), -1, dtype=torch.int64)
        bufs = [t.to(device) for t in (mask, pos, ridx, nxt, sib)]
        fn(parent_list.to(device), selected.to(device), seq.to(device), *bufs, topk, depth, n, full)
        outs.append(bufs)
    want_links = outs[0][3]
    if n > 1:
        assert (want_links != -1).any(), "no links: the comparison would not cover the linking"
    for name, g, w in zip(("mask", "positions", "retrieve_index", "next_token", "next_sibling"), outs[1], outs[0]):
        assert torch.equal(g, w), f"{name}: {g.tolist()} != {w.tolist()}"
