"""The torch GDN ops against SGLang 0.5.23's own Triton kernels (run by the Triton CPU interpreter) on the same
float32 inputs: the same outputs, the same writes to the state pools, snapshot buffers and parent indices.
This pins the calling contract (layouts, padding slots, tree drafts); the float64 references pin the math.

Measured differences (float32 rounding): at most 2e-7 on outputs and states, 4e-6 on gates of magnitude ~50."""

import os

import pytest
import torch

from sglang_ext.hybrid.ops import causal_conv1d, gating, recurrent

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the Triton interpreter")

H, HV, K, V, DIM, WIDTH = 2, 4, 16, 16, 64, 4


def _close(a, b, tol=1e-5):
    return (a.float() - b.float()).abs().max().item() <= tol


def test_decode_varlen_and_tree_verify():
    from sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent import (
        fused_sigmoid_gating_delta_rule_update as triton_update,
    )

    gen = torch.Generator().manual_seed(0)
    A_log, dt_bias = torch.rand(HV, generator=gen), torch.randn(HV, generator=gen)
    pool = torch.randn(5, HV, V, K, generator=gen) * 0.3
    cases = [  # (sequence lengths, state slots, extra keyword arguments)
        ([1, 3, 2], [3, -1, 1], {}),
        ([4, 4], [2, 0], {"disable_state_update": True, "cache_steps": 4,
                          "intermediate_state_indices": torch.tensor([1, 2], dtype=torch.int32),
                          "retrieve_parent_token": torch.tensor([[0, 0, 0, 1], [0, 0, 1, 2]], dtype=torch.int32)}),
    ]
    for lengths, slots, extra in cases:
        total = sum(lengths)
        q, k = torch.randn(1, total, H, K, generator=gen), torch.randn(1, total, H, K, generator=gen)
        v = torch.randn(1, total, HV, V, generator=gen)
        a, b = torch.randn(total, HV, generator=gen), torch.randn(total, HV, generator=gen)
        cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)
        results = []
        for fn in (triton_update, recurrent.fused_sigmoid_gating_delta_rule_update):
            state = pool.clone()
            buffer = torch.zeros(3, 4, HV, V, K) if extra else None
            kwargs = dict(extra, intermediate_states_buffer=buffer) if extra else {}
            out = fn(A_log=A_log, a=a, dt_bias=dt_bias, softplus_beta=1.0, softplus_threshold=20.0, q=q, k=k, v=v,
                     b=b, initial_state_source=state, initial_state_indices=torch.tensor(slots, dtype=torch.int32),
                     cu_seqlens=cu, use_qk_l2norm_in_kernel=True, **kwargs)
            results.append((out, state, buffer))
        (o1, s1, b1), (o2, s2, b2) = results
        assert o1.shape == o2.shape and _close(o1, o2) and _close(s1, s2), f"lengths {lengths}"
        if b1 is not None:
            assert _close(b1, b2) and torch.equal(s2, pool), "verify snapshots / pool left as it was"


def test_causal_conv1d_extend_and_tree_update():
    from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_fn, causal_conv1d_update

    gen = torch.Generator().manual_seed(1)
    weight, bias = torch.randn(DIM, WIDTH, generator=gen), torch.randn(DIM, generator=gen)
    states = torch.randn(4, DIM, WIDTH - 1, generator=gen)
    lengths = [3, 1, 7]
    x = torch.randn(sum(lengths), DIM, generator=gen).t()  # channel-last, as SGLang passes it
    args = {"query_start_loc": torch.tensor([0, 3, 4, 11], dtype=torch.int32), "seq_lens_cpu": lengths,
                "cache_indices": torch.tensor([2, -1, 0], dtype=torch.int32),
                "has_initial_state": torch.tensor([True, False, False]), "activation": "silu"}
    s1, s2 = states.clone(), states.clone()
    y1 = causal_conv1d_fn(x, weight, bias, conv_states=s1, **args)
    y2 = causal_conv1d.causal_conv1d_fn(x, weight, bias, conv_states=s2, **args)
    rows = [0, 1, 2, 4, 5, 6, 7, 8, 9, 10]  # the padded sequence's output is left unwritten by the kernel
    assert _close(y1[:, rows], y2[:, rows]) and torch.equal(s1, s2)

    drafts = torch.randn(2, DIM, 4, generator=gen)
    for tree in (False, True):
        outs = []
        for fn in (causal_conv1d_update, causal_conv1d.causal_conv1d_update):
            state, windows = states.clone(), torch.zeros(3, 4, DIM, WIDTH - 1)
            parents = torch.zeros(2, 4, dtype=torch.int32)
            tree_args = {"retrieve_next_token": torch.tensor([[1, 3, -1, -1], [1, 2, 3, -1]], dtype=torch.int32),
                             "retrieve_next_sibling": torch.tensor([[-1, 2, -1, -1], [-1] * 4], dtype=torch.int32),
                             "retrieve_parent_token": parents} if tree else {}
            y = fn(drafts, state, weight, bias=bias, activation="silu",
                   conv_state_indices=torch.tensor([3, 1], dtype=torch.int32), intermediate_conv_window=windows,
                   intermediate_state_indices=torch.tensor([0, 2], dtype=torch.int32), **tree_args)
            outs.append((y, state, windows, parents))
        (y1, st1, w1, p1), (y2, st2, w2, p2) = outs
        assert _close(y1, y2) and torch.equal(st1, st2) and torch.equal(w1, w2), f"tree={tree}"
        assert torch.equal(p1, p2), f"parents {p1.tolist()} != {p2.tolist()}"


def test_gdn_gating():
    from sglang.kernels.ops.attention.linear.fused_gdn_gating import fused_gdn_gating

    gen = torch.Generator().manual_seed(2)
    A_log, dt_bias = torch.rand(HV, generator=gen) * 4, torch.randn(HV, generator=gen)
    a, b = torch.randn(5, HV, generator=gen) * 10, torch.randn(5, HV, generator=gen)
    g1, beta1 = fused_gdn_gating(A_log, a, b, dt_bias)
    g2, beta2 = gating.fused_gdn_gating(A_log, a, b, dt_bias)
    assert g1.shape == g2.shape and g1.dtype == g2.dtype
    assert ((g1 - g2).abs() / (1 + g1.abs())).max().item() < 1e-6 and _close(beta1, beta2, 1e-6)


def test_shared_expert_gate():
    from sglang.kernels.ops.elementwise.elementwise import fused_gate_sigmoid_mul_add

    from sglang_ext.hybrid.ops.shared_expert_gate import fused_gate_sigmoid_mul_add as torch_op

    gen = torch.Generator().manual_seed(3)
    hidden, weight = torch.randn(5, 64, generator=gen), torch.randn(64, generator=gen) * 0.2
    shared, routed = torch.randn(5, 64, generator=gen), torch.randn(5, 64, generator=gen)
    out1, out2 = routed.clone(), routed.clone()
    fused_gate_sigmoid_mul_add(hidden, weight, shared, out1)
    torch_op(hidden, weight, shared, out2)
    assert _close(out1, out2, 1e-6)
