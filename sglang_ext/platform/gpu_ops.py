"""Torch ops with sgl_kernel's signatures, for the portable GPU platform (core: no SGLang import).

SGLang binds these names from `sgl_kernel` at import time on CUDA / ROCm (and calls them on our paths); on the portable GPU platform the
kernel-library guard (platform/kernel_guard.py) serves them from here. Each computes in float32 and writes the caller's
dtype, as sgl_kernel's kernels do; the in-place contracts (`out=`, fused_add_rmsnorm) are kept.
"""

import torch
import torch.nn.functional as F


def _halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    d = x.shape[-1] // 2
    return x[..., :d].float(), x[..., d:].float()


def _act_and_mul(act, x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    if x.shape[-1] % 2:
        raise ValueError(f"act_and_mul: last dimension {x.shape[-1]} is not even")
    gate, up = _halves(x)
    result = (act(gate) * up).to(x.dtype)
    if out is None:
        return result
    if out.shape != result.shape:
        raise ValueError(f"act_and_mul: out has shape {tuple(out.shape)}, expected {tuple(result.shape)}")
    out.copy_(result)
    return out


def silu_and_mul(input: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """out = silu(input[..., :d]) * input[..., d:] with d = input.shape[-1] // 2."""
    return _act_and_mul(F.silu, input, out)


def gelu_and_mul(input: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """out = gelu(input[..., :d]) * input[..., d:] (exact erf GELU)."""
    return _act_and_mul(F.gelu, input, out)


def gelu_tanh_and_mul(input: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """out = gelu_tanh(input[..., :d]) * input[..., d:]."""
    return _act_and_mul(lambda g: F.gelu(g, approximate="tanh"), input, out)


def rmsnorm(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None,
            enable_pdl: bool | None = None) -> torch.Tensor:
    """out[i] = input[i] / sqrt(mean(input[i]^2) + eps) * weight; `enable_pdl` is accepted and ignored."""
    x = input.float()
    result = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(input.dtype)
    if out is None:
        return result
    out.copy_(result)
    return out


def fused_add_rmsnorm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                      enable_pdl: bool | None = None) -> None:
    """In place: residual += input, then input = rmsnorm(residual) * weight."""
    summed = residual.float() + input.float()
    residual.copy_(summed.to(residual.dtype))
    input.copy_(rmsnorm(residual, weight, eps))


def moe_sum_reduce(input_tensor: torch.Tensor, output_tensor: torch.Tensor, routed_scaling_factor: float = 0) -> None:
    """output[t] = sum over the top-k axis of input[t] (shape [tokens, topk, hidden]) times the scaling factor.

    sgl_kernel's kernel multiplies by `routed_scaling_factor` as given; SGLang's callers pass 1.0 when the model
    has none."""
    if input_tensor.dim() != 3:
        raise ValueError(f"moe_sum_reduce: input must be [tokens, topk, hidden], got {tuple(input_tensor.shape)}")
    summed = input_tensor.float().sum(dim=1) * float(routed_scaling_factor)
    output_tensor.copy_(summed.to(output_tensor.dtype))


def is_arch_support_pdl() -> bool:
    """Programmatic dependent launch is a CUDA-library feature of sgl_kernel's launches; the portable platform
    launches only Triton kernels and asks for none."""
    return False


# Dotted name SGLang imports -> implementation the kernel-library guard serves.
PROVIDED = {
    "sgl_kernel.silu_and_mul": silu_and_mul,
    "sgl_kernel.gelu_and_mul": gelu_and_mul,
    "sgl_kernel.gelu_tanh_and_mul": gelu_tanh_and_mul,
    "sgl_kernel.rmsnorm": rmsnorm,
    "sgl_kernel.fused_add_rmsnorm": fused_add_rmsnorm,
    "sgl_kernel.moe_sum_reduce": moe_sum_reduce,
    "sgl_kernel.utils.is_arch_support_pdl": is_arch_support_pdl,
}
