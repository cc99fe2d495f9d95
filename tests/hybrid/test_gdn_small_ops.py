"""GDN gating, gated RMSNorm, the attention output gate and the qkvzba splits against float64 references."""

import pytest
import torch
from gdn_reference import D, gates

from sglang_ext.hybrid.ops.gated_rmsnorm import fused_sigmoid_mul, rms_norm_gated
from sglang_ext.hybrid.ops.gating import fused_gdn_gating
from sglang_ext.hybrid.ops.qkvzba_split import (
    fused_qkvzba_split_reshape_cat,
    fused_qkvzba_split_reshape_cat_contiguous,
)


def _randn(*shape, seed=0, dtype=D):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=D).to(dtype)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-6), (torch.bfloat16, 1e-5)])
def test_gdn_gating(dtype, tol):
    a = _randn(6, 4, seed=1, dtype=dtype) * 10  # reaches the softplus threshold (x > 20 is x itself)
    b = _randn(6, 4, seed=2, dtype=dtype)
    param_dtype = D if dtype == D else torch.float32  # SGLang keeps A_log and dt_bias in float32
    A_log, dt_bias = _randn(4, seed=3, dtype=param_dtype), _randn(4, seed=4, dtype=param_dtype) * 10
    g, beta = fused_gdn_gating(A_log, a, b, dt_bias)
    ref_g, ref_beta = gates(A_log, a, dt_bias, b)
    assert g.shape == beta.shape == (1, 6, 4)
    assert g.dtype == beta.dtype == (D if dtype == D else torch.float32)
    assert (g[0].to(D) - ref_g).abs().max().item() < tol * ref_g.abs().max().item()
    # beta passes through b's dtype, as the kernel stores it: representable in it, within its rounding
    assert torch.equal(beta[0], beta[0].to(dtype).to(beta.dtype))
    assert (beta[0].to(D) - ref_beta).abs().max().item() <= torch.finfo(dtype).eps


def _rms_reference(x, weight, z, eps, group, norm_before_gate, activation):
    x, z, weight = x.to(D), z.to(D), weight.to(D)
    act = (lambda t: t / (1 + torch.exp(-t))) if activation in ("swish", "silu") else (lambda t: 1 / (1 + torch.exp(-t)))
    if not norm_before_gate:
        x = x * act(z)
    out = torch.empty_like(x)
    for row in range(x.shape[0]):
        for g0 in range(0, x.shape[1], group):
            seg = x[row, g0:g0 + group]
            out[row, g0:g0 + group] = seg / torch.sqrt((seg * seg).mean() + eps) * weight[g0:g0 + group]
    return out * act(z) if norm_before_gate else out


@pytest.mark.parametrize("group,norm_before_gate,activation", [
    (None, True, "swish"), (8, True, "sigmoid"), (None, False, "silu")])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-6)])
def test_rms_norm_gated(group, norm_before_gate, activation, dtype, tol):
    x, z, weight = _randn(5, 32, seed=5, dtype=dtype), _randn(5, 32, seed=6, dtype=dtype), _randn(32, seed=7)
    out = rms_norm_gated(x, weight.to(dtype), z=z, eps=1e-6, group_size=group, norm_before_gate=norm_before_gate,
                         activation=activation)
    ref = _rms_reference(x, weight, z, 1e-6, group or 32, norm_before_gate, activation)
    assert out.dtype == dtype
    err = ((out.to(D) - ref).abs() / (1 + ref.abs())).max().item()
    assert err < tol, f"max error {err:.3g}"


def test_fused_sigmoid_mul_strided_gate_inplace():
    tokens, heads, dim = 3, 2, 4
    q_gate = _randn(tokens, heads, 2 * dim, seed=8)
    gate = torch.chunk(q_gate, 2, dim=-1)[1]  # a strided [T, heads, D] view, as Qwen3.5 attention passes it
    attn = _randn(tokens, heads * dim, seed=9)
    expected = attn.clone()
    for t in range(tokens):
        for h in range(heads):
            for d in range(dim):
                expected[t, h * dim + d] = attn[t, h * dim + d] / (1 + torch.exp(-gate[t, h, d]))
    result = fused_sigmoid_mul(attn, gate, inplace=True)
    assert result is attn
    assert (attn - expected).abs().max().item() < 1e-14


def test_qkvzba_splits():
    """Build the projections from known per-head q, k, v, z, b, a in each layout and get them back."""
    tokens, hk, hv, dk, dv = 3, 2, 6, 4, 5
    ratio = hv // hk
    q, k = _randn(tokens, hk, dk, seed=10), _randn(tokens, hk, dk, seed=11)
    v, z = _randn(tokens, hv, dv, seed=12), _randn(tokens, hv, dv, seed=13)
    b, a = _randn(tokens, hv, seed=14), _randn(tokens, hv, seed=15)
    want_qkv = torch.cat([q.reshape(tokens, -1), k.reshape(tokens, -1), v.reshape(tokens, -1)], dim=-1)

    contiguous = torch.cat([q.reshape(tokens, -1), k.reshape(tokens, -1), v.reshape(tokens, -1),
                            z.reshape(tokens, -1)], dim=-1)
    got = fused_qkvzba_split_reshape_cat_contiguous(contiguous, torch.cat([b, a], dim=-1), hk, hv, dk, dv)
    for name, have, want in zip("qzba", got, (want_qkv, z, b, a)):
        assert torch.equal(have, want), f"contiguous layout: {name}"

    per_head, per_head_ba = [], []
    for h in range(hk):
        group = slice(h * ratio, (h + 1) * ratio)
        per_head += [q[:, h], k[:, h], v[:, group].reshape(tokens, -1), z[:, group].reshape(tokens, -1)]
        per_head_ba += [b[:, group], a[:, group]]
    got = fused_qkvzba_split_reshape_cat(torch.cat(per_head, -1), torch.cat(per_head_ba, -1), hk, hv, dk, dv)
    for name, have, want in zip("qzba", got, (want_qkv, z, b, a)):
        assert torch.equal(have, want), f"interleaved layout: {name}"


def test_ops_are_core_without_sglang():
    """The ops run where SGLang is absent: importing every module of the package loads no sglang module."""
    import subprocess
    import sys

    code = ("import sys, pkgutil, importlib, sglang_ext.hybrid.ops as p\n"
            "[importlib.import_module('sglang_ext.hybrid.ops.' + m.name) for m in pkgutil.iter_modules(p.__path__)]\n"
            "print(sorted(m for m in sys.modules if m == 'sglang' or m.startswith('sglang.')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-6)])
def test_shared_expert_gate(dtype, tol):
    from sglang_ext.hybrid.ops.shared_expert_gate import fused_gate_sigmoid_mul, fused_gate_sigmoid_mul_add

    hidden, weight = _randn(3, 16, seed=16, dtype=dtype), _randn(16, seed=17, dtype=dtype) * 0.3
    shared, routed = _randn(3, 16, seed=18, dtype=dtype), _randn(3, 16, seed=19, dtype=dtype)
    expected = routed.to(D).clone()
    for t in range(3):
        gate = 1 / (1 + torch.exp(-(hidden[t].to(D) * weight.to(D)).sum()))
        expected[t] += gate * shared[t].to(D)
    assert (fused_gate_sigmoid_mul(hidden, weight, shared).to(D) - (expected - routed.to(D))).abs().max() < tol
    fused_gate_sigmoid_mul_add(hidden, weight, shared, routed)
    assert (routed.to(D) - expected).abs().max().item() < tol, "in place into the routed output"
