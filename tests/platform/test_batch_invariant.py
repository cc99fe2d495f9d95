"""The CPU platform's batch-invariant mode (`--enable-deterministic-inference`, platform/batch_invariant.py).

On this platform's float32 BLAS a projection of 4 rows (a speculative verify of 4 tokens) and of 1 row (a decode
step) give last-bit different results for the same row; a quantized KV format turns those into different codes now
and then, and greedy output with speculation parts from output without. In the mode, token steps run every linear
layer one row at a time, so the verify rows' K/V, and their codes in every format, are bitwise the decode rows'.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sglang_ext.kvcache.formats import KV_CACHE_DTYPES
from sglang_ext.kvformats import get_format
from sglang_ext.platform import batch_invariant

# SmolLM2-135M's K projection (hidden 576 -> 3 KV heads x 64); 4 rows = a verify of NEXTN's 4 draft tokens.
HIDDEN, KV_HEADS, HEAD_DIM, VERIFY_ROWS = 576, 3, 64, 4


class _Method:
    """Stands in for SGLang's UnquantizedLinearMethod: apply(layer, x, bias) = F.linear."""

    def apply(self, layer, x, bias=None):
        return F.linear(x, layer.weight, bias)


def _project(method, layer, x):
    return batch_invariant.linear_apply(type(method).apply, method, layer, x)


@pytest.fixture
def kv_projection():
    gen = torch.Generator().manual_seed(0)
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.randn(2 * KV_HEADS * HEAD_DIM, HIDDEN, generator=gen) / HIDDEN**0.5,
                                      requires_grad=False)
    # 64 verify steps' worth of tokens, so a few code boundaries are crossed
    x = torch.randn(64 * VERIFY_ROWS, HIDDEN, generator=gen)
    yield _Method(), layer, x
    batch_invariant.disable()


def _kv(out):
    k, v = out.view(-1, 2, KV_HEADS, HEAD_DIM).unbind(1)
    return k.contiguous(), v.contiguous()


def _verify_and_decode(method, layer, x):
    verify = torch.cat([_project(method, layer, x[i:i + VERIFY_ROWS]) for i in range(0, len(x), VERIFY_ROWS)])
    decode = torch.cat([_project(method, layer, x[i:i + 1]) for i in range(len(x))])
    return verify, decode


def test_without_the_mode_verify_and_decode_projections_differ(kv_projection):
    """Documents the premise on this machine: the 4-row and 1-row float32 projections of the same tokens differ."""
    with batch_invariant.token_step(True):  # the mode is off: token_step does nothing
        verify, decode = _verify_and_decode(*kv_projection)
    differing = int((verify != decode).sum())
    assert differing > verify.numel() // 10, (
        f"only {differing} of {verify.numel()} projected values differ between 4-row and 1-row GEMMs: "
        "this BLAS is batch-invariant here, and the mode's tests below prove nothing on it")
    # int8 keeps a float32 scale per (token, head): almost every stored scale differs. (The octave formats' fp16
    # scales and 3/4-bit codes absorb most last-bit differences: over these 256 tokens none of their bytes differ,
    # but one that lands on a code boundary flips a code, which is what parted the NEXTN servers.)
    fmt = get_format("int8", HEAD_DIM, HEAD_DIM)
    got, want = fmt.quantize(*_kv(verify)), fmt.quantize(*_kv(decode))
    scales_differing = int((got["k_scales"] != want["k_scales"]).sum())
    assert scales_differing > 0, "no int8 K scale differs between the verify and decode projections"


@pytest.mark.parametrize("name", KV_CACHE_DTYPES)
def test_in_the_mode_verify_rows_store_the_decode_codes(kv_projection, name):
    batch_invariant.enable()
    with batch_invariant.token_step(True):
        verify, decode = _verify_and_decode(*kv_projection)
    assert torch.equal(verify, decode), f"{int((verify != decode).sum())} projected values differ"
    fmt = get_format(name, HEAD_DIM, HEAD_DIM)
    got, want = fmt.quantize(*_kv(verify)), fmt.quantize(*_kv(decode))
    for plane in want:
        assert torch.equal(got[plane], want[plane]), f"{name} plane {plane} differs"


def test_outside_token_steps_rows_are_projected_together(kv_projection):
    """Prefill keeps its batched GEMM (the mode's cost stays in decode and verify): the same result as F.linear."""
    method, layer, x = kv_projection
    batch_invariant.enable()
    with batch_invariant.token_step(False):
        assert torch.equal(_project(method, layer, x), F.linear(x, layer.weight))
