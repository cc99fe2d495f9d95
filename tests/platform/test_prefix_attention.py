"""The CPU platform's extend over a cached prefix (platform/prefix_attention.py) against a plain causal attention
over the whole sequence, and against SGLang's own torch_native extend it replaces."""

import pytest
import torch

from sglang_ext.platform.prefix_attention import prefix_causal_mask, sdpa_extend_new_rows


def full_causal_last_rows(q_all, k, v, scale, new):
    """Reference: causal attention of every row of the sequence (float64), the last `new` rows kept."""
    group = q_all.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    s = torch.einsum("mhd,lhd->hml", q_all.double(), k) * scale
    n = q_all.shape[0]
    s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril()[None], float("-inf"))
    return torch.einsum("hml,lhd->mhd", torch.softmax(s, -1), v)[n - new:]


def make_batch(prefix, new, hq=6, hkv=2, d=16, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    slots_total = sum(p + m for p, m in zip(prefix, new)) + 5
    k_cache = torch.randn(slots_total, hkv, d, generator=g).to(dtype)
    v_cache = torch.randn(slots_total, hkv, d, generator=g).to(dtype)
    perm = torch.randperm(slots_total, generator=g)  # requests' slots scattered over the pool
    req_to_token = torch.zeros(len(prefix) + 1, max(p + m for p, m in zip(prefix, new)) + 3, dtype=torch.int64)
    q_rows, full_q, at = [], [], 0
    for b, (p, m) in enumerate(zip(prefix, new)):
        req_to_token[b + 1, : p + m] = perm[at: at + p + m]
        at += p + m
        qa = torch.randn(p + m, hq, d, generator=g)
        full_q.append(qa)
        q_rows.append(qa[p:])
    return dict(query=torch.cat(q_rows), k_cache=k_cache, v_cache=v_cache, req_to_token=req_to_token,
                req_pool_indices=torch.arange(1, len(prefix) + 1), seq_lens=torch.tensor([p + m for p, m in zip(prefix, new)]),
                extend_prefix_lens=torch.tensor(prefix), extend_seq_lens=torch.tensor(new)), full_q


def test_mask_is_end_aligned():
    m = prefix_causal_mask(3, 2, torch.device("cpu"))
    assert m.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]


@pytest.mark.parametrize("prefix,new", [([0], [7]), ([9], [1]), ([12, 0, 5], [3, 4, 1]), ([30, 2], [0, 6])])
def test_new_rows_match_full_causal_attention(prefix, new):
    batch, full_q = make_batch(prefix, new)
    out = torch.full_like(batch["query"], float("nan"))
    scale = 0.25
    sdpa_extend_new_rows(batch["query"], out, batch["k_cache"], batch["v_cache"], batch["req_to_token"],
                         batch["req_pool_indices"], batch["seq_lens"], batch["extend_prefix_lens"],
                         batch["extend_seq_lens"], scaling=scale, enable_gqa=True, causal=True)
    start = 0
    for b, (p, m) in enumerate(zip(prefix, new)):
        slots = batch["req_to_token"][b + 1, : p + m]
        want = full_causal_last_rows(full_q[b], batch["k_cache"][slots].float(), batch["v_cache"][slots].float(), scale, m)
        torch.testing.assert_close(out[start:start + m].double(), want, atol=2e-5, rtol=2e-5)
        start += m
    assert not out.isnan().any()


def test_matches_sglang_torch_native_extend():
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    original = TorchNativeAttnBackend._run_sdpa_forward_extend
    assert original.__module__ == "sglang.srt.layers.attention.torch_native_backend", "already hooked in this process"
    batch, _ = make_batch([40, 0, 7], [2, 5, 3])
    ours = torch.zeros_like(batch["query"])
    theirs = torch.zeros_like(batch["query"])
    args = [batch[k] for k in ("k_cache", "v_cache", "req_to_token", "req_pool_indices", "seq_lens",
                               "extend_prefix_lens", "extend_seq_lens")]
    sdpa_extend_new_rows(batch["query"], ours, *args, scaling=0.3, enable_gqa=True, causal=True)
    original(None, batch["query"], theirs, *args, None, scaling=0.3, enable_gqa=True, causal=True)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
