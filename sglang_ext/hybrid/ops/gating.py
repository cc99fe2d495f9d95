"""GDN gating: g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b) (SGLang's `fused_gdn_gating`)."""

import torch
import torch.nn.functional as F


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float64 when any input is float64 (tests), else float32 (what SGLang's kernels accumulate in)."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def gdn_gate(A_log: torch.Tensor, a: torch.Tensor, dt_bias: torch.Tensor, beta: float = 1.0,
             threshold: float = 20.0) -> torch.Tensor:
    """Log-space decay per (token, value head): -exp(A_log) * softplus_beta(a + dt_bias), in the compute dtype.

    a: [..., HV]; A_log, dt_bias: [HV]. softplus is x where beta * x > threshold (as the kernels do)."""
    dt = compute_dtype(A_log, a, dt_bias)
    x = a.to(dt) + dt_bias.to(dt)
    return -torch.exp(A_log.to(dt)) * F.softplus(x, beta=beta, threshold=threshold)


def fused_gdn_gating(A_log: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dt_bias: torch.Tensor,
                     beta: float = 1.0, threshold: float = 20.0) -> tuple[torch.Tensor, torch.Tensor]:
    """a, b: [T, HV] -> (g, beta_out), each [1, T, HV] float32 (float64 for float64 inputs).

    Like the Triton kernel, beta_out is sigmoid(b) rounded to b's dtype and held in the wider dtype."""
    if a.ndim != 2 or b.shape != a.shape:
        raise ValueError(f"fused_gdn_gating: a and b must be [T, HV] of one shape, got {tuple(a.shape)} and "
                         f"{tuple(b.shape)}")
    dt = compute_dtype(A_log, a, b, dt_bias)
    g = gdn_gate(A_log, a, dt_bias, beta, threshold).to(dt)
    beta_out = torch.sigmoid(b.to(dt)).to(b.dtype).to(dt)
    return g.unsqueeze(0), beta_out.unsqueeze(0)
