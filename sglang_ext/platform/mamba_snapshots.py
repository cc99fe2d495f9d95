"""Recurrent-state snapshots (`--mamba-radix-cache-strategy extra_buffer`) on the portable CPU platform.

With `extra_buffer` SGLang's Mamba radix cache keeps each request's recurrent state and conv window in a tracking
slot at every multiple of the track interval (`lcm(64, page size, --mamba-track-interval)` tokens): in prefill from
the GDN extend's per-chunk states (torch copies in SGLang's backend), in decode through the checkpoint kernel that
sglang_ext/hybrid/ops/state_track.py replaces. Requests sharing a system prompt then share its state, the same
prompt sent twice hits its tracked prefix, and page sizes above 1 (qwen4_exp's QSA forces 64) are accepted.

The platform declares the support (`PortableCpuPlatform.support_mamba_cache_extra_buffer`); what else SGLang's path
needs on a machine without CUDA is here: its decode-batch preparation pins the track mask with `pin_memory()`,
which asks the CUDA driver for page-locked memory even where the platform says pinning is unavailable. Around that
call (AROUND `ScheduleBatch.prepare_for_decode`, only when extra_buffer is on), `Tensor.pin_memory` returns the
tensor itself: a host tensor that is copied to the host device needs no page locking.
"""

import torch
from torch.overrides import TorchFunctionMode

from sglang_ext import compat


class _HostTensorsUnpinned(TorchFunctionMode):
    """`Tensor.pin_memory()` returns the tensor unchanged; every other torch call runs as usual."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.pin_memory:
            return args[0]
        return func(*args, **(kwargs or {}))


def prepare_for_decode(original, batch):
    """AROUND hook body: SGLang's decode preparation, with the track mask left unpinned under extra_buffer."""
    if not compat.get_exec().mamba.enable_mamba_extra_buffer:
        return original(batch)
    with _HostTensorsUnpinned():
        return original(batch)
