"""Decode and extend kernels vs the torch reference (kvformats.reference) over a grid: head_dim 64/128/256,
GQA 1/3/8, page size 1/16, ragged lengths (an empty request, lengths spanning several splits), poisoned
outputs (NaN-filled: every element must be written)."""

import pytest
import torch
from kernel_test_helpers import allocate_slots, indptr

from sglang_ext.kernels import decode_attention, extend_attention, store_kv
from sglang_ext.kernels.decode import verify_tree_mask
from sglang_ext.kvformats import FORMAT_NAMES, get_format, reference

# (head_dim, rotary_dim, kv heads, GQA group)
CASES = [(64, None, 2, 1), (128, None, 1, 3), (256, 64, 1, 8)]


def _pool(fmt, lengths, page_size, h_kv, gen, device):
    slots = allocate_slots(lengths, page_size, num_pages=-(-sum(lengths) // page_size) + len(lengths) + 8, gen=gen)
    num_slots = (-(-sum(lengths) // page_size) + len(lengths) + 8) * page_size
    planes = fmt.allocate(num_slots, h_kv, device)
    flat = torch.cat(slots) if slots else torch.zeros(0, dtype=torch.int64)
    n = flat.numel()
    k = torch.randn(n, h_kv, fmt.head_dim, generator=gen) * 2
    k[:, :, 1] += 6.0  # an outlier channel
    v = torch.randn(n, h_kv, fmt.head_dim, generator=gen)
    store_kv(fmt, planes, flat.to(device), k.to(device=device, dtype=torch.bfloat16), v.to(device=device, dtype=torch.bfloat16))
    return planes, flat


@pytest.mark.parametrize("name", FORMAT_NAMES)
@pytest.mark.parametrize("head_dim,rotary_dim,h_kv,group", CASES)
@pytest.mark.parametrize("page_size", [1, 16])
def test_decode_matches_reference(name, head_dim, rotary_dim, h_kv, group, page_size, device):
    fmt = get_format(name, head_dim, rotary_dim)
    gen = torch.Generator().manual_seed(head_dim + page_size)
    lengths = [70, 0, 5, 33]
    planes, flat = _pool(fmt, lengths, page_size, h_kv, gen, device)
    kv_indptr = indptr(lengths, device)
    q = torch.randn(len(lengths), h_kv * group, head_dim, generator=gen).to(device=device, dtype=torch.bfloat16)
    o = torch.full(q.shape, float("nan"), dtype=torch.bfloat16, device=device)
    splits = torch.tensor([4, 1, 2, 3], dtype=torch.int32, device=device)
    decode_attention(fmt, q, planes, o, kv_indptr, flat.to(device=device, dtype=torch.int32), head_dim ** -0.5,
                     num_kv_splits=splits, max_kv_splits=4, page_size=page_size)
    ref = reference.decode_attention(fmt, q, planes, kv_indptr, flat.to(device), head_dim ** -0.5)
    assert not torch.isnan(o).any(), "decode left output elements unwritten"
    assert not o[1].float().any(), "a request without KV must get zeros"
    # o is bf16. Octave on a GPU scores with bf16 q and levels at d256: on the H200 one element of 8192 reached
    # 0.0242 (octave_k3v4, page 16, in the 5-token request, whose sharp softmax does not average a score error out)
    atol = 3e-2 if device == "cuda" and fmt.rotated else 2e-2
    torch.testing.assert_close(o.float().cpu(), ref.cpu(), rtol=2e-2, atol=atol)
    rel = ((o.float() - ref).norm() / ref.norm()).item()
    print(f"{name} d{head_dim} page {page_size}: relative error {rel:.2e}, largest {(o.float() - ref).abs().max():.2e}")
    assert rel < 1e-2, f"{name}: relative error {rel:.2e} against the reference"
    o32 = torch.full(q.shape, float("nan"), dtype=torch.float32, device=device)
    decode_attention(fmt, q, planes, o32, kv_indptr, flat.to(device), head_dim ** -0.5, max_kv_splits=2,
                     page_size=page_size, dot_bf16=False)
    err = (o32 - ref).abs().max().item()
    assert err < _f32_tol(device), f"{name}: fp32 output differs from the reference by {err}"


def test_decode_logit_cap(device):
    fmt = get_format("octave_k3v3", 128)
    gen = torch.Generator().manual_seed(3)
    planes, flat = _pool(fmt, [40, 9], 1, 2, gen, device)
    q = (torch.randn(2, 4, 128, generator=gen) * 10).to(device)
    o = torch.empty_like(q)
    ip = indptr([40, 9], device)
    decode_attention(fmt, q, planes, o, ip, flat.to(device), 0.1, logit_cap=5.0, dot_bf16=False)
    ref = reference.decode_attention(fmt, q, planes, ip, flat.to(device), 0.1, logit_cap=5.0)
    # tf32 on a GPU: scores of |q| ~ 10 carry ten times the error of the unit-scale tests
    assert (o - ref).abs().max().item() < (1e-4 if device == "cpu" else 4e-2)


@pytest.mark.parametrize("name", FORMAT_NAMES)
@pytest.mark.parametrize("head_dim,rotary_dim,h_kv,group", CASES)
@pytest.mark.parametrize("page_size", [1, 16])
def test_extend_matches_reference(name, head_dim, rotary_dim, h_kv, group, page_size, device, monkeypatch):
    # The direct kernel (compressed prefix tiles decoded in the kernel), then, for the compressed formats, the
    # prefix scratch (the prefix dequantized once into a buffer in the attention basis, then the FMT 0 kernel)
    # as the launcher's rule picks it here (2 query blocks of 16): a spy confirms the scratch was taken.
    if page_size == 16 and name == "bf16" and head_dim != 64:
        pytest.skip("page-size coverage for bf16 planes is the d64 case (interpreter time)")
    fmt = get_format(name, head_dim, rotary_dim)
    gen = torch.Generator().manual_seed(head_dim * 3 + page_size)
    prefix, ext = [37, 0, 20], [5, 19, 1]
    planes, flat = _pool(fmt, prefix, page_size, h_kv, gen, device)
    t = sum(ext)
    q = torch.randn(t, h_kv * group, head_dim, generator=gen).to(device=device, dtype=torch.bfloat16)
    ke = torch.randn(t, h_kv, head_dim, generator=gen).to(device=device, dtype=torch.bfloat16)
    ve = torch.randn(t, h_kv, head_dim, generator=gen).to(device=device, dtype=torch.bfloat16)
    qo, kvp = indptr(ext, device), indptr(prefix, device)
    for causal in (True, False) if head_dim == 64 else (True,):
        o = torch.full((t, h_kv * group, head_dim), float("nan"), dtype=torch.float32, device=device)
        extend_attention(fmt, q, ke, ve, o, planes, qo, kvp, flat.to(device=device, dtype=torch.int32), max(ext),
                         head_dim ** -0.5, is_causal=causal, page_size=page_size, block_m=16, block_n=16,
                         dot_bf16=False, prefix_scratch=False)  # the direct kernel (the rule would pick the scratch)
        ref = reference.extend_attention(fmt, q, ke, ve, planes, qo, kvp, flat.to(device), head_dim ** -0.5,
                                         is_causal=causal)
        assert not torch.isnan(o).any(), "extend left output elements unwritten"
        err = (o - ref).abs().max().item()
        assert err < _f32_tol(device), f"{name} causal={causal}: differs from the reference by {err}"
    if name == "bf16":
        return
    # kv_indices padded past kv_indptr[B] (as SGLang's over-allocated buffer can be) with slots far out of
    # range: the dequantization reads its row count from kv_indptr on the device, so never these; the scratch is
    # sized, and the rule decides, from the prefix lengths (57 rows), not the buffer (64): a budget of exactly 57
    # rows of every KV head (float32 K and V) takes them all in one chunk
    calls = _spy_dequant(monkeypatch)
    ref = reference.extend_attention(fmt, q, ke, ve, planes, qo, kvp, flat.to(device), head_dim ** -0.5)  # causal
    padded = torch.cat([flat, torch.full((7,), 1 << 40, dtype=torch.int64)]).to(device)
    o = torch.full((t, h_kv * group, head_dim), float("nan"), dtype=torch.float32, device=device)
    extend_attention(fmt, q, ke, ve, o, planes, qo, kvp, padded, max(ext), head_dim ** -0.5, page_size=page_size,
                     block_m=16, block_n=16, dot_bf16=False, scratch_bytes=sum(prefix) * h_kv * head_dim * 4 * 2)
    assert calls == [(0, h_kv, sum(prefix))], f"the rule did not take the prefix scratch of 57 rows ({calls})"
    assert not torch.isnan(o).any(), "prefix-scratch extend left output elements unwritten"
    err = (o - ref).abs().max().item()
    assert err < _f32_tol(device), f"{name}: prefix-scratch extend differs from the reference by {err}"


def _f32_tol(device):
    """dot_bf16=False: float32 dots, exact under the interpreter; on a GPU Triton runs them in tf32."""
    return 1e-4 if device == "cpu" else 4e-3


def _spy_dequant(monkeypatch):
    """Records each dequantize_rotated call made by extend_attention (KV-head base, heads, rows), calling through."""
    from sglang_ext.kernels import extend as extend_mod

    calls = []
    real = extend_mod.dequantize_rotated

    def spy(fmt, planes, loc, k_out, v_out, head_base=0, **kw):
        calls.append((head_base, k_out.shape[1], k_out.shape[0]))
        return real(fmt, planes, loc, k_out, v_out, head_base=head_base, **kw)

    monkeypatch.setattr(extend_mod, "dequantize_rotated", spy)
    return calls


def test_extend_prefix_scratch_rule_and_head_chunks(device, monkeypatch):
    from sglang_ext.kernels.extend_plan import scratch_plan
    from sglang_ext.kernels.tables import FMT_BF16, FMT_INT8, FMT_OCTAVE

    # the rule: compressed formats, >= 2 query blocks, not verify, within the budget (per KV head: rows x D x
    # bytes x 2); over budget, KV heads in chunks; one head over budget: the direct kernel
    assert scratch_plan(FMT_OCTAVE, 32768, 8, 128, 4096, 32, 2, False) == [(0, 8)]
    assert scratch_plan(FMT_INT8, 32768, 8, 128, 4096, 32, 2, False) == [(0, 8)]
    assert scratch_plan(FMT_BF16, 32768, 8, 128, 4096, 32, 2, False) is None
    assert scratch_plan(FMT_OCTAVE, 32768, 8, 128, 32, 32, 2, False) is None  # one query block
    assert scratch_plan(FMT_OCTAVE, 32768, 8, 128, 32, 32, 2, False, force=True) == [(0, 8)]
    assert scratch_plan(FMT_OCTAVE, 32768, 8, 128, 4096, 32, 2, True) is None  # verify
    assert scratch_plan(FMT_OCTAVE, 131072, 8, 128, 4096, 32, 2, False) == [(0, 4), (4, 8)]  # 512 MiB
    assert scratch_plan(FMT_OCTAVE, 163840, 8, 128, 4096, 32, 2, False) == [(0, 3), (3, 6), (6, 8)]  # 80 MiB a head
    assert scratch_plan(FMT_OCTAVE, 2 ** 19 + 1, 8, 128, 4096, 32, 2, False) is None  # one head > 256 MiB
    assert scratch_plan(FMT_OCTAVE, None, 8, 128, 4096, 32, 2, False, force=True) is None  # lengths unknown
    # head chunks end to end: a budget of one KV head's scratch (2 heads, d64, float32)
    calls = _spy_dequant(monkeypatch)
    fmt = get_format("octave_k3v4", 64)
    gen = torch.Generator().manual_seed(2)
    prefix, ext = [37, 20], [19, 3]
    planes, flat = _pool(fmt, prefix, 1, 2, gen, device)
    t = sum(ext)
    q = torch.randn(t, 6, 64, generator=gen).to(device)
    ke = torch.randn(t, 2, 64, generator=gen).to(device)
    ve = torch.randn(t, 2, 64, generator=gen).to(device)
    qo, kvp = indptr(ext, device), indptr(prefix, device)
    ref = reference.extend_attention(fmt, q, ke, ve, planes, qo, kvp, flat.to(device), 0.125)
    for budget, want in ((57 * 64 * 4 * 2, [(0, 1, 57), (1, 1, 57)]), (57 * 64 * 4 * 2 - 1, [])):
        calls.clear()
        o = torch.full((t, 6, 64), float("nan"), dtype=torch.float32, device=device)
        extend_attention(fmt, q, ke, ve, o, planes, qo, kvp, flat.to(device), max(ext), 0.125, block_m=16,
                         block_n=16, dot_bf16=False, scratch_bytes=budget)
        assert calls == want, (budget, calls)
        assert not torch.isnan(o).any(), "extend left output elements unwritten"
        err = (o - ref).abs().max().item()
        assert err < _f32_tol(device), f"budget {budget}: differs from the reference by {err}"


@pytest.mark.parametrize("name", ["int8", "octave_k3v4", "octave_k3v3"])
def test_kernels_on_real_smollm2_kv(name, device):
    """End to end through the kernels on real SmolLM2 K/V/Q: store, then decode 8 queries each over its causal
    prefix; the error vs float64 attention on the exact K/V stays under the format's SmolLM2 threshold."""
    from tools.attention_error import SMOLLM2_MEAN_ERR, exact_attention, smollm2_fixture

    data = smollm2_fixture()
    layer = 2
    q, k, v = data["q"][layer].float(), data["k"][layer].float(), data["v"][layer].float()
    t = k.shape[0]
    fmt = get_format(name, 64)
    planes = fmt.allocate(t, 3, device)
    store_kv(fmt, planes, torch.arange(t, device=device), k.to(device), v.to(device))
    picks = torch.arange(0, q.shape[0], 8)
    positions = t - q.shape[0] + picks
    lengths = (positions + 1).tolist()
    kv_indices = torch.cat([torch.arange(n) for n in lengths]).to(device)
    o = torch.empty(len(picks), 9, 64, device=device)
    decode_attention(fmt, q[picks].to(device), planes, o, indptr(lengths, device), kv_indices, 0.125,
                     max_kv_splits=2, block_n=64, dot_bf16=False)
    ref = exact_attention(q[picks], k, v, 0.125, positions)
    err = float((o.cpu().double() - ref).norm() / ref.norm())
    assert err < SMOLLM2_MEAN_ERR[name] * 1.25, f"{name}: kernel attention rel error on SmolLM2 {err:.4f}"


@pytest.mark.parametrize("name", ["int8", "octave_k3v4"])
def test_bf16_dot_operands_stay_close(name, device):
    """The GPU default feeds bf16 operands to the dots (scales stay float32): within bf16 rounding of exact."""
    if device == "cpu":
        pytest.skip("the Triton CPU interpreter does not emulate dots on bf16 operands; runs on a GPU")
    fmt = get_format(name, 256, 64)
    gen = torch.Generator().manual_seed(11)
    lengths = [50, 17]
    planes, flat = _pool(fmt, lengths, 1, 1, gen, device)
    q = torch.randn(2, 8, 256, generator=gen).to(device)
    ip = indptr(lengths, device)
    ref = reference.decode_attention(fmt, q, planes, ip, flat.to(device), 256 ** -0.5)
    o = torch.empty_like(q)
    decode_attention(fmt, q, planes, o, ip, flat.to(device), 256 ** -0.5, dot_bf16=True)
    err = ((o - ref).norm() / ref.norm()).item()
    assert err < 2e-2, f"{name}: bf16-operand decode rel error {err}"
    t = 9
    qe = torch.randn(t, 8, 256, generator=gen).to(device)
    ke = torch.randn(t, 1, 256, generator=gen).to(device)
    qo, kvp = indptr([t, 0], device), indptr(lengths, device)
    oe = torch.empty_like(qe)
    extend_attention(fmt, qe, ke, ke, oe, planes, qo, kvp, flat.to(device), t, 256 ** -0.5, dot_bf16=True,
                     block_m=16, block_n=16)
    ref = reference.extend_attention(fmt, qe, ke, ke, planes, qo, kvp, flat.to(device), 256 ** -0.5)
    err = ((oe - ref).norm() / ref.norm()).item()
    assert err < 2e-2, f"{name}: bf16-operand extend rel error {err}"


def _tree_verify_mask(prefix_lens, num_draft, gen):
    """SGLang's target-verify mask for random draft trees (flat bool, and its per-request offsets): each draft
    token sees the whole prefix, itself and its ancestors."""
    blocks = []
    for lp in prefix_lens:
        parent = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, num_draft)]
        block = torch.zeros(num_draft, lp + num_draft, dtype=torch.bool)
        block[:, :lp] = True
        for i in range(num_draft):
            j = i
            while j >= 0:
                block[i, lp + j] = True
                j = parent[j]
        blocks.append(block.flatten())
    return torch.cat(blocks), indptr([b.numel() for b in blocks], "cpu")


@pytest.mark.parametrize("name", ["int8", "octave_k3v4", "octave_k3v3"])
def test_tree_verify_custom_mask_matches_reference(name, device):
    # Tree drafts (--speculative-eagle-topk > 1): the verify mask replaces the causal one among the draft tokens;
    # 20 drafts with 16-row blocks so the mask spans several query and key blocks.
    fmt = get_format(name, 64, None)
    gen = torch.Generator().manual_seed(5)
    prefix, num_draft = [30, 9], 20
    planes, flat = _pool(fmt, prefix, 1, 3, gen, device)
    t = num_draft * len(prefix)
    q = torch.randn(t, 6, 64, generator=gen).to(device=device, dtype=torch.bfloat16)
    ke = torch.randn(t, 3, 64, generator=gen).to(device=device, dtype=torch.bfloat16)
    ve = torch.randn(t, 3, 64, generator=gen).to(device=device, dtype=torch.bfloat16)
    qo, kvp = indptr([num_draft] * len(prefix), device), indptr(prefix, device)
    mask, mask_indptr = _tree_verify_mask(prefix, num_draft, gen)
    mask, mask_indptr = mask.to(device), mask_indptr.to(device)
    o = torch.full((t, 6, 64), float("nan"), dtype=torch.float32, device=device)
    extend_attention(fmt, q, ke, ve, o, planes, qo, kvp, flat.to(device), num_draft, 0.125, block_m=16, block_n=16,
                     dot_bf16=False, custom_mask=mask, mask_indptr=mask_indptr)
    ref = reference.extend_attention(fmt, q, ke, ve, planes, qo, kvp, flat.to(device), 0.125, custom_mask=mask,
                                     mask_indptr=mask_indptr)
    causal = reference.extend_attention(fmt, q, ke, ve, planes, qo, kvp, flat.to(device), 0.125)
    assert (causal - ref).abs().max().item() > 1e-3, "this tree equals the causal mask: the test could not fail"
    err = (o - ref).abs().max().item()
    assert err < _f32_tol(device), f"{name}: tree-masked verify differs from the reference by {err}"


@pytest.mark.parametrize("name", ["int8", "octave_k3v4", "octave_k3v3"])
def test_verify_reads_drafts_like_sequential_decode(name, device):
    # Speculative verify (new_slots): the drafts, stored first, are read back through the format, so each draft
    # row's output is the decode kernel's for that token over prefix + drafts so far; attending to the drafts at
    # full precision (as prefill does) would not be.
    fmt = get_format(name, 64, None)
    gen = torch.Generator().manual_seed(11)
    prefix, n, h_kv, group = [30, 9], 4, 2, 3
    planes, flat = _pool(fmt, [lp + n for lp in prefix], 1, h_kv, gen, device)
    runs = flat.split([lp + n for lp in prefix])
    prefix_slots = torch.cat([r[:lp] for r, lp in zip(runs, prefix)]).to(device)
    draft_slots = torch.cat([r[lp:] for r, lp in zip(runs, prefix)]).to(device)
    t = n * len(prefix)
    q = torch.randn(t, h_kv * group, 64, generator=gen).to(device=device, dtype=torch.bfloat16)
    ke = torch.randn(t, h_kv, 64, generator=gen).to(device=device, dtype=torch.bfloat16)
    ve = torch.randn(t, h_kv, 64, generator=gen).to(device=device, dtype=torch.bfloat16)
    store_kv(fmt, planes, draft_slots, ke, ve)
    qo, kvp = indptr([n] * len(prefix), device), indptr(prefix, device)
    o = torch.full((t, h_kv * group, 64), float("nan"), dtype=torch.float32, device=device)
    extend_attention(fmt, q, ke, ve, o, planes, qo, kvp, prefix_slots, n, 0.125, block_m=16, block_n=16,
                     dot_bf16=False, new_slots=draft_slots)
    ref = reference.extend_attention(fmt, q, ke, ve, planes, qo, kvp, prefix_slots, 0.125, new_slots=draft_slots)
    err_ref = (o - ref).abs().max().item()
    assert err_ref < _f32_tol(device), f"{name}: verify with new_slots differs from the reference by {err_ref}"
    decode = torch.empty_like(o)
    for j in range(n):
        rows = torch.arange(len(prefix), device=device) * n + j
        seen = [r[: lp + j + 1] for r, lp in zip(runs, prefix)]
        o_j = torch.full((len(prefix), h_kv * group, 64), float("nan"), dtype=torch.float32, device=device)
        decode_attention(fmt, q[rows], planes, o_j, indptr([s.numel() for s in seen], device),
                         torch.cat(seen).to(device), 0.125, dot_bf16=False)
        decode[rows] = o_j
    err = (o - decode).abs().max().item()
    assert err < _f32_tol(device), f"{name}: verify differs from sequential decode by {err}"
    full = torch.full_like(o, float("nan"))
    extend_attention(fmt, q, ke, ve, full, planes, qo, kvp, prefix_slots, n, 0.125, block_m=16, block_n=16,
                     dot_bf16=False)
    gap = (full - decode).abs().max().item()
    assert gap > 10 * max(err, 1e-5), f"{name}: full-precision drafts differ from decode by only {gap}: no power"


def _draft_case(fmt, prefix, n_draft, page_size, h_kv, group, seed, device):
    """A pool holding each request's prefix followed by its n_draft drafts, and bf16 queries for the drafts.
    Returns (generator, planes, flat slots, prefix slots, draft slots, q)."""
    gen = torch.Generator().manual_seed(seed)
    planes, flat = _pool(fmt, [lp + n_draft for lp in prefix], page_size, h_kv, gen, device)
    runs = flat.split([lp + n_draft for lp in prefix])
    prefix_slots = torch.cat([r[:lp] for r, lp in zip(runs, prefix)]).to(device)
    draft_slots = torch.cat([r[lp:] for r, lp in zip(runs, prefix)]).to(device)
    q = torch.randn(n_draft * len(prefix), h_kv * group, fmt.head_dim, generator=gen).to(device=device,
                                                                                         dtype=torch.bfloat16)
    return gen, planes, flat, prefix_slots, draft_slots, q


# A diagonal of the grid (every format, head_dim, GQA group and page size once: 24 full-grid cases took 13 min
# under the interpreter), format names as in FORMAT_NAMES.
@pytest.mark.parametrize("name,head_dim,rotary_dim,h_kv,group,q_len,page_size", [
    ("bf16", 64, None, 2, 1, 4, 1), ("int8", 128, None, 1, 3, 3, 16), ("octave_k3v4", 64, None, 2, 1, 4, 16),
    ("octave_k3v3", 256, 64, 1, 8, 4, 1)])
def test_chain_verify_through_decode_matches_reference(name, head_dim, rotary_dim, h_kv, group, q_len, page_size,
                                                       device):
    # decode_attention with q_len > 1: each request's q_len drafts (stored first, read at new_slots) attend to the
    # prefix, split like a decode step, and causally to each other; the reference is the extend reference with
    # new_slots. Prefixes: empty, shorter than one tile, several splits.
    fmt = get_format(name, head_dim, rotary_dim)
    prefix = [0, 5, 300]
    _, planes, _, prefix_slots, draft_slots, q = _draft_case(fmt, prefix, q_len, page_size, h_kv, group, 23, device)
    t = q.shape[0]
    kvp = indptr(prefix, device)
    ref = reference.extend_attention(fmt, q, None, None, planes, indptr([q_len] * len(prefix), device), kvp,
                                     prefix_slots, head_dim ** -0.5, new_slots=draft_slots)
    o = torch.full((t, h_kv * group, head_dim), float("nan"), dtype=torch.float32, device=device)
    padded = torch.cat([draft_slots, torch.full((5,), 1 << 40, dtype=torch.int64, device=device)])
    decode_attention(fmt, q, planes, o, kvp, prefix_slots, head_dim ** -0.5, max_kv_splits=4, page_size=page_size,
                     dot_bf16=False, q_len=q_len, new_slots=padded)
    assert not torch.isnan(o).any(), f"{name}: chain verify left output elements unwritten"
    err = (o - ref).abs().max().item()
    assert err < _f32_tol(device), f"{name}: chain verify through decode differs from the reference by {err}"


@pytest.mark.parametrize("name,head_dim,rotary_dim,h_kv,group,num_draft,page_size", [
    ("int8", 64, None, 2, 3, 6, 1), ("octave_k3v4", 128, None, 1, 8, 4, 16)])
def test_tree_verify_through_decode_matches_reference(name, head_dim, rotary_dim, h_kv, group, num_draft, page_size,
                                                      device):
    # decode_attention with q_len > 1 and a tree mask (--speculative-eagle-topk > 1): each draft attends to the
    # prefix and to the drafts SGLang's verify mask gives it (its ancestors and itself), read at new_slots; the
    # reference is the extend reference with the same mask. Prefixes: empty, shorter than one tile, several splits.
    fmt = get_format(name, head_dim, rotary_dim)
    prefix = [0, 5, 300]
    gen, planes, _, prefix_slots, draft_slots, q = _draft_case(fmt, prefix, num_draft, page_size, h_kv, group, 29,
                                                               device)
    t = q.shape[0]
    kvp, qo = indptr(prefix, device), indptr([num_draft] * len(prefix), device)
    mask, mask_indptr = _tree_verify_mask(prefix, num_draft, gen)
    mask, mask_indptr = mask.to(device), mask_indptr.to(device)
    tree = verify_tree_mask(mask, mask_indptr, kvp, len(prefix), num_draft)
    ref = reference.extend_attention(fmt, q, None, None, planes, qo, kvp, prefix_slots, head_dim ** -0.5,
                                     custom_mask=mask, mask_indptr=mask_indptr, new_slots=draft_slots)
    chain = reference.extend_attention(fmt, q, None, None, planes, qo, kvp, prefix_slots, head_dim ** -0.5,
                                       new_slots=draft_slots)
    assert (chain - ref).abs().max().item() > 1e-3, "these trees equal the chain: the test could not fail"
    o = torch.full((t, h_kv * group, head_dim), float("nan"), dtype=torch.float32, device=device)
    decode_attention(fmt, q, planes, o, kvp, prefix_slots, head_dim ** -0.5, max_kv_splits=4, page_size=page_size,
                     dot_bf16=False, q_len=num_draft, new_slots=draft_slots, tree_mask=tree)
    assert not torch.isnan(o).any(), f"{name}: tree verify left output elements unwritten"
    err = (o - ref).abs().max().item()
    assert err < _f32_tol(device), f"{name}: tree verify through decode differs from the reference by {err}"


# The launches of launch_table.TRITON_LAUNCH (on an H200 they are the defaults; under the interpreter only when asked):
# K / V as the dots' first operand (kv_a), query rows not padded to 16 (min_rows 8), 1 or 2 warps, for a decode step
# and a chain verify, every format; the reference is the extend reference (q_len 1: a decode step).
@pytest.mark.parametrize("name", FORMAT_NAMES)
@pytest.mark.parametrize("head_dim,rotary_dim,h_kv,group,q_len,launch", [
    (64, None, 2, 3, 1, {"kv_a": True, "min_rows": 8, "num_warps": 1, "block_n": 32}),
    (128, None, 1, 8, 1, {"kv_a": False, "min_rows": 8}),
    (128, None, 2, 2, 3, {"kv_a": True, "min_rows": 8, "num_warps": 2, "block_n": 64})])
def test_decode_launches_match_reference(name, head_dim, rotary_dim, h_kv, group, q_len, launch, device):
    fmt = get_format(name, head_dim, rotary_dim)
    prefix = [0, 5, 150]
    _, planes, flat, prefix_slots, draft_slots, q = _draft_case(fmt, prefix, q_len, 16, h_kv, group, 29, device)
    if q_len == 1:  # a decode step: the new token is part of the prefix
        lens = [lp + 1 for lp in prefix]
        slots = flat.to(device)
        ref = reference.decode_attention(fmt, q, planes, indptr(lens, device), slots, head_dim ** -0.5)
        kw = {}
    else:
        lens, slots = prefix, prefix_slots
        ref = reference.extend_attention(fmt, q, None, None, planes, indptr([q_len] * len(prefix), device),
                                         indptr(prefix, device), prefix_slots, head_dim ** -0.5, new_slots=draft_slots)
        kw = {"q_len": q_len, "new_slots": draft_slots}
    o = torch.full(q.shape, float("nan"), dtype=torch.float32, device=device)
    decode_attention(fmt, q, planes, o, indptr(lens, device), slots, head_dim ** -0.5, max_kv_splits=3, page_size=16,
                     dot_bf16=False, **launch, **kw)
    assert not torch.isnan(o).any(), f"{name} {launch}: output elements left unwritten"
    err = (o - ref).abs().max().item()
    assert err < _f32_tol(device), f"{name} {launch}: differs from the reference by {err}"
