"""The batched CPU attention (one call per layer for the whole batch) against the per-request reference.

Decode, chain target-verify / draft-extend (new tokens causal), and tree target-verify with SGLang's custom
mask layout; seeded inputs in a real compressed pool; the oracle is `sglang_ext.kvformats.reference`.
"""

from __future__ import annotations

import pytest
import torch

from sglang_ext.kvcache.batch_plan import plan_decode, plan_extend
from sglang_ext.kvcache.batched_attention import batched_attention, pad_batch
from sglang_ext.kvcache.formats import KV_CACHE_DTYPES
from sglang_ext.kvformats import get_format, reference

H_KV, GROUP, DIM, SLOTS = 3, 3, 64, 600
SCALE = DIM**-0.5


def filled_planes(fmt, gen):
    planes = fmt.allocate(SLOTS, H_KV, "cpu")
    k = torch.randn(SLOTS, H_KV, DIM, generator=gen)
    v = torch.randn(SLOTS, H_KV, DIM, generator=gen)
    for name, rows in fmt.quantize(k, v).items():
        planes[name][:] = rows
    return planes


def req_to_token_table(gen, rows=6, width=90):
    # Each request's slots: a random permutation, so sequences interleave in the pool.
    return torch.randperm(SLOTS - 1, generator=gen)[: rows * width].view(rows, width) + 1


def tree_mask(prefix_lens, num_draft, gen) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's verify mask for random draft trees: each draft token sees the prefix, itself and its ancestors."""
    blocks = []
    for lp in prefix_lens:
        parent = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, num_draft)]
        block = torch.zeros(num_draft, lp + num_draft, dtype=torch.bool)
        block[:, :lp] = True
        for i in range(num_draft):
            j = i
            while j >= 0:
                block[i, lp + j] = True
                j = parent[j]
        blocks.append(block.flatten())
    sizes = torch.tensor([b.numel() for b in blocks])
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(sizes, 0)])
    return torch.cat(blocks), indptr


def max_err(a, b) -> float:
    return float((a - b).abs().max())


@pytest.mark.parametrize("name", KV_CACHE_DTYPES)
def test_decode_batch_matches_reference(name):
    gen = torch.Generator().manual_seed(0)
    fmt = get_format(name, DIM, DIM)
    planes = filled_planes(fmt, gen)
    table = req_to_token_table(gen)
    seq_lens = [1, 37, 90, 5, 64]
    plan = plan_decode(table, [4, 0, 2, 5, 1], seq_lens)
    q = torch.randn(len(seq_lens), H_KV * GROUP, DIM, generator=gen)
    got = batched_attention(fmt, q, planes, pad_batch(plan, new_tokens=False), SCALE, logit_cap=30.0)
    ref = reference.decode_attention(fmt, q, planes, plan.kv_indptr, plan.kv_indices, SCALE, logit_cap=30.0)
    assert max_err(got, ref) < 1e-5, f"{name}: decode max |batched - reference| {max_err(got, ref):.2e}"


@pytest.mark.parametrize("name", KV_CACHE_DTYPES)
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_verify_batch_matches_reference(name, tree):
    gen = torch.Generator().manual_seed(1)
    fmt = get_format(name, DIM, DIM)
    planes = filled_planes(fmt, gen)
    table = req_to_token_table(gen)
    prefix_lens, num_draft = [0, 12, 80, 33], 6
    plan = plan_extend(table, [3, 1, 0, 4], prefix_lens, [num_draft] * len(prefix_lens))
    t = num_draft * len(prefix_lens)
    q = torch.randn(t, H_KV * GROUP, DIM, generator=gen)
    k_new = torch.randn(t, H_KV, DIM, generator=gen)
    v_new = torch.randn(t, H_KV, DIM, generator=gen)
    mask, mask_indptr = tree_mask(prefix_lens, num_draft, gen) if tree else (None, None)
    padded = pad_batch(plan, new_tokens=True, custom_mask=mask, mask_indptr=mask_indptr)
    got = batched_attention(fmt, q, planes, padded, SCALE, k_new=k_new, v_new=v_new)
    ref = reference.extend_attention(
        fmt, q, k_new, v_new, planes, plan.qo_indptr, plan.kv_indptr, plan.kv_indices, SCALE,
        custom_mask=mask, mask_indptr=mask_indptr,
    )  # fmt: skip
    assert max_err(got, ref) < 1e-5, f"{name}: verify max |batched - reference| {max_err(got, ref):.2e}"
    if tree:
        causal = reference.extend_attention(
            fmt, q, k_new, v_new, planes, plan.qo_indptr, plan.kv_indptr, plan.kv_indices, SCALE
        )
        assert max_err(got, causal) > 1e-3, "the tree mask changed nothing: the test would not see it ignored"


def test_batched_reads_only_the_batch_slots():
    # Poison every slot the batch does not name: the output must not change.
    gen = torch.Generator().manual_seed(2)
    fmt = get_format("octave_k3v4", DIM, DIM)
    planes = filled_planes(fmt, gen)
    table = req_to_token_table(gen)
    plan = plan_decode(table, [2, 3], [40, 17])
    q = torch.randn(2, H_KV * GROUP, DIM, generator=gen)
    padded = pad_batch(plan, new_tokens=False)
    before = batched_attention(fmt, q, planes, padded, SCALE)
    others = torch.ones(SLOTS, dtype=torch.bool)
    others[plan.kv_indices] = False
    for plane in planes.values():
        plane[others] = torch.randint_like(plane[others], 0, 100)
    assert torch.equal(batched_attention(fmt, q, planes, padded, SCALE), before)
