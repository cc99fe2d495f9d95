"""The decode-time recurrent-state checkpoint of SGLang's Mamba radix cache (`extra_buffer` strategy), in torch.

Stands in for SGLang's `track_mamba_states_if_needed` and `track_mamba_states_all_layers`
(mamba_state_scatter_triton.py), whose Triton kernel needs a GPU. With `--mamba-radix-cache-strategy extra_buffer`
a decoding request that reaches a multiple of the track interval has its conv window and recurrent state copied
from its working slot into its tracking slot, which the radix tree then keeps at that prefix length. Pure copies:
the destination gets the source's bytes, in every layer given.

Row i of the batch (i < batch_size) is copied iff mamba_track_mask[i]; it goes from slot cache_indices[i] to slot
mamba_track_indices[i]. A negative slot is a freed one (SGLang's unified pool emits -1 and sets check_freed_slots):
such a row is skipped, as the kernel skips it with check_freed_slots; without it the kernel would write out of
bounds, which no SGLang caller does.
"""

import torch


def _copy_tracked_rows(pools, cache_indices: torch.Tensor, mamba_track_mask: torch.Tensor,
                       mamba_track_indices: torch.Tensor, batch_size: int, slot_dim: int) -> None:
    """For each pool (slots along `slot_dim`), pool[..., dst, ...] = pool[..., src, ...] for the tracked rows."""
    if batch_size == 0:
        return
    for name, t in (("cache_indices", cache_indices), ("mamba_track_mask", mamba_track_mask),
                    ("mamba_track_indices", mamba_track_indices)):
        if t.ndim != 1 or t.shape[0] < batch_size:
            raise ValueError(f"mamba state track: {name} of shape {tuple(t.shape)} for a batch of {batch_size}")
    track = mamba_track_mask[:batch_size].to(torch.bool)
    src = cache_indices[:batch_size].to(torch.long)[track]
    dst = mamba_track_indices[:batch_size].to(device=src.device, dtype=torch.long)[track]
    keep = (src >= 0) & (dst >= 0)
    if not bool(keep.all()):
        src, dst = src[keep], dst[keep]
    if src.numel() == 0:
        return
    for pool in pools:
        if pool.numel() == 0:
            continue
        rows = pool.index_select(slot_dim, src.to(pool.device))  # gathered first: a source may be a destination
        pool.index_copy_(slot_dim, dst.to(pool.device), rows)


def track_mamba_states_if_needed(
    conv_states: torch.Tensor,
    ssm_states: torch.Tensor,
    cache_indices: torch.Tensor,
    mamba_track_mask: torch.Tensor,
    mamba_track_indices: torch.Tensor,
    batch_size: int,
    check_freed_slots: bool = False,
) -> None:
    """One layer: conv_states [slots, dim, W-1], ssm_states [slots, HV, V, K]."""
    _copy_tracked_rows((conv_states, ssm_states), cache_indices, mamba_track_mask, mamba_track_indices,
                       batch_size, slot_dim=0)


def track_mamba_states_all_layers(
    conv_states_pool: torch.Tensor,
    ssm_states_pool: torch.Tensor,
    cache_indices: torch.Tensor,
    mamba_track_mask: torch.Tensor,
    mamba_track_indices: torch.Tensor,
    batch_size: int,
    check_freed_slots: bool = False,
) -> None:
    """Every layer at once: conv_states_pool [layers, slots, dim, W-1], ssm_states_pool [layers, slots, HV, V, K]."""
    _copy_tracked_rows((conv_states_pool, ssm_states_pool), cache_indices, mamba_track_mask, mamba_track_indices,
                       batch_size, slot_dim=1)
