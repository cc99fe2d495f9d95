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


def moe_align_block_size(topk_ids: torch.Tensor, num_experts: int, block_size: int, sorted_token_ids: torch.Tensor,
                         experts_ids: torch.Tensor, num_tokens_post_pad: torch.Tensor, cumsum_buffer: torch.Tensor,
                         pad_sorted_token_ids: bool = False, ignore_invalid_expert: bool = False) -> None:
    """Group the (token, slot) pairs of `topk_ids` by expert into block_size-padded runs, in place (fused MoE's
    block schedule).

    sgl_kernel's "+1 offset" contract: `num_experts` is the bucket count E + 1; expert id e goes to bucket e + 1, so
    an expert-parallel filtered pair (-1) lands in bucket 0, whose blocks get expert id -1 (fused MoE skips them).
    Each bucket is padded to a multiple of block_size, buckets laid out in order; `sorted_token_ids` holds the flat
    pair index of each pair and `topk_ids.numel()` in pad slots; `experts_ids[b]` is block b's expert;
    `num_tokens_post_pad[0]` the padded total; `cumsum_buffer[:E + 2]` the padded bucket offsets. Pairs keep their
    index order inside a bucket (sgl_kernel's order is its atomics', which fused MoE does not depend on). Blocks past
    the total are written -1. Only device tensor ops, no host read: it runs inside CUDA-graph capture."""
    if ignore_invalid_expert:
        raise NotImplementedError("sgl_kernel.moe_align_block_size with ignore_invalid_expert=True is not provided by "
                                  "the portable_gpu platform")
    device, numel, buckets = topk_ids.device, topk_ids.numel(), num_experts
    bucket = topk_ids.reshape(-1).long() + 1
    counts = torch.zeros(buckets, dtype=torch.long, device=device).scatter_add_(0, bucket, torch.ones_like(bucket))
    padded = (counts + block_size - 1) // block_size * block_size
    offsets = torch.zeros(buckets + 1, dtype=torch.long, device=device)
    offsets[1:] = padded.cumsum(0)
    starts = counts.cumsum(0) - counts  # first position of each bucket among the sorted, unpadded pairs
    order = torch.sort(bucket, stable=True).indices
    in_order = bucket[order]
    rank = torch.arange(numel, device=device) - starts[in_order]
    if pad_sorted_token_ids:
        sorted_token_ids.fill_(numel)
    sorted_token_ids[offsets[in_order] + rank] = order.to(sorted_token_ids.dtype)
    block_start = torch.arange(experts_ids.numel(), device=device) * block_size
    owner = torch.searchsorted(offsets[1:], block_start, right=True)  # the bucket whose padded run holds the block
    experts_ids.copy_(torch.where(block_start < offsets[-1], owner - 1, -1).to(experts_ids.dtype))
    num_tokens_post_pad[0] = offsets[-1].to(num_tokens_post_pad.dtype)
    cumsum_buffer[: buckets + 1] = offsets.to(cumsum_buffer.dtype)


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
    "sgl_kernel.moe_align_block_size": moe_align_block_size,
    "sgl_kernel.utils.is_arch_support_pdl": is_arch_support_pdl,
}
