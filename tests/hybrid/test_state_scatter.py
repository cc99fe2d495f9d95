"""The torch commit of accepted verify states (sglang_ext/hybrid/ops/state_scatter.py) against a per-request loop
written from the Triton kernels' guards: lossless copies, so the oracle is bit-exact, and every slot that must
not be written keeps its bytes."""

import pytest
import torch

from sglang_ext.hybrid.ops import state_scatter

LAYERS, SLOTS, ROWS, STEPS = 3, 6, 4, 5


def reference(dst, src, dst_idx, steps, src_rows=None):
    out = dst.clone()
    for i in range(steps.shape[0]):
        s = i if src_rows is None else int(src_rows[i])
        d, t = int(dst_idx[i]), int(steps[i])
        if t >= 0 and t < src.shape[2] and 0 <= d < dst.shape[1] and 0 <= s < src.shape[1]:
            out[:, d] = src[:, s, t]
    return out


def _indices():
    # request 1 rejected everything after its root (step 0), request 2 padding (negative slot), request 3 no
    # commit (step -1), request 0 took 3 drafts
    return torch.tensor([4, 1, -1, 2], dtype=torch.int32), torch.tensor([3, 0, 2, -1], dtype=torch.int32)


@pytest.mark.parametrize("src_rows", [None, torch.tensor([3, 2, 1, 0])])
def test_recurrent_state_commit(src_rows):
    gen = torch.Generator().manual_seed(0)
    dst = torch.randn(LAYERS, SLOTS, 2, 3, 4, generator=gen)
    src = torch.randn(LAYERS, ROWS, STEPS, 2, 3, 4, generator=gen)
    dst_idx, steps = _indices()
    want = reference(dst, src, dst_idx, steps, src_rows)
    assert not torch.equal(want, dst)
    state_scatter.fused_mamba_state_scatter_with_mask(dst, src, dst_idx, steps, src_rows)
    assert torch.equal(dst, want)


def _conv_window_view(layers, rows, steps, dim, width, gen):
    """SGLang's deduplicated conv window cache: one [dim, steps + W - 2] buffer per (layer, row) and step t's
    window the slice [:, t : t + W - 1], an overlapping as_strided view."""
    shared = torch.randn(layers, rows, dim, steps + width - 2, generator=gen)
    s = shared.stride()
    return shared.as_strided((layers, rows, steps, dim, width - 1), (s[0], s[1], s[3], s[2], s[3]))


def test_conv_window_commit_through_overlapping_view():
    gen = torch.Generator().manual_seed(1)
    dst = torch.randn(LAYERS, SLOTS, 8, 3, generator=gen)
    src = _conv_window_view(LAYERS, ROWS, STEPS, 8, 4, gen)
    dst_idx, steps = _indices()
    want = reference(dst, src, dst_idx, steps)
    state_scatter.fused_conv_window_scatter_with_mask(dst, src, dst_idx, steps)
    assert torch.equal(dst, want)
    assert torch.equal(src[:, 0, 3, :, 1], src[:, 0, 4, :, 0])  # the view's steps do overlap
    assert torch.equal(dst[:, 4], src[:, 0, 3])


def test_conv_window_multi_commits_both_request_sets():
    gen = torch.Generator().manual_seed(2)
    pairs = [(torch.randn(LAYERS, SLOTS, d, 3, generator=gen), _conv_window_view(LAYERS, ROWS, STEPS, d, 4, gen))
             for d in (8, 5)]
    dst_idx, steps = _indices()
    track_idx, track_steps = torch.tensor([5, 0, 3, 3]), torch.tensor([-1, 1, -1, 4])
    wants = [reference(reference(dst, src, dst_idx, steps), src, track_idx, track_steps) for dst, src in pairs]
    state_scatter.fused_conv_window_scatter_multi(pairs, dst_idx, steps, track_idx, track_steps)
    for (dst, _), want in zip(pairs, wants):
        assert torch.equal(dst, want)


def test_mismatched_shapes_are_refused():
    with pytest.raises(ValueError, match="do not pair"):
        state_scatter.fused_mamba_state_scatter_with_mask(
            torch.zeros(2, 4, 3), torch.zeros(2, 4, 5, 2), torch.tensor([0]), torch.tensor([0]))
