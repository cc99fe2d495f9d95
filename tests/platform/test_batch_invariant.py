"""The CPU platform's row-invariant token steps (platform/batch_invariant.py): on by default over compressed KV,
and under `--enable-deterministic-inference`.

On this platform's float32 BLAS a projection of 4 rows (a speculative verify of 4 tokens) and of 1 row (a decode
step) give last-bit different results for the same row; a quantized KV format turns those into different codes now
and then, and greedy output with speculation parts from output without. In the mode, token steps run every linear
layer in blocks of exactly ROW_BLOCK rows, so the verify rows' K/V, and their codes in every format, are bitwise
the decode rows' at any batch size.
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


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 13])
def test_in_the_mode_a_row_gets_the_same_bits_at_any_row_count_and_position(kv_projection, rows):
    """The premise of the blocks: MKL's GEMM for a fixed M gives a row the same bits whatever the other rows hold
    and wherever it sits. Checked here as a batch of `rows` decode rows against each row decoded alone."""
    method, layer, x = kv_projection
    batch_invariant.enable()
    with batch_invariant.token_step(True):
        alone = torch.cat([_project(method, layer, x[i:i + 1]) for i in range(rows * 7)])
        batched = torch.cat([_project(method, layer, x[i:i + rows]) for i in range(0, rows * 7, rows)])
        shifted = _project(method, layer, x[3:3 + rows])
    assert torch.equal(batched, alone), f"{int((batched != alone).sum())} values differ at {rows} rows"
    assert torch.equal(shifted, alone[3:3 + rows])


class _Args:
    def __init__(self, kv_cache_dtype="auto", deterministic=False):
        self.kv_cache_dtype, self.enable_deterministic_inference = kv_cache_dtype, deterministic


@pytest.mark.parametrize(("kv", "deterministic", "setting", "wanted"), [
    ("octave_k3v4", False, None, True), ("int8", False, None, True), ("auto", False, None, False),
    ("octave_k3v3", False, "off", False), ("auto", True, None, True), ("octave_k3v4", True, "off", True)])
def test_the_launcher_turns_the_mode_on_over_compressed_kv(monkeypatch, kv, deterministic, setting, wanted):
    from sglang_ext.env import BATCH_INVARIANT, ROW_INVARIANT

    monkeypatch.setenv(BATCH_INVARIANT, "stale")
    if setting is None:
        monkeypatch.delenv(ROW_INVARIANT, raising=False)
    else:
        monkeypatch.setenv(ROW_INVARIANT, setting)
    batch_invariant.export_flag(None, None, _Args(kv, deterministic))
    assert batch_invariant.hooks_wanted() is wanted


def test_a_bad_setting_is_refused_naming_the_supported_ones(monkeypatch):
    from sglang_ext.env import ROW_INVARIANT

    monkeypatch.setenv(ROW_INVARIANT, "on")
    with pytest.raises(ValueError, match="auto .*off"):
        batch_invariant.export_flag(None, None, _Args("int8"))


class _Mode:
    def __init__(self, name):
        self.name = name

    def is_decode(self):
        return self.name == "decode"

    def is_target_verify(self):
        return self.name == "verify"

    def is_extend_or_draft_extend_or_mixed(self):
        return self.name == "extend"


@pytest.mark.parametrize("compressed_kv_only", [True, False])
def test_which_steps_compute_rows_in_blocks(compressed_kv_only):
    """Over compressed KV by default: decode and verify only (prefill keeps its batched GEMMs, the cost stays
    small); under --enable-deterministic-inference prefill and extend steps too."""
    seen = {}

    def forward(_runner, batch):
        seen[batch.forward_mode.name] = batch_invariant.rows_alone()

    batch = torch.nn.Module()
    (batch_invariant.enable_for_compressed_kv if compressed_kv_only else batch_invariant.enable)()
    try:
        for name in ("decode", "verify", "extend"):
            batch.forward_mode = _Mode(name)
            batch_invariant.model_runner_forward(forward, None, batch)
    finally:
        batch_invariant.disable()
    assert seen == {"decode": True, "verify": True, "extend": not compressed_kv_only}
