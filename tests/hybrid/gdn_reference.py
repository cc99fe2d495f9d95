"""Float64 plain-torch references for the GDN ops: the spec the torch ops in sglang_ext.hybrid.ops are tested
against. Written token by token and element by element so each can be checked by reading it."""

import math

import torch

D = torch.float64


def gates(A_log, a, dt_bias, b):
    """g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b), elementwise in float64 (softplus is x above 20)."""
    x = a.to(D) + dt_bias.to(D)
    softplus = torch.where(x > 20.0, x, torch.log1p(torch.exp(x)))
    return -torch.exp(A_log.to(D)) * softplus, 1.0 / (1.0 + torch.exp(-b.to(D)))


def l2norm(x):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def delta_rule_token(state, q, k, v, g, beta):
    """One token of one value head. state: [V, K] (float64, not modified); q, k: [K] (q scaled); v: [V]; g, beta:
    scalars. Returns (o [V], new state)."""
    decayed = state * math.exp(g)
    predicted = decayed @ k  # what the state recalls for k
    written = beta * (v - predicted)
    new = decayed + torch.outer(written, k)
    return new @ q, new


def delta_rule_sequence(state, q, k, v, g, beta, scale, normalize=True):
    """A whole sequence, every head, token by token. state: [HV, V, K]; q, k: [L, H, K]; v: [L, HV, V];
    g, beta: [L, HV] (float64). Value head h reads key head h // (HV // H).
    Returns (o [L, HV, V], states after each token [L, HV, V, K])."""
    length, num_k_heads = q.shape[0], q.shape[1]
    num_v_heads = v.shape[1]
    group = num_v_heads // num_k_heads
    o = torch.zeros(length, num_v_heads, v.shape[2], dtype=D)
    after = torch.zeros(length, *state.shape, dtype=D)
    s = state.to(D).clone()
    for t in range(length):
        for h in range(num_v_heads):
            qt, kt = q[t, h // group].to(D), k[t, h // group].to(D)
            if normalize:
                qt, kt = l2norm(qt), l2norm(kt)
            o[t, h], s[h] = delta_rule_token(s[h], qt * scale, kt, v[t, h].to(D), float(g[t, h]), float(beta[t, h]))
        after[t] = s
    return o, after


def conv_window(window, weight, bias, silu):
    """One output of the depthwise causal conv. window: [dim, W] oldest first; weight: [dim, W]."""
    acc = (window.to(D) * weight.to(D)).sum(-1)
    if bias is not None:
        acc = acc + bias.to(D)
    return acc / (1.0 + torch.exp(-acc)) if silu else acc


def conv_sequence(prior, x, weight, bias, silu):
    """prior: [dim, W-1] (earlier inputs, oldest first); x: [dim, L]. Returns (out [dim, L], new prior)."""
    width = weight.shape[1]
    seq = torch.cat([prior.to(D), x.to(D)], dim=1)
    out = torch.stack([conv_window(seq[:, t: t + width], weight, bias, silu) for t in range(x.shape[1])], dim=1)
    return out, seq[:, -(width - 1):]
