"""Gated RMSNorm of the GDN output and the sigmoid output gate of full attention, in torch.

`rms_norm_gated` stands in for SGLang's `fla.layernorm_gated.layernorm_fn(..., is_rms_norm=True)` (the
`RMSNormGated` module of Qwen3.5 / Qwen3-Next / qwen4_exp); `fused_sigmoid_mul` for
`elementwise.fused_sigmoid_mul` (attention output * sigmoid(gate)).
"""


import torch

from sglang_ext.hybrid.ops.errors import UnsupportedGdnOption
from sglang_ext.hybrid.ops.gating import compute_dtype


def _gate(z: torch.Tensor, activation: str) -> torch.Tensor:
    if activation in ("swish", "silu"):
        return z * torch.sigmoid(z)
    if activation == "sigmoid":
        return torch.sigmoid(z)
    raise UnsupportedGdnOption(f"rms_norm_gated: activation {activation!r} is not supported (swish, silu, sigmoid)")


def rms_norm_gated(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                   z: torch.Tensor | None = None, eps: float = 1e-6, group_size: int | None = None,
                   norm_before_gate: bool = True, activation: str = "swish") -> torch.Tensor:
    """x, z: [..., N]; weight (and bias): [N]. RMS over groups of group_size (all N when None), in float32:
    norm_before_gate: (x * rstd * weight + bias) * act(z); else the norm of x * act(z). Returns x's dtype."""
    n = x.shape[-1]
    group = n if group_size is None else group_size
    if n % group:
        raise ValueError(f"rms_norm_gated: {n} features are not a multiple of group_size {group}")
    dt = compute_dtype(x, weight)
    xf = x.to(dt)
    if z is not None and not norm_before_gate:
        xf = xf * _gate(z.to(dt), activation)
    grouped = xf.reshape(*xf.shape[:-1], n // group, group)
    rstd = torch.rsqrt(grouped.square().mean(-1, keepdim=True) + eps)
    y = (grouped * rstd).reshape(xf.shape) * weight.to(dt)
    if bias is not None:
        y = y + bias.to(dt)
    if z is not None and norm_before_gate:
        y = y * _gate(z.to(dt), activation)
    return y.to(x.dtype)


def fused_sigmoid_mul(attn_output: torch.Tensor, gate: torch.Tensor, inplace: bool = False,
                      quant: bool = False) -> torch.Tensor:
    """attn_output * sigmoid(gate) in float32. attn_output: [T, heads * D]; gate: the same shape or a strided
    [T, heads, D] view. inplace writes into attn_output and returns it."""
    if quant:
        raise UnsupportedGdnOption("fused_sigmoid_mul: quant=True (FP8 output) is not supported by the torch op")
    g = gate.reshape(attn_output.shape) if gate.ndim == 3 and attn_output.ndim == 2 else gate
    if g.shape != attn_output.shape:
        raise ValueError(f"fused_sigmoid_mul: gate {tuple(gate.shape)} does not match {tuple(attn_output.shape)}")
    dt = compute_dtype(attn_output, g)
    result = (attn_output.to(dt) * torch.sigmoid(g.to(dt))).to(attn_output.dtype)
    if inplace:
        attn_output.copy_(result)
        return attn_output
    return result
