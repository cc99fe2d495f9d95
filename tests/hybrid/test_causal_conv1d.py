"""The torch causal conv1d ops (extend, decode, verify chain and tree) against the float64 reference."""

import pytest
import torch
from gdn_reference import D, conv_sequence, conv_window

from sglang_ext.hybrid.ops.causal_conv1d import causal_conv1d_fn, causal_conv1d_update
from sglang_ext.hybrid.ops.errors import UnsupportedGdnOption

TOL = {torch.float64: 1e-12, torch.float32: 1e-5}
DIM, WIDTH = 24, 4


def _weights(seed, with_bias=True):
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(DIM, WIDTH, generator=gen, dtype=D)
    bias = torch.randn(DIM, generator=gen, dtype=D) if with_bias else None
    return weight, bias


def _states(slots, state_len, seed):
    return torch.randn(slots, DIM, state_len, generator=torch.Generator().manual_seed(seed), dtype=D)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("state_len,with_bias,silu", [(WIDTH - 1, True, True), (WIDTH + 1, False, False)])
def test_extend_varlen(dtype, state_len, with_bias, silu):
    lengths = [1, 2, 3, 7, 5]
    has_init = [True, False, True, True, False]
    slots = [3, 0, -1, 5, 2]  # the third sequence is padding
    weight, bias = _weights(1, with_bias)
    states = _states(6, state_len, seed=2)
    x = torch.randn(DIM, sum(lengths), generator=torch.Generator().manual_seed(3), dtype=D)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)
    states_t = states.to(dtype, copy=True)
    # channel-last x, as SGLang passes it (mixed_qkv.transpose(0, 1))
    x_t = x.t().contiguous().t().to(dtype)
    out = causal_conv1d_fn(x_t, weight.to(dtype), None if bias is None else bias.to(dtype), conv_states=states_t,
                           query_start_loc=cu, seq_lens_cpu=lengths, cache_indices=torch.tensor(slots),
                           has_initial_state=torch.tensor(has_init), activation="silu" if silu else None)
    assert out.shape == x.shape and out.dtype == dtype
    for n, length in enumerate(lengths):
        start = int(cu[n])
        if slots[n] < 0:
            assert torch.equal(out[:, start:start + length], torch.zeros(DIM, length, dtype=dtype))
            continue
        prior = states[slots[n], :, : WIDTH - 1] if has_init[n] else torch.zeros(DIM, WIDTH - 1, dtype=D)
        ref, new_prior = conv_sequence(prior, x[:, start:start + length], weight, bias, silu)
        err = (out[:, start:start + length].to(D) - ref).abs().max().item()
        assert err < TOL[dtype], f"sequence {n}: max abs error {err:.3g}"
        assert (states_t[slots[n], :, : WIDTH - 1].to(D) - new_prior).abs().max().item() < TOL[dtype]
        # columns past W-1 of a longer state are not the conv's
        assert torch.equal(states_t[slots[n], :, WIDTH - 1:], states[slots[n], :, WIDTH - 1:].to(dtype))
    assert torch.equal(states_t[[1, 4]], states[[1, 4]].to(dtype)), "slots of no sequence were written"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_update_single_token(dtype):
    weight, bias = _weights(4)
    states = _states(5, WIDTH - 1, seed=5)
    x = torch.randn(3, DIM, generator=torch.Generator().manual_seed(6), dtype=D)
    slots = [4, -1, 1]
    states_t = states.to(dtype, copy=True)
    out = causal_conv1d_update(x.to(dtype), states_t, weight.to(dtype), bias.to(dtype), "silu",
                               conv_state_indices=torch.tensor(slots, dtype=torch.int32))
    assert out.shape == x.shape
    for i in (0, 2):
        ref, new_prior = conv_sequence(states[slots[i]], x[i][:, None], weight, bias, True)
        assert (out[i].to(D) - ref[:, 0]).abs().max().item() < TOL[dtype]
        assert (states_t[slots[i]].to(D) - new_prior).abs().max().item() < TOL[dtype]
    assert torch.equal(out[1], torch.zeros(DIM, dtype=dtype))
    assert torch.equal(states_t[[0, 2, 3]], states[[0, 2, 3]].to(dtype))


def test_update_chain_verify_saves_windows():
    """Draft tokens of a chain: outputs as a conv over [state | drafts], the state moved on by all of them, and
    the W-1 inputs ending at each draft saved for the accepted length to restore."""
    steps = 3
    weight, bias = _weights(7)
    states = _states(4, WIDTH - 1, seed=8)
    before = states.clone()
    x = torch.randn(2, DIM, steps, generator=torch.Generator().manual_seed(9), dtype=D)
    windows = torch.zeros(3, steps, DIM, WIDTH - 1, dtype=D)
    slots, snaps = [3, 0], [2, 0]
    out = causal_conv1d_update(x, states, weight, bias, "silu", conv_state_indices=torch.tensor(slots),
                               intermediate_conv_window=windows, intermediate_state_indices=torch.tensor(snaps))
    for i in range(2):
        ref, new_prior = conv_sequence(before[slots[i]], x[i], weight, bias, True)
        assert (out[i] - ref).abs().max().item() < 1e-12
        assert torch.equal(states[slots[i]], new_prior)
        seq = torch.cat([before[slots[i]], x[i]], dim=1)
        for t in range(steps):
            assert torch.equal(windows[snaps[i], t], seq[:, t + 1: t + WIDTH]), f"row {i} step {t}"


def test_update_tree_verify_follows_ancestry():
    """Tree drafts: 0 -> (1, 2), 1 -> 3 in first-child / next-sibling links; each step convolves along its own
    ancestry and the parents come back in retrieve_parent_token."""
    steps = 4
    weight, bias = _weights(10)
    states = _states(2, WIDTH - 1, seed=11)
    before = states.clone()
    x = torch.randn(1, DIM, steps, generator=torch.Generator().manual_seed(12), dtype=D)
    next_token = torch.tensor([[1, 3, -1, -1]])
    next_sibling = torch.tensor([[-1, 2, -1, -1]])
    parent_out = torch.full((1, steps), 99, dtype=torch.int64)
    windows = torch.zeros(2, steps, DIM, WIDTH - 1, dtype=D)
    out = causal_conv1d_update(x, states, weight, bias, "silu", conv_state_indices=torch.tensor([1]),
                               intermediate_conv_window=windows, intermediate_state_indices=torch.tensor([0]),
                               retrieve_next_token=next_token, retrieve_next_sibling=next_sibling,
                               retrieve_parent_token=parent_out)
    assert parent_out.tolist() == [[0, 0, 0, 1]]
    ancestry = {0: [0], 1: [0, 1], 2: [0, 2], 3: [0, 1, 3]}  # oldest first
    for t, path in ancestry.items():
        cols = [before[1][:, j] for j in range(WIDTH - 1)] + [x[0, :, p] for p in path]
        window = torch.stack(cols[-WIDTH:], dim=1)
        assert (out[0, :, t] - conv_window(window, weight, bias, True)).abs().max().item() < 1e-12, f"step {t}"
        assert torch.equal(windows[0, t], window[:, 1:])
    # the state moves on by all drafts in order (SGLang restores the accepted one from the saved windows)
    assert torch.equal(states[1], torch.cat([before[1], x[0]], dim=1)[:, -(WIDTH - 1):])


def test_update_refuses_circular_state():
    weight, _ = _weights(0)
    with pytest.raises(UnsupportedGdnOption, match="cache_seqlens"):
        causal_conv1d_update(torch.zeros(1, DIM), _states(1, WIDTH - 1, 0), weight,
                             cache_seqlens=torch.tensor([0]))
