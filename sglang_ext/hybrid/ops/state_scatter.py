"""Commit of the accepted draft step's recurrent and conv states after a speculative verify, in torch.

Stands in for SGLang's `fused_mamba_state_scatter_with_mask`, `fused_conv_window_scatter_with_mask` and
`fused_conv_window_scatter_multi` (mamba_state_scatter_triton.py), which refuse tensors that are not on CUDA/XPU.
A verify keeps the state after every draft step (the GDN recurrent state in `intermediate_ssm`, the conv window
in `intermediate_conv_window`); once the verifier knows how many drafts each request accepted, the state of the
last accepted step is copied into the request's persistent slot. Pure copies: the destination gets the source's
bytes.

Request i is committed iff steps[i] >= 0, 0 <= dst_indices[i] < dst.shape[1], src_rows[i] < src.shape[1] and
steps[i] < src.shape[2] (the kernels' own guards); src_rows defaults to i.
"""

import torch


def _commit(dst: torch.Tensor, src: torch.Tensor, dst_indices_raw: torch.Tensor, step_indices_raw: torch.Tensor,
            src_indices_raw: torch.Tensor | None) -> None:
    """dst: [layers, slots, *state]; src: [layers, spec rows, steps, *state] (may be an overlapping strided view).
    Writes dst[:, dst_indices[i]] = src[:, src_rows[i], steps[i]] for every committed request i."""
    if step_indices_raw.numel() == 0 or dst.numel() == 0:
        return
    if dst.shape[0] != src.shape[0] or dst.shape[2:] != src.shape[3:]:
        raise ValueError(f"mamba state scatter: dst {tuple(dst.shape)} and src {tuple(src.shape)} do not pair as "
                         "[layers, slots, *state] and [layers, rows, steps, *state]")
    if dst_indices_raw.shape != step_indices_raw.shape or dst_indices_raw.ndim != 1:
        raise ValueError(f"mamba state scatter: indices {tuple(dst_indices_raw.shape)} and steps "
                         f"{tuple(step_indices_raw.shape)} must be 1-D of one length")
    device = dst.device
    dst_rows = dst_indices_raw.to(device=device, dtype=torch.long)
    steps = step_indices_raw.to(device=device, dtype=torch.long)
    if src_indices_raw is None:
        src_rows = torch.arange(steps.shape[0], device=device, dtype=torch.long)
    else:
        if src_indices_raw.shape != steps.shape:
            raise ValueError(f"mamba state scatter: source rows {tuple(src_indices_raw.shape)} vs steps "
                             f"{tuple(steps.shape)}")
        src_rows = src_indices_raw.to(device=device, dtype=torch.long)
    keep = ((steps >= 0) & (steps < src.shape[2]) & (dst_rows >= 0) & (dst_rows < dst.shape[1])
            & (src_rows >= 0) & (src_rows < src.shape[1])).nonzero(as_tuple=True)[0]
    if keep.numel():
        dst[:, dst_rows[keep]] = src[:, src_rows[keep], steps[keep]].to(dst.dtype)


def fused_mamba_state_scatter_with_mask(
    dst: torch.Tensor,
    src: torch.Tensor,
    dst_indices_raw: torch.Tensor,
    step_indices_raw: torch.Tensor,
    src_indices_raw: torch.Tensor | None = None,
) -> None:
    """Recurrent states: dst [layers, slots, HV, V, K], src [layers, rows, steps, HV, V, K]."""
    _commit(dst, src, dst_indices_raw, step_indices_raw, src_indices_raw)


def fused_conv_window_scatter_with_mask(
    dst: torch.Tensor,
    src: torch.Tensor,
    dst_indices_raw: torch.Tensor,
    step_indices_raw: torch.Tensor,
    src_indices_raw: torch.Tensor | None = None,
) -> None:
    """Conv windows: dst [layers, slots, dim, W-1], src [layers, rows, steps, dim, W-1] (SGLang's deduplicated
    sliding-window view: steps overlap in memory; read through its strides)."""
    if dst.numel() and (dst.ndim != 4 or src.ndim != 5):
        raise ValueError(f"fused_conv_window_scatter_with_mask: ranks {dst.ndim} and {src.ndim}, want 4 and 5")
    _commit(dst, src, dst_indices_raw, step_indices_raw, src_indices_raw)


def fused_conv_window_scatter_multi(
    pairs,
    dst_indices_raw: torch.Tensor,
    step_indices_raw: torch.Tensor,
    dst_indices2_raw: torch.Tensor | None = None,
    step_indices2_raw: torch.Tensor | None = None,
) -> None:
    """Every (conv states, conv window view) pair of `pairs` committed for the first request set, then for the
    second (the radix-track slots) when given."""
    for dst, src in pairs:
        fused_conv_window_scatter_with_mask(dst, src, dst_indices_raw, step_indices_raw)
        if step_indices2_raw is not None:
            fused_conv_window_scatter_with_mask(dst, src, dst_indices2_raw, step_indices2_raw)
