"""The torch routed-expert compute of the CPU platform against a float64 per-entry reference."""

import pytest
import torch
import torch.nn.functional as F

from sglang_ext.moe.expert_ops import routed_expert_entries, sum_top_k


def _reference(x, w13, w2, ids, weights):
    x, w13, w2, weights = (t.double() for t in (x, w13, w2, weights))
    out = torch.zeros(*ids.shape, w2.shape[1], dtype=torch.float64)
    inter = w2.shape[2]
    for t in range(ids.shape[0]):
        for j in range(ids.shape[1]):
            s = int(ids[t, j])
            if s < 0:
                continue
            h = w13[s] @ x[t]
            out[t, j] = weights[t, j] * (w2[s] @ (F.silu(h[:inter]) * h[inter:]))
    return out


@pytest.mark.parametrize("tokens,top_k,slots", [(1, 2, 2), (7, 2, 4), (33, 8, 16)])
def test_entries_match_float64_reference(tokens, top_k, slots):
    gen = torch.Generator().manual_seed(tokens)
    hidden, inter = 64, 48
    x = torch.randn(tokens, hidden, generator=gen)
    w13 = torch.randn(slots, 2 * inter, hidden, generator=gen) / hidden ** 0.5
    w2 = torch.randn(slots, hidden, inter, generator=gen) / inter ** 0.5
    ids = torch.randint(0, slots, (tokens, top_k), generator=gen)
    ids[::3, 0] = -1  # entries outside the wave
    weights = torch.rand(tokens, top_k, generator=gen)
    got = routed_expert_entries(x, w13, w2, ids, weights)
    ref = _reference(x, w13, w2, ids, weights)
    err = (got.double() - ref).abs().max().item()
    assert err < 1e-5, f"max abs error {err:.2e} against float64"
    assert torch.all(got[::3, 0] == 0), "an entry outside the table must contribute exactly 0"
    out = torch.empty(tokens, hidden)
    sum_top_k(got, out, 2.5)
    err_sum = (out.double() - 2.5 * ref.sum(1)).abs().max().item()
    assert err_sum < 1e-4, f"top-k sum error {err_sum:.2e}"
