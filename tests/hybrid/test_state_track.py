"""The torch decode-time state checkpoint (sglang_ext/hybrid/ops/state_track.py) against a plain-torch loop written
from SGLang's Triton kernel (`track_mamba_state_if_needed_kernel`: per tracked row and layer, the row's elements
copied from the working slot's offset to the track slot's offset through the pool's layer and slot strides) and
against that kernel itself under the Triton interpreter. Lossless copies: the oracles are bit-exact, and every slot
that must not be written keeps its bytes."""

import os

import pytest
import torch

from sglang_ext.hybrid.ops import state_track

LAYERS, SLOTS = 3, 7


def reference(pool, cache_indices, mask, track_indices, batch_size, check_freed_slots, layered):
    """What the kernel does to one pool: flat copies of one (layer, slot) entry at pointer offsets."""
    out = pool.clone()
    layer_stride, slot_stride = (out.stride(0), out.stride(1)) if layered else (0, out.stride(0))
    layers = pool.shape[0] if layered else 1
    numel = pool[0, 0].numel() if layered else pool[0].numel()
    for i in range(batch_size):
        src, dst = int(cache_indices[i]), int(track_indices[i])
        if not mask[i] or (check_freed_slots and (src < 0 or dst < 0)):
            continue
        for layer in range(layers):
            base = out.storage_offset() + layer * layer_stride
            entry = lambda slot: out.as_strided((numel,), (1,), base + slot * slot_stride)  # noqa: E731
            entry(dst).copy_(entry(src).clone())
    return out


def _pools(layered: bool, strided: bool, gen):
    """conv [(layers,) slots, dim, W-1] and ssm [(layers,) slots, HV, V, K] pools; `strided` gives them the
    envelope layout of SGLang's unified pool (slot stride larger than an entry, entries contiguous)."""
    shapes = [(8, 3), (2, 4, 5)]
    pools = []
    for shape in shapes:
        lead = (LAYERS,) if layered else ()
        if strided:
            base = torch.randn(*lead, SLOTS * 2, *shape, generator=gen)
            pools.append(base[:, ::2] if layered else base[::2])
        else:
            pools.append(torch.randn(*lead, SLOTS, *shape, generator=gen))
    return pools


# rows: tracked 4 -> 5; untracked; tracked with a freed (-1) track slot; tracked 6 -> 1; then an entry past
# batch_size (the kernel reads only batch_size rows)
CACHE = torch.tensor([4, 0, 2, 6, 3], dtype=torch.int32)
MASK = torch.tensor([True, False, True, True, True])
TRACK = torch.tensor([5, 3, -1, 1, 0], dtype=torch.int64)
BATCH = 4


@pytest.mark.parametrize("layered", [False, True], ids=["one_layer", "all_layers"])
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "envelope"])
def test_track_copies_what_the_kernel_copies(layered, strided):
    gen = torch.Generator().manual_seed(int(layered) * 2 + int(strided))
    conv, ssm = _pools(layered, strided, gen)
    wants = [reference(p, CACHE, MASK, TRACK, BATCH, True, layered) for p in (conv, ssm)]
    assert not torch.equal(wants[1], ssm)
    op = state_track.track_mamba_states_all_layers if layered else state_track.track_mamba_states_if_needed
    op(conv, ssm, CACHE, MASK, TRACK, BATCH, check_freed_slots=True)
    assert torch.equal(conv, wants[0]) and torch.equal(ssm, wants[1])
    assert torch.equal(ssm[:, 5] if layered else ssm[5], (ssm[:, 4] if layered else ssm[4]))


def test_nothing_tracked_leaves_the_pools():
    gen = torch.Generator().manual_seed(7)
    conv, ssm = _pools(True, False, gen)
    before = conv.clone(), ssm.clone()
    state_track.track_mamba_states_all_layers(conv, ssm, CACHE, torch.zeros(5, dtype=torch.bool), TRACK, BATCH)
    state_track.track_mamba_states_all_layers(conv, ssm, CACHE, MASK, TRACK, 0)
    assert torch.equal(conv, before[0]) and torch.equal(ssm, before[1])


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the Triton interpreter")
@pytest.mark.parametrize("layered", [False, True], ids=["one_layer", "all_layers"])
def test_track_equals_sglangs_triton_kernel(layered):
    from sglang.kernels.ops.mamba import mamba_state_scatter_triton as sglang_ops

    name = "track_mamba_states_all_layers" if layered else "track_mamba_states_if_needed"
    results = []
    for fn in (getattr(sglang_ops, name), getattr(state_track, name)):
        conv, ssm = _pools(layered, True, torch.Generator().manual_seed(11))  # envelope pools, same values
        fn(conv, ssm, CACHE, MASK, TRACK, BATCH, check_freed_slots=True)
        results.append((conv, ssm))
    (c1, s1), (c2, s2) = results
    assert torch.equal(c1, c2) and torch.equal(s1, s2)
    assert not torch.equal(s1, _pools(layered, True, torch.Generator().manual_seed(11))[1])
