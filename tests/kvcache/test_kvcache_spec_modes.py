"""Speculative-decoding forward modes through the CPU compressed-KV backend, against dense attention.

A fake SGLang batch (the ForwardBatch / RadixAttention fields the backend reads) drives
`CompressedTorchNativeAttnBackend` in DECODE, TARGET_VERIFY (chain, and tree drafts with SGLang's custom mask)
and DRAFT_EXTEND_V2 over a real compressed pool. The oracle is dense softmax attention computed here with
torch SDPA over the cached prefix dequantized from the pool and the new tokens: at full precision in draft
extend (as in prefill), read back from the pool in target verify (as decode reads its current token). A chain
verify must also equal the sequential decode steps it stands for, which a verify attending to its drafts at
full precision does not.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from sglang_ext import compat
from sglang_ext.kvcache.formats import KV_CACHE_DTYPES
from sglang_ext.kvcache.pool import CompressedMHATokenToKVPool
from sglang_ext.kvcache.torch_backend import CompressedTorchNativeAttnBackend
from sglang_ext.kvformats import get_format

H_KV, GROUP, DIM, SIZE, REQ_WIDTH = 3, 3, 64, 700, 120
SCALE = DIM**-0.5


def make_backend(name: str, gen: torch.Generator):
    pool = CompressedMHATokenToKVPool(
        SIZE, page_size=1, dtype=torch.float32, head_num=H_KV, head_dim=DIM, layer_num=1, device="cpu",
        enable_memory_saver=False, v_head_dim=DIM, start_layer=0, end_layer=0, enable_alt_stream=False,
        enable_kv_cache_copy=True, kv_format=get_format(name, DIM, DIM),
    )  # fmt: skip
    # 5 request rows of shuffled slots, so sequences interleave in the pool.
    req_to_token = (torch.randperm(SIZE, generator=gen)[: 5 * REQ_WIDTH] + 1).view(5, REQ_WIDTH)
    runner = SimpleNamespace(
        device="cpu", req_to_token_pool=SimpleNamespace(req_to_token=req_to_token), token_to_kv_pool=pool
    )
    return CompressedTorchNativeAttnBackend(runner), pool, req_to_token


LAYER = SimpleNamespace(
    layer_id=0, tp_q_head_num=H_KV * GROUP, tp_k_head_num=H_KV, tp_v_head_num=H_KV, qk_head_dim=DIM, v_head_dim=DIM,
    scaling=SCALE, logit_cap=0.0, logit_capping_method=None, is_cross_attention=False,
    attn_type=None, sliding_window_size=None,
)  # fmt: skip


def fill_prefix(pool, req_to_token, reqs, lens, gen):
    slots = torch.cat([req_to_token[r, :n] for r, n in zip(reqs, lens, strict=True)])
    k = torch.randn(slots.numel(), H_KV, DIM, generator=gen)
    v = torch.randn(slots.numel(), H_KV, DIM, generator=gen)
    pool.set_kv_buffer(LAYER, slots, k, v)


def dense_attention(pool, slots, q, k_new, v_new, mask):
    """q [M, Hq, D]; keys = dequantized pool rows at slots, then k_new; mask [M, L + M] bool (True = attend)."""
    fmt = pool.kv_format
    kp, vp = fmt.dequantize({n: t[slots] for n, t in pool.layer_planes(0).items()})
    k = torch.cat([kp, k_new.float()]).transpose(0, 1)  # [Hkv, S, D]
    v = torch.cat([vp, v_new.float()]).transpose(0, 1)
    o = F.scaled_dot_product_attention(
        q.float().transpose(0, 1), k, v, attn_mask=mask[None], scale=SCALE, enable_gqa=True
    )  # fmt: skip
    return o.transpose(0, 1)


def tree_block(lp, num_draft, gen) -> torch.Tensor:
    """Verify mask of one request: prefix visible, each draft sees itself and its ancestors in a random tree."""
    parent = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, num_draft)]
    block = torch.zeros(num_draft, lp + num_draft, dtype=torch.bool)
    block[:, :lp] = True
    for i in range(num_draft):
        j = i
        while j >= 0:
            block[i, lp + j] = True
            j = parent[j]
    return block


def run_new_tokens(backend, pool, req_to_token, mode, reqs, prefix_lens, num_new, gen, tree=False):
    """One forward_extend call in `mode` with num_new new tokens per request; returns (output, expected)."""
    fill_prefix(pool, req_to_token, reqs, prefix_lens, gen)
    t = num_new * len(reqs)
    q = torch.randn(t, H_KV * GROUP, DIM, generator=gen)
    k = torch.randn(t, H_KV, DIM, generator=gen)
    v = torch.randn(t, H_KV, DIM, generator=gen)
    out_loc = torch.cat([req_to_token[r, n : n + num_new] for r, n in zip(reqs, prefix_lens, strict=True)])
    causal = [torch.cat([torch.ones(num_new, lp, dtype=torch.bool), torch.ones(num_new, num_new).tril().bool()], 1)
              for lp in prefix_lens]  # fmt: skip
    blocks = [tree_block(lp, num_new, gen) for lp in prefix_lens] if tree else causal
    # verify reads its drafts from the pool (stored first); every other mode attends to them as computed
    from_pool = mode == compat.ForwardMode.TARGET_VERIFY
    lens = torch.tensor(prefix_lens)
    fb = SimpleNamespace(
        forward_mode=mode, req_pool_indices=torch.tensor(reqs), out_cache_loc=out_loc,
        seq_lens=lens, seq_lens_cpu=lens,
        extend_prefix_lens=lens, extend_prefix_lens_cpu=prefix_lens,
        extend_seq_lens=torch.full((len(reqs),), num_new), extend_seq_lens_cpu=[num_new] * len(reqs),
        spec_info=SimpleNamespace(num_tokens_per_req=num_new,
                                  custom_mask=torch.cat([b.flatten() for b in blocks]) if tree else None),
    )  # fmt: skip
    backend.init_forward_metadata(fb)
    o = backend.forward_extend(q.view(t, -1), k.view(t, -1), v.view(t, -1), LAYER, fb).view(t, H_KV * GROUP, DIM)
    expected = []
    for i, (r, lp) in enumerate(zip(reqs, prefix_lens, strict=True)):
        rows = slice(i * num_new, (i + 1) * num_new)
        if from_pool:
            slots, empty = torch.cat([req_to_token[r, :lp], out_loc[rows]]), torch.zeros(0, H_KV, DIM)
            expected.append(dense_attention(pool, slots, q[rows], empty, empty, blocks[i]))
        else:
            expected.append(dense_attention(pool, req_to_token[r, :lp], q[rows], k[rows], v[rows], blocks[i]))
    stored = pool.kv_format.quantize(k, v)
    for n, plane in pool.layer_planes(0).items():
        assert torch.equal(plane[out_loc], stored[n]), f"new tokens' plane {n} not stored at out_cache_loc"
    return o, torch.cat(expected), causal


@pytest.fixture(autouse=True)
def decoder_layer():
    LAYER.attn_type = compat.AttentionType.DECODER


@pytest.mark.parametrize("name", KV_CACHE_DTYPES)
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_target_verify_equals_dense_attention(name, tree):
    gen = torch.Generator().manual_seed(7)
    backend, pool, req_to_token = make_backend(name, gen)
    o, expected, _ = run_new_tokens(
        backend, pool, req_to_token, compat.ForwardMode.TARGET_VERIFY, [3, 0, 4], [50, 7, 101], 8, gen, tree=tree
    )
    err = float((o - expected).abs().max())
    assert err < 1e-4, f"{name} verify ({'tree' if tree else 'chain'}): max |backend - dense| {err:.2e}"


@pytest.mark.parametrize("name", ["int8", "octave_k3v4"])
def test_draft_extend_v2_equals_dense_attention(name, monkeypatch):
    # The "full" extend mode, whose draft tokens attend to their own K/V as computed (dense_attention's new rows);
    # the default "pool" mode reads them back through the format, as target verify does.
    from sglang_ext.kvcache import torch_backend

    monkeypatch.setattr(torch_backend, "extend_reads_pool", lambda: False)
    gen = torch.Generator().manual_seed(8)
    backend, pool, req_to_token = make_backend(name, gen)
    o, expected, _ = run_new_tokens(
        backend, pool, req_to_token, compat.ForwardMode.DRAFT_EXTEND_V2, [1, 2], [33, 64], 4, gen
    )
    err = float((o - expected).abs().max())
    assert err < 1e-4, f"{name} draft extend: max |backend - dense| {err:.2e}"


@pytest.mark.parametrize("name", ["int8", "octave_k3v3"])
def test_decode_batch_equals_dense_attention(name):
    gen = torch.Generator().manual_seed(9)
    backend, pool, req_to_token = make_backend(name, gen)
    reqs, seq_lens = [4, 1, 0, 2], [9, 118, 1, 60]
    fill_prefix(pool, req_to_token, reqs, [n - 1 for n in seq_lens], gen)
    q = torch.randn(len(reqs), H_KV * GROUP, DIM, generator=gen)
    k = torch.randn(len(reqs), H_KV, DIM, generator=gen)
    v = torch.randn(len(reqs), H_KV, DIM, generator=gen)
    lens = torch.tensor(seq_lens)
    out_loc = torch.stack([req_to_token[r, n - 1] for r, n in zip(reqs, seq_lens, strict=True)])
    fb = SimpleNamespace(forward_mode=compat.ForwardMode.DECODE, req_pool_indices=torch.tensor(reqs),
                         seq_lens=lens, seq_lens_cpu=lens, out_cache_loc=out_loc)  # fmt: skip
    backend.init_forward_metadata(fb)
    o = backend.forward_decode(q.view(len(reqs), -1), k.view(len(reqs), -1), v.view(len(reqs), -1), LAYER, fb)
    o = o.view(len(reqs), H_KV * GROUP, DIM)
    for i, (r, n) in enumerate(zip(reqs, seq_lens, strict=True)):
        # The new token was stored first and is read back from the pool like every other key.
        empty = torch.zeros(0, H_KV, DIM)
        sees_all = torch.ones(1, n, dtype=torch.bool)
        want = dense_attention(pool, req_to_token[r, :n], q[i : i + 1], empty, empty, sees_all)
        err = float((o[i] - want[0]).abs().max())
        assert err < 1e-4, f"{name} decode request {i} (len {n}): max |backend - dense| {err:.2e}"


def chain_verify_and_decode(name: str, seed: int) -> SimpleNamespace:
    """One chain verify of 4 drafts for 3 requests of different prefix lengths, and the 4 decode steps it
    replaces (each stores its token, then attends through the pool, all 3 requests together): both outputs,
    and the inputs for further checks."""
    gen = torch.Generator().manual_seed(seed)
    backend, pool, req_to_token = make_backend(name, gen)
    reqs, prefix_lens, n = [3, 0, 4], [50, 7, 101], 4
    fill_prefix(pool, req_to_token, reqs, prefix_lens, gen)
    t = n * len(reqs)
    q = torch.randn(t, H_KV * GROUP, DIM, generator=gen)
    k = torch.randn(t, H_KV, DIM, generator=gen)
    v = torch.randn(t, H_KV, DIM, generator=gen)
    lens = torch.tensor(prefix_lens)
    out_loc = torch.cat([req_to_token[r, lp : lp + n] for r, lp in zip(reqs, prefix_lens, strict=True)])
    fb = SimpleNamespace(forward_mode=compat.ForwardMode.TARGET_VERIFY, req_pool_indices=torch.tensor(reqs),
                         out_cache_loc=out_loc, seq_lens=lens, seq_lens_cpu=lens,
                         spec_info=SimpleNamespace(num_tokens_per_req=n, custom_mask=None))  # fmt: skip
    backend.init_forward_metadata(fb)
    verify = backend.forward_extend(q.view(t, -1), k.view(t, -1), v.view(t, -1), LAYER, fb).view(t, -1, DIM)
    decode = torch.empty_like(verify)
    for j in range(n):
        rows = torch.arange(len(reqs)) * n + j
        step_lens = lens + j + 1
        fb = SimpleNamespace(forward_mode=compat.ForwardMode.DECODE, req_pool_indices=torch.tensor(reqs),
                             seq_lens=step_lens, seq_lens_cpu=step_lens, out_cache_loc=out_loc[rows])  # fmt: skip
        backend.init_forward_metadata(fb)
        o = backend.forward_decode(q[rows].view(len(reqs), -1), k[rows].view(len(reqs), -1),
                                   v[rows].view(len(reqs), -1), LAYER, fb)  # fmt: skip
        decode[rows] = o.view(len(reqs), -1, DIM)
    return SimpleNamespace(verify=verify, decode=decode, pool=pool, req_to_token=req_to_token, reqs=reqs,
                           prefix_lens=prefix_lens, n=n, q=q, k=k, v=v)


@pytest.mark.parametrize("name", KV_CACHE_DTYPES)
def test_chain_verify_equals_sequential_decode(name):
    """A chain verify of n drafts gives, row by row, the outputs of the n decode steps it replaces (each stores
    its token, then attends through the pool), so greedy output with speculation equals output without."""
    r = chain_verify_and_decode(name, seed=10)
    verify, decode, pool, req_to_token, reqs, prefix_lens, n, q, k, v = (
        r.verify, r.decode, r.pool, r.req_to_token, r.reqs, r.prefix_lens, r.n, r.q, r.k, r.v)
    err = float((verify - decode).abs().max())
    assert err < 1e-5, f"{name}: chain verify vs sequential decode: max |diff| {err:.2e}"

    # The test can fail: attending to the drafts at full precision (as prefill does) moves the outputs by far more.
    full_precision = []
    for i, (r, lp) in enumerate(zip(reqs, prefix_lens, strict=True)):
        rows = slice(i * n, (i + 1) * n)
        mask = torch.cat([torch.ones(n, lp, dtype=torch.bool), torch.ones(n, n).tril().bool()], 1)
        full_precision.append(dense_attention(pool, req_to_token[r, :lp], q[rows], k[rows], v[rows], mask))
    gap = float((torch.cat(full_precision) - decode).abs().max())
    assert gap > 100 * max(err, 1e-7), f"{name}: full-precision drafts differ from decode by only {gap:.2e}"


@pytest.fixture
def batch_invariant_mode():
    from sglang_ext.platform import batch_invariant

    batch_invariant.enable()
    with batch_invariant.token_step(True):
        yield
    batch_invariant.disable()


@pytest.mark.parametrize("name", KV_CACHE_DTYPES)
def test_chain_verify_bitwise_equals_decode_in_batch_invariant_mode(name, batch_invariant_mode):
    """With `--enable-deterministic-inference` every verify row attends alone, as a batch-1 decode step of that
    token: the outputs are bitwise those of the decode steps, even when decode runs 3 requests of different lengths
    together (padded) and verify carries 4 drafts per request."""
    r = chain_verify_and_decode(name, seed=11)
    verify, decode = r.verify, r.decode
    differing = int((verify != decode).sum())
    assert differing == 0, f"{name}: {differing} verify outputs differ from decode's in the last bits"


@pytest.mark.parametrize("name", ["bf16", "int8", "octave_k3v4"])
def test_triton_backend_verify_takes_the_decode_kernel(name, monkeypatch):
    # The GPU backend's target verify, run here under the Triton interpreter with a fake self: a chain batch
    # (topk 1) and a tree batch (topk 2, SGLang's custom mask turned into the decode kernel's tree mask) go
    # through the decode kernel (plan_batch's plan, run_decode) with q_len tokens per request; a batch whose spec_info has no topk (NGRAM) through
    # the extend kernel with the custom mask. Each gives the reference's output for its mask.
    from sglang_ext import kernels
    from sglang_ext.kernels import decode as decode_mod
    from sglang_ext.kvcache import triton_backend
    from sglang_ext.kvformats import reference

    gen = torch.Generator().manual_seed(5)
    fmt = get_format(name, DIM, DIM)
    pool = CompressedMHATokenToKVPool(
        SIZE, page_size=1, dtype=torch.float32, head_num=H_KV, head_dim=DIM, layer_num=1, device="cpu",
        enable_memory_saver=False, v_head_dim=DIM, start_layer=0, end_layer=0, enable_alt_stream=False,
        enable_kv_cache_copy=True, kv_format=fmt,
    )  # fmt: skip
    prefix, n = [37, 0, 90], 4
    slots = torch.randperm(SIZE - 1, generator=gen)[: sum(prefix) + n * len(prefix)] + 1
    prefix_slots, draft_slots = slots[: sum(prefix)], slots[sum(prefix):]
    planes = pool.layer_planes(0)
    kernels.store_kv(fmt, planes, prefix_slots, torch.randn(sum(prefix), H_KV, DIM, generator=gen),
                     torch.randn(sum(prefix), H_KV, DIM, generator=gen))
    t = n * len(prefix)
    q = torch.randn(t, H_KV * GROUP * DIM, generator=gen)
    k, v = torch.randn(t, H_KV * DIM, generator=gen), torch.randn(t, H_KV * DIM, generator=gen)
    kv_indptr = torch.tensor([0, 37, 37, 127], dtype=torch.int32)
    qo_indptr = torch.arange(0, t + 1, n, dtype=torch.int32)
    chain = torch.ones(n, n, dtype=torch.bool).tril()
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)  # 1, 2 siblings

    def flat(drafts):  # SGLang's verify mask: per request [n, prefix + n], the prefix all visible
        return torch.cat([torch.cat([torch.ones(n, lp, dtype=torch.bool), drafts], 1).reshape(-1) for lp in prefix])
    mask_indptr = torch.tensor([0] + torch.tensor([n * (lp + n) for lp in prefix]).cumsum(0).tolist(), dtype=torch.int32)
    kernels.store_kv(fmt, planes, draft_slots, k.view(t, H_KV, DIM), v.view(t, H_KV, DIM))  # as verify will
    refs = {id(m): reference.extend_attention(fmt, q.view(t, -1, DIM), None, None, planes, qo_indptr, kv_indptr,
                                              prefix_slots, SCALE, custom_mask=flat(m), mask_indptr=mask_indptr,
                                              new_slots=draft_slots) for m in (chain, tree)}
    assert (refs[id(chain)] - refs[id(tree)]).abs().max() > 1e-3, "the tree equals the chain: the test could not fail"
    calls = []
    real_run = decode_mod.run_decode
    monkeypatch.setattr(decode_mod, "run_decode", lambda plan, *a, **kw: calls.append(plan.q_len) or real_run(plan, *a, **kw))
    for topk, drafts, expect in ((1, chain, [n]), (2, tree, [n]), (None, tree, [])):
        backend = object.__new__(triton_backend.CompressedTritonAttnBackend)
        backend.kv_pool, backend.kv_format, backend._checked_layers = pool, fmt, {0}
        backend.max_kv_splits, backend.page_size, backend._tree = 4, 1, None
        backend.num_head, backend.num_kv_head, backend._q_dtype = H_KV * GROUP, H_KV, torch.float32
        backend._store = lambda layer, fb, k3, v3: kernels.store_kv(fmt, planes, fb.out_cache_loc, k3, v3)
        backend.forward_metadata = SimpleNamespace(kv_indptr=kv_indptr, kv_indices=prefix_slots, qo_indptr=qo_indptr,
                                                   custom_mask=flat(drafts), mask_indptr=mask_indptr, max_extend_len=n)
        spec = SimpleNamespace(draft_token_num=n, num_tokens_per_req=-1)
        if topk is not None:
            spec.topk = topk
        batch = SimpleNamespace(forward_mode=compat.ForwardMode.TARGET_VERIFY, out_cache_loc=draft_slots,
                                spec_info=spec, batch_size=len(prefix))
        backend._decode_plan = backend.plan_batch(batch, sum(prefix))
        backend._extend_plan = None  # the extend launcher plans from kv_indptr itself
        calls.clear()
        o = backend.forward_extend(q, k, v, LAYER, batch)
        assert calls == expect, (topk, calls)
        err = (o.view(t, -1, DIM) - refs[id(drafts)]).abs().max().item()
        assert err < 1e-4, f"{name} topk {topk}: verify differs from the reference by {err}"
