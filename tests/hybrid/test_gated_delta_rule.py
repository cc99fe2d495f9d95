"""The torch gated delta rule ops (extend, decode, verify) against the float64 token-by-token reference."""

import pytest
import torch
from gdn_reference import D, delta_rule_sequence, gates

from sglang_ext.hybrid.ops.errors import UnsupportedGdnOption
from sglang_ext.hybrid.ops.gated_delta_rule import CHUNK_SIZE, chunk_gated_delta_rule
from sglang_ext.hybrid.ops.recurrent import (
    fused_recurrent_gated_delta_rule_packed_decode,
    fused_sigmoid_gating_delta_rule_update,
)

# float64 inputs must agree to rounding. float32: the chunk solve over 200-token chains measured a max abs error
# of 9e-7 on outputs and states of magnitude ~0.3 (float32 rounding); 2e-5 leaves a 20x margin.
TOL = {torch.float64: 1e-10, torch.float32: 2e-5}


def _inputs(total, num_k_heads, num_v_heads, head_k, head_v, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(total, num_k_heads, head_k, generator=gen, dtype=D)
    k = torch.randn(total, num_k_heads, head_k, generator=gen, dtype=D)
    v = torch.randn(total, num_v_heads, head_v, generator=gen, dtype=D)
    a = torch.randn(total, num_v_heads, generator=gen, dtype=D)
    b = torch.randn(total, num_v_heads, generator=gen, dtype=D)
    A_log = torch.rand(num_v_heads, generator=gen, dtype=D) * 2 - 1
    dt_bias = torch.randn(num_v_heads, generator=gen, dtype=D)
    return q, k, v, a, b, A_log, dt_bias


def _pool(slots, num_v_heads, head_v, head_k, seed, zero=False):
    gen = torch.Generator().manual_seed(seed)
    pool = torch.randn(slots, num_v_heads, head_v, head_k, generator=gen, dtype=D) * 0.3
    return pool.zero_() if zero else pool


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("lengths,heads,initial", [
    ([1, 63, 64, 65, 130], (2, 4), True),   # chunk boundaries, GQA 2:1
    ([5, 129], (2, 2), False),               # zero start (fresh slots)
    ([200], (1, 3), True),                    # group of 3 value heads per key head, 4 chunks
])
def test_chunk_matches_reference(dtype, lengths, heads, initial):
    num_k_heads, num_v_heads = heads
    head_k, head_v = 16, 8
    total = sum(lengths)
    q, k, v, a, b, A_log, dt_bias = _inputs(total, num_k_heads, num_v_heads, head_k, head_v, seed=len(lengths))
    g, beta = gates(A_log, a, dt_bias, b)
    slots = list(range(len(lengths) + 2))[2:]  # sequences in slots 2.., slots 0-1 untouched
    pool = _pool(len(lengths) + 2, num_v_heads, head_v, head_k, seed=7, zero=not initial)
    reference_pool = pool.clone()
    pool_t = pool.to(dtype, copy=True)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int64)
    o, none, h = chunk_gated_delta_rule(
        q.to(dtype)[None], k.to(dtype)[None], v.to(dtype)[None], g.to(dtype)[None], beta.to(dtype)[None],
        initial_state=pool_t, initial_state_indices=torch.tensor(slots), cu_seqlens=cu,
        use_qk_l2norm_in_kernel=True)
    assert none is None and o.dtype == dtype and o.shape == (1, total, num_v_heads, head_v)
    tol = TOL[dtype]
    chunk_rows = 0
    for n, length in enumerate(lengths):
        start = int(cu[n])
        ref_o, after = delta_rule_sequence(reference_pool[slots[n]], q[start:start + length], k[start:start + length],
                                           v[start:start + length], g[start:start + length],
                                           beta[start:start + length], scale=head_k ** -0.5)
        err = (o[0, start:start + length].to(D) - ref_o).abs().max().item()
        assert err < tol, f"sequence {n} (length {length}): output max abs error {err:.3g} >= {tol}"
        err = (pool_t[slots[n]].to(D) - after[-1]).abs().max().item()
        assert err < tol, f"sequence {n}: final state max abs error {err:.3g}"
        for c, chunk_start in enumerate(range(0, length, CHUNK_SIZE)):
            expected = reference_pool[slots[n]] if chunk_start == 0 else after[chunk_start - 1]
            err = (h[0, chunk_rows + c].to(D) - expected).abs().max().item()
            assert err < tol, f"sequence {n}: state at chunk {c} max abs error {err:.3g}"
        chunk_rows += -(-length // CHUNK_SIZE)
    assert h.shape[1] == chunk_rows
    assert torch.equal(pool_t[:2], reference_pool[:2].to(dtype)), "slots of no sequence were written"


def test_chunk_padding_slot_and_no_inplace_update():
    q, k, v, a, b, A_log, dt_bias = _inputs(12, 2, 2, 8, 8, seed=3)
    g, beta = gates(A_log, a, dt_bias, b)
    pool = _pool(3, 2, 8, 8, seed=1)
    before = pool.clone()
    cu = torch.tensor([0, 5, 12])
    o, _, _ = chunk_gated_delta_rule(q[None], k[None], v[None], g[None], beta[None], initial_state=pool,
                                     initial_state_indices=torch.tensor([-1, 1]), cu_seqlens=cu,
                                     use_qk_l2norm_in_kernel=True, inplace_update=False)
    assert torch.equal(pool, before), "inplace_update=False wrote the pool"
    ref_o, _ = delta_rule_sequence(torch.zeros(2, 8, 8, dtype=D), q[:5], k[:5], v[:5], g[:5], beta[:5], 8 ** -0.5)
    assert (o[0, :5] - ref_o).abs().max().item() < 1e-10, "a padded slot must start from a zero state"


def _decode_reference(pool, slots, q, k, v, a, b, A_log, dt_bias, lengths, parents=None):
    """Per sequence: outputs and the state after each step (tree: each step continues from its parent's)."""
    g, beta = gates(A_log, a, dt_bias, b)
    outs, states, start = [], [], 0
    for n, length in enumerate(lengths):
        s0 = pool[slots[n]] if slots[n] >= 0 else torch.zeros_like(pool[0])
        o_seq, after = [], []
        for t in range(length):
            prev = s0 if t == 0 else after[parents[n][t] if parents else t - 1]
            sl = slice(start + t, start + t + 1)
            o_t, s_t = delta_rule_sequence(prev, q[sl], k[sl], v[sl], g[sl], beta[sl], q.shape[-1] ** -0.5)
            o_seq.append(o_t[0])
            after.append(s_t[0])
        outs.append(torch.stack(o_seq))
        states.append(after)
        start += length
    return outs, states


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("lengths", [[1, 1, 1, 1], [1, 3, 2]])
def test_decode_updates_pool(dtype, lengths):
    total = sum(lengths)
    q, k, v, a, b, A_log, dt_bias = _inputs(total, 2, 4, 16, 8, seed=11)
    pool = _pool(6, 4, 8, 16, seed=2)
    slots = [4, -1, 1, 0][: len(lengths)]
    ref_o, ref_states = _decode_reference(pool, slots, q, k, v, a, b, A_log, dt_bias, lengths)
    pool_t = pool.to(dtype, copy=True)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)))
    o = fused_sigmoid_gating_delta_rule_update(
        A_log.to(dtype), a.to(dtype), dt_bias.to(dtype), 1.0, 20.0, q.to(dtype)[None], k.to(dtype)[None],
        v.to(dtype)[None], b.to(dtype), pool_t, torch.tensor(slots), use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    tol = TOL[dtype]
    for n, length in enumerate(lengths):
        start = int(cu[n])
        err = (o[0, start:start + length].to(D) - ref_o[n]).abs().max().item()
        assert err < tol, f"sequence {n}: output max abs error {err:.3g}"
        if slots[n] >= 0:
            err = (pool_t[slots[n]].to(D) - ref_states[n][-1]).abs().max().item()
            assert err < tol, f"sequence {n}: pool state max abs error {err:.3g}"
    untouched = [s for s in range(6) if s not in slots]
    assert torch.equal(pool_t[untouched], pool[untouched].to(dtype))


@pytest.mark.parametrize("parents", [None, [[0, 0, 0, 1], [0, 0, 1, 2]]])
def test_verify_snapshots_chain_and_tree(parents):
    """Target verify: the pool is left as it was; the state after each draft step lands in the snapshot buffer;
    a tree step continues from its parent's snapshot."""
    steps, lengths = 4, [4, 4]
    q, k, v, a, b, A_log, dt_bias = _inputs(8, 2, 2, 16, 16, seed=5)
    pool = _pool(3, 2, 16, 16, seed=4)
    before = pool.clone()
    slots, snap_slots = [2, 0], [1, 0]
    buffer = torch.zeros(2, steps, 2, 16, 16, dtype=D)
    ref_o, ref_states = _decode_reference(pool, slots, q, k, v, a, b, A_log, dt_bias, lengths, parents)
    o = fused_sigmoid_gating_delta_rule_update(
        A_log, a, dt_bias, 1.0, 20.0, q[None], k[None], v[None], b, pool, torch.tensor(slots),
        use_qk_l2norm_in_kernel=True, cu_seqlens=torch.tensor([0, 4, 8]), disable_state_update=True,
        intermediate_states_buffer=buffer, intermediate_state_indices=torch.tensor(snap_slots), cache_steps=steps,
        retrieve_parent_token=None if parents is None else torch.tensor(parents))
    assert torch.equal(pool, before), "verify must not update the pool"
    for n in range(2):
        assert (o[0, 4 * n: 4 * n + 4] - ref_o[n]).abs().max().item() < 1e-10
        for t in range(steps):
            err = (buffer[snap_slots[n], t] - ref_states[n][t]).abs().max().item()
            assert err < 1e-10, f"sequence {n} step {t}: snapshot max abs error {err:.3g}"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_packed_decode(dtype):
    q, k, v, a, b, A_log, dt_bias = _inputs(3, 2, 4, 16, 8, seed=9)
    pool = _pool(4, 4, 8, 16, seed=6)
    slots = [3, -1, 0]
    ref_o, ref_states = _decode_reference(pool, slots, q, k, v, a, b, A_log, dt_bias, [1, 1, 1])
    mixed = torch.cat([q.reshape(3, -1), k.reshape(3, -1), v.reshape(3, -1)], dim=-1).to(dtype)
    pool_t = pool.to(dtype, copy=True)
    out = torch.full((3, 1, 4, 8), float("nan"), dtype=dtype)
    result, state = fused_recurrent_gated_delta_rule_packed_decode(
        mixed, a.to(dtype), b.to(dtype), A_log.to(dtype), dt_bias.to(dtype), 16 ** -0.5, pool_t, out,
        torch.tensor(slots), use_qk_l2norm_in_kernel=True)
    assert result is out and state is pool_t
    tol = TOL[dtype]
    for n in (0, 2):
        assert (out[n, 0].to(D) - ref_o[n][0]).abs().max().item() < tol
        assert (pool_t[slots[n]].to(D) - ref_states[n][0]).abs().max().item() < tol
    assert torch.equal(out[1], torch.zeros_like(out[1])), "a padded row outputs zeros"
    assert torch.equal(pool_t[[1, 2]], pool[[1, 2]].to(dtype))


def test_unsupported_options_are_refused():
    q, k, v, a, b, A_log, dt_bias = _inputs(2, 1, 1, 8, 8, seed=0)
    with pytest.raises(UnsupportedGdnOption, match="KDA"):
        fused_sigmoid_gating_delta_rule_update(A_log, a, dt_bias, 1.0, 20.0, q[None], k[None], v[None], b, None, None,
                                               is_kda=True)
    with pytest.raises(UnsupportedGdnOption, match="head_first"):
        chunk_gated_delta_rule(q[None], k[None], v[None], a[None], b[None], head_first=True)


def test_packed_decode_beta_rounding_follows_the_row_invariant_mode():
    """bf16: by default the packed decode rounds beta to bf16 as SGLang's kernel does, and differs from the verify
    op's one step; with the rounding off (row-invariant servers) it is bitwise the verify op's step."""
    from sglang_ext.hybrid.ops import recurrent

    q, k, v, a, b, A_log, dt_bias = _inputs(3, 2, 4, 16, 8, seed=11)
    bf = torch.bfloat16
    q, k, v, a, b = (t.to(bf) for t in (q, k, v, a, b))
    A_log, dt_bias = A_log.float(), dt_bias.float()
    pool = _pool(4, 4, 8, 16, seed=5).float()
    slots = torch.tensor([3, 1, 0])
    verify_pool = pool.clone()
    verify = fused_sigmoid_gating_delta_rule_update(
        A_log, a, dt_bias, 1.0, 20.0, q[:, None], k[:, None], v[:, None], b, verify_pool, slots,
        scale=16 ** -0.5, use_qk_l2norm_in_kernel=True)
    mixed = torch.cat([q.reshape(3, -1), k.reshape(3, -1), v.reshape(3, -1)], dim=-1)

    def decode():
        out, state = torch.empty(3, 1, 4, 8, dtype=bf), pool.clone()
        fused_recurrent_gated_delta_rule_packed_decode(mixed, a, b, A_log, dt_bias, 16 ** -0.5, state, out, slots,
                                                       use_qk_l2norm_in_kernel=True)
        return out, state

    rounded_out, rounded_state = decode()
    assert not torch.equal(rounded_state, verify_pool), "beta rounded to bf16 should move the state"
    try:
        recurrent.round_decode_beta(False)
        out, state = decode()
    finally:
        recurrent.round_decode_beta(True)
    assert torch.equal(state, verify_pool) and torch.equal(out, verify.reshape(out.shape))
