"""Extend reads its own new tokens back from the pool (new_slots): the Triton kernel (under TRITON_INTERPRET=1 on
the CPU) and the torch reference give every token the same output however its sequence is split into extend
calls, because each key is read from the same stored bytes whether it is a new token or a cached one.

Oracle: the whole sequence in one call vs the same sequence in chunks (later chunks attend to earlier ones as
cached prefix); both through the kernel's direct path and its prefix scratch, and both equal to the reference.
The full-precision path (no new_slots) is checked to differ from the chunked one, so the check can fail.
"""

from __future__ import annotations

import os

import pytest
import torch

from sglang_ext.kernels import extend_attention, store_kv
from sglang_ext.kvformats import get_format, reference

FORMATS = ("int8", "octave_k3v4", "octave_k3v3")
HEAD_DIM, H_KV, GROUP = 64, 2, 3
# two sequences; the chunked run splits them at these points (the first chunk of each has no prefix)
LENGTHS = (40, 23)
SPLITS = ((0, 16, 33, 40), (0, 7, 23))
# float32 dots under the interpreter are exact up to summation order
TOL = 1e-4


@pytest.fixture(scope="module")
def device() -> str:
    if os.environ.get("TRITON_INTERPRET") == "0" and torch.cuda.is_available():
        return "cuda"
    return "cpu"


def _indptr(lengths, device) -> torch.Tensor:
    out = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    out[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0)
    return out.to(device)


def _sequences(fmt, device):
    """Per sequence (q, k, v, slots), its K/V stored at slots (scattered, interleaved between the sequences)."""
    gen = torch.Generator().manual_seed(7)
    total = sum(LENGTHS)
    perm = torch.randperm(total + 9, generator=gen)[:total] + 1
    planes = fmt.allocate(total + 16, H_KV, device)
    seqs, start = [], 0
    for n in LENGTHS:
        q = torch.randn(n, H_KV * GROUP, HEAD_DIM, generator=gen)
        k = torch.randn(n, H_KV, HEAD_DIM, generator=gen) * 2
        k[:, :, 1] += 6.0  # an outlier channel
        v = torch.randn(n, H_KV, HEAD_DIM, generator=gen)
        slots = perm[start:start + n].to(device)
        store_kv(fmt, planes, slots, k.to(device), v.to(device))
        seqs.append((q.to(device), k.to(device), v.to(device), slots))
        start += n
    return planes, seqs


def _call(fmt, planes, seqs, spans, device, *, kernel: bool, new_slots: bool, scratch: bool | None):
    """One extend call over sequence i's rows spans[i] = (a, b): prefix = its tokens before a, new = a .. b.
    Returns the output rows per sequence."""
    q = torch.cat([s[0][a:b] for s, (a, b) in zip(seqs, spans)])
    k = torch.cat([s[1][a:b] for s, (a, b) in zip(seqs, spans)])
    v = torch.cat([s[2][a:b] for s, (a, b) in zip(seqs, spans)])
    new = torch.cat([s[3][a:b] for s, (a, b) in zip(seqs, spans)])
    prefix = torch.cat([s[3][:a] for s, (a, _b) in zip(seqs, spans)])
    qo = _indptr([b - a for a, b in spans], device)
    kvp = _indptr([a for a, _b in spans], device)
    slots = new if new_slots else None
    if kernel:
        o = torch.full(q.shape, float("nan"), dtype=torch.float32, device=device)
        extend_attention(fmt, q, k, v, o, planes, qo, kvp, prefix, max(b - a for a, b in spans), HEAD_DIM ** -0.5,
                         block_m=8, block_n=16, dot_bf16=False, new_slots=slots, prefix_scratch=scratch)
        assert not torch.isnan(o).any(), "extend left output elements unwritten"
    else:
        o = reference.extend_attention(fmt, q, k, v, planes, qo, kvp, prefix, HEAD_DIM ** -0.5, new_slots=slots)
    return o.split([b - a for a, b in spans])


def _chunked(fmt, planes, seqs, device, **kw) -> list[torch.Tensor]:
    """Every sequence through its SPLITS, one extend call per step (shorter sequences finish early)."""
    outs = [[] for _ in seqs]
    for step in range(max(len(s) - 1 for s in SPLITS)):
        live = [i for i, s in enumerate(SPLITS) if step + 1 < len(s)]
        rows = _call(fmt, planes, [seqs[i] for i in live], [(SPLITS[i][step], SPLITS[i][step + 1]) for i in live],
                     device, **kw)
        for i, o in zip(live, rows):
            outs[i].append(o)
    return [torch.cat(o) for o in outs]


@pytest.mark.parametrize("name", FORMATS)
def test_extend_output_does_not_depend_on_chunking(name, device):
    fmt = get_format(name, HEAD_DIM, None)
    planes, seqs = _sequences(fmt, device)
    whole = [(0, n) for n in LENGTHS]
    ref_whole = _call(fmt, planes, seqs, whole, device, kernel=False, new_slots=True, scratch=None)
    ref_chunked = _chunked(fmt, planes, seqs, device, kernel=False, new_slots=True, scratch=None)
    for i, (a, b) in enumerate(zip(ref_whole, ref_chunked)):
        err = (a - b).abs().max().item()
        assert err < TOL, f"{name}: reference, sequence {i}: whole vs chunked differ by {err}"
    # the whole sequences have no prefix: the direct kernel, new tokens decoded in it (NEW_FROM_POOL); chunked,
    # scratch False: the same; True: the rule, which takes the prefix scratch for the 16- and 17-row chunks
    got_whole = _call(fmt, planes, seqs, whole, device, kernel=True, new_slots=True, scratch=False)
    for scratch in (False, True):
        got_chunked = _chunked(fmt, planes, seqs, device, kernel=True, new_slots=True, scratch=None if scratch else False)
        for i in range(len(LENGTHS)):
            for label, got in (("whole", got_whole[i]), (f"chunked, scratch {scratch}", got_chunked[i])):
                err = (got - ref_whole[i]).abs().max().item()
                assert err < TOL, f"{name}: kernel {label}, sequence {i}: differs from the reference by {err}"
    # Taken at full precision, a chunk's own tokens are not the bytes later chunks read: the outputs part.
    full = _chunked(fmt, planes, seqs, device, kernel=False, new_slots=False, scratch=None)
    gap = max((a - b).abs().max().item() for a, b in zip(full, ref_chunked))
    assert gap > 100 * TOL, f"{name}: full-precision new tokens differ from read-back ones by only {gap}"


@pytest.mark.parametrize("name", ["octave_k3v4"])
def test_prefix_scratch_reads_new_tokens_from_pool(name, device, monkeypatch):
    # The scratch path dequantizes the new tokens at new_slots (one more dequantize call per head chunk).
    from sglang_ext.kernels import extend as extend_mod

    calls = []
    real = extend_mod.dequantize_rotated

    def spy(fmt, planes, loc, k_out, v_out, head_base=0, **kw):
        calls.append((loc.shape[0], k_out.shape[0], head_base))
        return real(fmt, planes, loc, k_out, v_out, head_base=head_base, **kw)

    monkeypatch.setattr(extend_mod, "dequantize_rotated", spy)
    fmt = get_format(name, HEAD_DIM, None)
    planes, seqs = _sequences(fmt, device)
    spans = [(16, 33), (7, 23)]
    got = _call(fmt, planes, seqs, spans, device, kernel=True, new_slots=True, scratch=True)
    ref = _call(fmt, planes, seqs, spans, device, kernel=False, new_slots=True, scratch=None)
    new_rows = sum(b - a for a, b in spans)
    assert [c[1] for c in calls] == [16 + 7, new_rows], f"dequantize calls (loc rows, out rows, head): {calls}"
    for i, (a, b) in enumerate(zip(got, ref)):
        err = (a - b).abs().max().item()
        assert err < TOL, f"{name}: scratch with new_slots, sequence {i}: differs from the reference by {err}"


def test_extend_mode_from_the_environment(monkeypatch):
    from sglang_ext.kvcache import new_token_reads

    for value, want in ((None, True), ("", True), ("full", False), (" Full ", False), ("pool", True)):
        if value is None:
            monkeypatch.delenv("SGLANG_EXT_KV_EXTEND_NEW_TOKENS", raising=False)
        else:
            monkeypatch.setenv("SGLANG_EXT_KV_EXTEND_NEW_TOKENS", value)
        new_token_reads.extend_reads_pool.cache_clear()
        assert new_token_reads.extend_reads_pool() is want, value
    monkeypatch.setenv("SGLANG_EXT_KV_EXTEND_NEW_TOKENS", "fp32")
    new_token_reads.extend_reads_pool.cache_clear()
    with pytest.raises(ValueError, match="expected one of"):
        new_token_reads.extend_reads_pool()
    monkeypatch.delenv("SGLANG_EXT_KV_EXTEND_NEW_TOKENS")
    new_token_reads.extend_reads_pool.cache_clear()


@pytest.mark.parametrize("name", ["octave_k3v3"])
def test_verify_with_custom_mask_reads_new_tokens_in_the_kernel(name, device):
    # With a custom mask (speculative verify) the kernel decodes the new tokens' codes itself (NEW_FROM_POOL);
    # every other extend with new_slots dequantizes them first. Both must equal the reference.
    fmt = get_format(name, HEAD_DIM, None)
    planes, seqs = _sequences(fmt, device)
    spans = [(30, 36), (19, 23)]
    blocks = []
    for a, b in spans:
        m = b - a
        blocks.append(torch.cat([torch.ones(m, a, dtype=torch.bool), torch.ones(m, m, dtype=torch.bool).tril()], 1))
    mask = torch.cat([blk.flatten() for blk in blocks]).to(device)
    mask_indptr = _indptr([blk.numel() for blk in blocks], device)
    q = torch.cat([s[0][a:b] for s, (a, b) in zip(seqs, spans)])
    k = torch.cat([s[1][a:b] for s, (a, b) in zip(seqs, spans)])
    v = torch.cat([s[2][a:b] for s, (a, b) in zip(seqs, spans)])
    new = torch.cat([s[3][a:b] for s, (a, b) in zip(seqs, spans)])
    prefix = torch.cat([s[3][:a] for s, (a, _b) in zip(seqs, spans)])
    qo, kvp = _indptr([b - a for a, b in spans], device), _indptr([a for a, _b in spans], device)
    o = torch.full(q.shape, float("nan"), dtype=torch.float32, device=device)
    extend_attention(fmt, q, k, v, o, planes, qo, kvp, prefix, 6, HEAD_DIM ** -0.5, block_m=8, block_n=16,
                     dot_bf16=False, new_slots=new, custom_mask=mask, mask_indptr=mask_indptr)
    ref = reference.extend_attention(fmt, q, k, v, planes, qo, kvp, prefix, HEAD_DIM ** -0.5, custom_mask=mask,
                                     mask_indptr=mask_indptr, new_slots=new)
    plain = _call(fmt, planes, seqs, spans, device, kernel=True, new_slots=True, scratch=False)
    err = (o - ref).abs().max().item()
    assert err < TOL, f"{name}: verify (custom mask, new tokens decoded in the kernel) vs reference: {err}"
    err = (torch.cat(plain) - ref).abs().max().item()
    assert err < TOL, f"{name}: causal extend (new tokens dequantized first) vs the causal-mask verify: {err}"
