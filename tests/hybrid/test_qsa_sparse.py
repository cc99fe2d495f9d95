"""qwen4_exp's QSA ops (sglang_ext/hybrid/ops/qsa_sparse.py) against float64 references, at the tiny qwen4_exp's
shapes (4 query heads over 2 KV heads of head_dim 256; a budget of 2048 + 3 tail slots; 512 blocks selected),
and against SGLang's own per-row CPU paths, which they replace on the CPU platform."""

import math

import pytest
import torch

from sglang_ext.hybrid.ops.qsa_sparse import gather_compressed_keys, ragged_topk, sparse_gqa_attention


def _reference_topk_sets(logits, starts, ends, topk):
    """float64: per row, the set of relative columns of the `topk` largest values of its section."""
    out = []
    for row in range(logits.shape[0]):
        section = logits[row, int(starts[row]):int(ends[row])].double()
        order = sorted(range(section.numel()), key=lambda c: -section[c].item())
        out.append(set(order[:topk]))
    return out


@pytest.mark.parametrize("topk", [512, 4])
def test_ragged_topk_selects_each_rows_largest(topk):
    gen = torch.Generator().manual_seed(0)
    width = 700
    # ragged sections: empty, shorter than topk, exactly topk, longer; distinct values (no ties)
    starts = torch.tensor([0, 0, 10, 100, 3, 0])
    ends = torch.tensor([0, 3, 10 + topk, 700, 600, 700])
    logits = torch.randperm(6 * width, generator=gen).reshape(6, width).float()
    logits[1, 1] = float("-inf")  # inside a section: still selected before anything outside it
    got = ragged_topk(logits, starts, ends, topk)
    assert got.shape == (6, topk) and got.dtype == torch.int32
    for row, expected in enumerate(_reference_topk_sets(logits, starts, ends, topk)):
        taken = got[row][got[row] >= 0].tolist()
        assert set(taken) == expected and len(taken) == len(expected), f"row {row}"
        assert (got[row, len(taken):] == -1).all(), f"row {row}: padding"
        section = logits[row, int(starts[row]):]
        assert all(section[a] >= section[b] for a, b in zip(taken, taken[1:])), f"row {row}: order"


def test_ragged_topk_equals_sglang_cpu_path():
    from sglang.srt.layers.attention.qsa.kernel import qsa_fast_topk

    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(9, 1100, generator=gen)
    starts = torch.tensor([0, 0, 5, 40, 512, 0, 1, 2, 3], dtype=torch.int32)
    ends = torch.tensor([1, 511, 517, 1100, 1024, 1100, 2, 600, 1099], dtype=torch.int32)
    assert torch.equal(ragged_topk(logits, starts, ends, 512), qsa_fast_topk(logits, starts, ends, 512))


def _reference_attention(q, k_cache, v_cache, slots, scale):
    """float64, one row and one head at a time."""
    rows, heads, dim = q.shape
    group = heads // k_cache.shape[1]
    out = torch.zeros(rows, heads, dim, dtype=torch.float64)
    for r in range(rows):
        chosen = slots[r][slots[r] >= 0].long()
        if chosen.numel() == 0:
            continue
        for h in range(heads):
            keys = k_cache[chosen, h // group].double()
            values = v_cache[chosen, h // group].double()
            weights = torch.softmax(keys @ q[r, h].double() * scale, dim=0)
            out[r, h] = weights @ values
    return out


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.float64, 1e-12)])
def test_sparse_gqa_attention_matches_float64(dtype, tol):
    gen = torch.Generator().manual_seed(2)
    slots_total, rows, width = 3000, 7, 2051  # the tiny model's budget 2048 + ratio 4 - 1 tail slots
    q = torch.randn(rows, 4, 256, generator=gen, dtype=dtype)
    k_cache = torch.randn(slots_total, 2, 256, generator=gen, dtype=dtype)
    v_cache = torch.randn(slots_total, 2, 256, generator=gen, dtype=dtype)
    slots = torch.full((rows, width), -1, dtype=torch.int32)
    for r, count in enumerate([0, 1, 3, 64, 700, 2048, 2051]):
        slots[r, :count] = torch.randperm(slots_total, generator=gen)[:count].to(torch.int32)
    scale = 256**-0.5
    got = sparse_gqa_attention(q, k_cache, v_cache, slots, scale)
    assert got.dtype == dtype and got.shape == q.shape
    expected = _reference_attention(q, k_cache, v_cache, slots, scale)
    assert torch.equal(got[0], torch.zeros_like(got[0])), "a row without slots is zeros"
    err = (got.double() - expected).abs().max().item()
    assert err < tol, f"max abs error {err:.2e} vs float64 (tolerance {tol:.0e})"


def test_sparse_gqa_attention_chunks_rows(monkeypatch):
    """Rows split over several chunks give the rows of one chunk up to float32 rounding (the GEMMs' summation
    order depends on the row count; the chunk size bounds memory only)."""
    import sglang_ext.hybrid.ops.qsa_sparse as ops

    gen = torch.Generator().manual_seed(3)
    q = torch.randn(10, 4, 64, generator=gen)
    kv = torch.randn(2, 50, 2, 64, generator=gen)
    slots = torch.randint(-1, 50, (10, 8), generator=gen, dtype=torch.int32)
    whole = ops.sparse_gqa_attention(q, kv[0], kv[1], slots)
    monkeypatch.setattr(ops, "_CHUNK_BYTES", 1)  # one row per chunk
    err = (ops.sparse_gqa_attention(q, kv[0], kv[1], slots) - whole).abs().max().item()
    assert err < 1e-6, f"one row per chunk differs by {err:.2e}"


def test_sparse_gqa_attention_equals_sglang_cpu_path():
    from sglang.srt.layers.attention.qsa.kernel import qsa_sparse_attention

    gen = torch.Generator().manual_seed(4)
    q = torch.randn(5, 4, 256, generator=gen)
    k_cache = torch.randn(400, 2, 256, generator=gen)
    v_cache = torch.randn(400, 2, 256, generator=gen)
    slots = torch.randint(-1, 400, (5, 131), generator=gen, dtype=torch.int32)
    expected = qsa_sparse_attention(q, k_cache, v_cache, slots, 1 / math.sqrt(256))
    err = (sparse_gqa_attention(q, k_cache, v_cache, slots, 1 / math.sqrt(256)) - expected).abs().max().item()
    assert err < 2e-6, f"differs from SGLang's CPU path by {err:.2e}"


def test_gather_compressed_keys_copies_each_sequences_blocks():
    """Lossless: bit-exact bf16 rows, sequence after sequence, a block's row = its first token's slot // ratio."""
    gen = torch.Generator().manual_seed(5)
    ratio, page = 4, 64
    compressed = torch.randn(96, 1, 64, generator=gen).to(torch.bfloat16)  # 6 pages of 64 tokens / 4
    lengths = [3, 64, 71, 151]  # 0, 16, 17 and 37 complete blocks
    pages = torch.randperm(6, generator=gen)
    table = torch.zeros(len(lengths), 192, dtype=torch.int32)
    for s, length in enumerate(lengths):  # page-aligned slots, as SGLang's allocator gives qwen4_exp
        for p in range(-(-length // page)):
            table[s, p * page:(p + 1) * page] = pages[(s + p) % 6] * page + torch.arange(page)
    blocks = [n // ratio for n in lengths]
    cu = torch.tensor([0] + torch.tensor(blocks).cumsum(0).tolist(), dtype=torch.int32)
    got = gather_compressed_keys(compressed, table, cu, sum(blocks), max(blocks), ratio)
    expected = torch.cat([compressed[table[s, :n * ratio:ratio].long() // ratio] for s, n in enumerate(blocks)])
    assert got.shape == (sum(blocks), 1, 64) and got.dtype == torch.bfloat16
    assert not torch.equal(compressed[: sum(blocks)], expected), "the gather must reorder rows to be tested"
    assert torch.equal(got.view(torch.int16), expected.view(torch.int16))
    with pytest.raises(ValueError, match="max_blocks"):
        gather_compressed_keys(compressed, table, cu, sum(blocks), max(blocks) - 1, ratio)
    assert gather_compressed_keys(compressed, table, torch.zeros(3, dtype=torch.int32), 0, 0, ratio).shape[0] == 0
