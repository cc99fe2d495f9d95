"""qwen4_exp's QSA sparse attention over a compressed KV pool on a GPU: the format-aware packers
(sglang_ext/kernels/qsa_gather.py) against SGLang's own packers run on the dense K/V the pool stands for (the
format's reference dequantization, octave's un-rotated: `fmt.dequantize`), under the Triton interpreter (CPU
tensors), at qwen4_exp's shapes (2 KV heads of head_dim 256) and a 128-dim one; plus their ahead-of-time compile
for sm_86, sm_90 and gfx1100. Equal, not close: the octave kernels un-rotate with the reference's own
butterfly order, and both sides cast the same float32 values to the buffers' dtype. The octave cases use fewer
rows (the interpreter runs their 7-d butterflies slowly)."""

import os
import subprocess
import sys

import pytest
import torch

from sglang_ext.kernels import store_kv
from sglang_ext.kernels.qsa_gather import gather_selected_kv, pack_prefill_kv
from sglang_ext.kvformats import get_format

HEADS = 2


def _pool(name, head_dim, slots, seed):
    """Random K/V quantized into `slots` slots of a layer; returns (fmt, planes, dense k, dense v) where the dense
    tensors are the stored values dequantized (float32, what every reader must see)."""
    fmt = get_format(name, head_dim, 64 if head_dim == 256 else None)
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(slots, HEADS, head_dim, generator=g) * 3
    v = torch.randn(slots, HEADS, head_dim, generator=g)
    # the reference quantizer: the store kernel's planes bit for bit (tests/kernels/test_store_dequant.py), without
    # its interpreter time
    planes = fmt.quantize(k.bfloat16(), v.bfloat16())
    kd, vd = fmt.dequantize(planes)  # octave: dequantized in the rotated basis, then rotation.unrotate
    if fmt.rotated:  # the packers must not hand out the rotated-basis values
        kr, vr = fmt.dequantize_rotated_kv(planes)
        assert (kr - kd).abs().max() > 0.1 and (vr - vd).abs().max() > 0.1
    return fmt, planes, kd.float(), vd.float()


def _requests(g, batch, slots, max_len, req_pool=6):
    """req_to_token [req_pool, max_len] of distinct random slots; per row a request and a length."""
    req_to_token = torch.randperm(slots, generator=g)[:req_pool * max_len].reshape(req_pool, max_len).to(torch.int32)
    req_indices = torch.randperm(req_pool, generator=g)[:batch].to(torch.int64)
    seq_lens = torch.randint(1, max_len + 1, (batch,), generator=g, dtype=torch.int32)
    seq_lens[0] = max_len
    if batch > 2:
        seq_lens[2] = min(int(seq_lens[2]), 6)  # shorter than the top-k: room for an out-of-context position
    return req_to_token, req_indices, seq_lens


def _selection(g, seq_lens, topk):
    """indices [batch, topk]: distinct positions < length first, then -1; one row selects nothing and one has a
    position past its length (the gather must skip it)."""
    batch = seq_lens.numel()
    indices = torch.full((batch, topk), -1, dtype=torch.int32)
    for b in range(batch):
        n = min(int(seq_lens[b]), topk, int(torch.randint(0, topk + 1, (1,), generator=g)))
        if b == 1:
            n = 0
        indices[b, :n] = torch.randperm(int(seq_lens[b]), generator=g)[:n].to(torch.int32)
    indices[2, 0] = int(seq_lens[2]) + 1  # outside the row's context
    return indices


# (format, head_dim, batch, top-k, zero fill): octave with fewer rows (one column block per row), each format compact
# at one head_dim and page-strided at the other
GATHER_CASES = [("int8", d, 5, 21, zero_fill) for d in (256, 128) for zero_fill in (False, True)] + [
    ("octave_k3v4", 256, 3, 12, False), ("octave_k3v4", 128, 3, 12, True), ("octave_k3v3", 256, 3, 12, True),
    ("octave_k3v3", 128, 3, 12, False)]


@pytest.mark.parametrize("name, head_dim, batch, topk, zero_fill", GATHER_CASES)
def test_decode_gather_equals_sglang_on_dequantized_pool(name, head_dim, batch, topk, zero_fill):
    from sglang.srt.layers.attention.qsa.sparse_attn import (
        qwen_sparse_fa2_cu_seqlens_triton,
        qwen_sparse_kv_extraction_compact_triton,
    )

    fmt, planes, kd, vd = _pool(name, head_dim, 400, seed=head_dim + zero_fill)
    g = torch.Generator().manual_seed(11)
    req_to_token, req_indices, seq_lens = _requests(g, batch, 400, 40)
    indices = _selection(g, seq_lens, topk)
    if zero_fill:  # the page-strided layout (FlashInfer paged decode): row b at b * stride
        stride = -(-topk // 16) * 16  # page-aligned, past the top-k: zeros after the valid columns
        cu_k = torch.arange(0, (batch + 1) * stride, stride, dtype=torch.int32)
        rows = batch * stride
    else:  # compact: SGLang's own counts / prefix sum
        counts = torch.empty(batch, dtype=torch.int32)
        cu_k = torch.empty(batch + 1, dtype=torch.int32)
        qwen_sparse_fa2_cu_seqlens_triton(seq_lens, indices, counts, cu_k, batch, topk)
        assert int(cu_k[-1]) > 0 and counts[1] == 0
        rows, stride = batch * topk, 0
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        want_k = torch.full((rows, HEADS, head_dim), -1000.0, dtype=dtype)  # no stored value
        want_v, got_k, got_v = want_k.clone(), want_k.clone(), want_k.clone()
        qwen_sparse_kv_extraction_compact_triton(kd, vd, req_to_token, req_indices, indices, seq_lens, cu_k, want_k,
                                                 want_v, batch, topk, zero_fill_cols=stride)
        gather_selected_kv(fmt, planes, req_to_token, req_indices, indices, seq_lens, cu_k, got_k, got_v, batch,
                           topk, zero_fill_cols=stride)
        assert (want_k != -1000).any() and (want_k == -1000).any() != zero_fill  # what it writes and skips
        assert torch.equal(got_k, want_k), f"{dtype}: K differs in {(got_k != want_k).sum().item()} values"
        assert torch.equal(got_v, want_v), f"{dtype}: V differs in {(got_v != want_v).sum().item()} values"


@pytest.mark.parametrize("name, head_dim, batch, max_len, dtypes", [
    ("int8", 256, 4, 30, (torch.bfloat16, torch.float32)), ("int8", 128, 4, 30, (torch.bfloat16, torch.float32)),
    ("octave_k3v4", 256, 3, 12, (torch.bfloat16,)), ("octave_k3v3", 256, 3, 12, (torch.float16,)),
    ("octave_k3v3", 128, 3, 12, (torch.float32,))])
def test_prefill_pack_equals_sglang_on_dequantized_pool(name, head_dim, batch, max_len, dtypes):
    from sglang.srt.layers.attention.qsa.sparse_attn import pack_qsa_prefill_kv

    fmt, planes, kd, vd = _pool(name, head_dim, 300, seed=3 + head_dim)
    g = torch.Generator().manual_seed(5)
    req_to_token, req_indices, seq_lens = _requests(g, batch, 300, max_len, req_pool=5)
    cu_k = torch.nn.functional.pad(seq_lens.cumsum(0), (1, 0)).to(torch.int32)
    total, longest = int(seq_lens.sum()), int(seq_lens.max())
    for dtype in dtypes:
        want_k, want_v = pack_qsa_prefill_kv(k=kd, v=vd, req_to_token=req_to_token, req_indices=req_indices,
                                             cu_k=cu_k, total_k=total, max_k=longest, output_dtype=dtype)
        got_k, got_v = pack_prefill_kv(fmt, planes, req_to_token, req_indices, cu_k, total, dtype)
        assert got_k.dtype == dtype and got_k.shape == want_k.shape == (total, HEADS, head_dim)
        assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v), dtype


def test_gathers_compile_for_sm86_sm90_gfx1100():
    """Every int8 variant and one octave gather and pack (the 7-d un-rotating kernels: slow to compile; the full
    set, for sm_80 too, is `python -m sglang_ext.kernels.targets --only qsa_gather`)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-m", "sglang_ext.kernels.targets", "--group", "sglang-ext", "--only",
                          "qsa_gather selected int8", "--only", "qsa_gather prefill int8", "--only",
                          "qsa_gather selected octave_k3v3 d128 zero_fill", "--only", "qsa_gather prefill octave_k3v3 d128",
                          "--target", "cuda:86", "--target", "cuda:90", "--target", "hip:gfx1100"],
                         env=env, capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "qsa_gather selected int8 d256 zero_fill" in out.stdout, out.stdout
    assert "qsa_gather prefill octave_k3v3 d128" in out.stdout, out.stdout
    assert "24 compiled, 0 failed" in out.stdout, out.stdout  # 8 variants x 3 targets


class _FakePool:
    """What the hooks use of a compressed pool (hybrid_pool.HybridCompressedPool): the format and a layer's
    planes; set_kv_buffer stores like the pool does."""

    def __init__(self, fmt, planes):
        self.kv_format, self.planes, self.stored = fmt, planes, 0

    def layer_planes(self, layer_id):
        assert layer_id == 3
        return self.planes

    def set_kv_buffer(self, layer, loc, k, v):
        self.stored += 1
        heads = layer.tp_k_head_num
        store_kv(self.kv_format, self.planes, loc, k.reshape(-1, heads, self.kv_format.head_dim)[:loc.numel()],
                 v.reshape(-1, heads, self.kv_format.head_dim)[:loc.numel()])


def test_hooks_send_compressed_layers_to_the_packers_and_dense_ones_to_sglang():
    from sglang_ext.hybrid.ops.qsa_sparse import QuantizedKVPlanes
    from sglang_ext.hybrid.qsa import qsa_kv_extraction, qsa_pack_prefill_kv

    fmt, planes, kd, vd = _pool("int8", 128, 64, seed=9)
    layer = QuantizedKVPlanes(fmt, planes)
    assert layer.shape == (64, HEADS, 128) and layer.dtype == torch.int8 and layer.device == kd.device
    req_to_token = torch.arange(64, dtype=torch.int32).reshape(2, 32)
    req_indices, seq_lens = torch.tensor([1, 0]), torch.tensor([32, 5], dtype=torch.int32)
    indices = torch.tensor([[31, 0, 7, -1], [4, 2, -1, -1]], dtype=torch.int32)
    cu_k = torch.tensor([0, 3, 5], dtype=torch.int32)
    calls = []

    def sglang_kernel(*args, **kwargs):
        calls.append(args)

    out_k, out_v = torch.zeros(8, HEADS, 128), torch.zeros(8, HEADS, 128)
    qsa_kv_extraction(sglang_kernel, layer, layer, req_to_token, req_indices, indices, seq_lens, cu_k, out_k, out_v, 2, 4)
    assert not calls
    assert torch.equal(out_k[:5], kd[[63, 32, 39, 4, 2]]) and torch.equal(out_v[:5], vd[[63, 32, 39, 4, 2]])
    qsa_kv_extraction(sglang_kernel, kd, vd, req_to_token, req_indices, indices, seq_lens, cu_k, out_k, out_v, 2, 4)
    assert len(calls) == 1 and calls[0][0] is kd
    with pytest.raises(ValueError, match="passed as both"):
        qsa_kv_extraction(sglang_kernel, layer, vd, req_to_token, req_indices, indices, seq_lens, cu_k, out_k, out_v,
                          2, 4)
    packed_k, packed_v = qsa_pack_prefill_kv(
        sglang_kernel, k=layer, v=layer, req_to_token=req_to_token, req_indices=req_indices,
        cu_k=torch.tensor([0, 32, 37], dtype=torch.int32), total_k=37, max_k=32, output_dtype=torch.float32)
    assert torch.equal(packed_k, torch.cat([kd[32:64], kd[:5]])) and torch.equal(packed_v, torch.cat([vd[32:64], vd[:5]]))


@pytest.mark.parametrize("name", ["int8", "octave_k3v4"])
def test_extend_hook_stores_then_attends_over_the_stored_values(monkeypatch, name):
    """The no-prefix extend attends over the K/V it is handed: the hook stores the new rows itself and hands SGLang
    their dequantized values (octave: un-rotated; rows past out_cache_loc, DP padding, as they came), with
    save_kv_cache=False."""
    from types import SimpleNamespace

    from sglang_ext.hybrid import qsa
    from sglang_ext.kvcache import hybrid_pool

    fmt = get_format(name, 128)
    pool = _FakePool(fmt, fmt.allocate(40, HEADS, "cpu"))
    monkeypatch.setattr(hybrid_pool, "compressed_pool_of", lambda p: p if isinstance(p, _FakePool) else None)
    g = torch.Generator().manual_seed(2)
    # float32 model dtype: the interpreter's float32 -> bf16 store rounds unlike torch, float32 is exact
    k = torch.randn(7, HEADS * 128, generator=g)
    v = torch.randn(7, HEADS * 128, generator=g)
    loc = torch.tensor([5, 9, 1, 30, 22], dtype=torch.int64)
    layer = SimpleNamespace(layer_id=3, tp_k_head_num=HEADS)
    batch = SimpleNamespace(out_cache_loc=loc, attn_cp_metadata=None)
    q = SimpleNamespace(is_cuda=True)
    seen = []

    def sglang_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, topk_indices=None, **kwargs):
        seen.append((k, v, save_kv_cache, topk_indices, kwargs))
        return "out"

    backend = SimpleNamespace(token_to_kv_pool=pool)
    assert qsa.qsa_forward_extend(sglang_extend, backend, q, k, v, layer, batch, topk_indices="idx", extra=1) == "out"
    got_k, got_v, save, idx, kwargs = seen[0]
    assert pool.stored == 1 and save is False and idx == "idx" and kwargs == {"extra": 1}
    kd, vd = fmt.dequantize({n: t[loc] for n, t in pool.planes.items()})
    assert got_k.shape == k.shape and got_k.dtype == k.dtype
    assert torch.equal(got_k[:5], kd.reshape(5, -1)) and torch.equal(got_v[:5], vd.reshape(5, -1))
    assert not torch.equal(got_k[:5], k[:5])  # the stored values, not the fresh ones
    assert torch.equal(got_k[5:], k[5:]) and torch.equal(got_v[5:], v[5:])
    # a dense pool, or no store requested: SGLang's extend as it was called
    backend.token_to_kv_pool = object()
    qsa.qsa_forward_extend(sglang_extend, backend, q, k, v, layer, batch, topk_indices="idx")
    assert seen[-1][0] is k and seen[-1][2] is True and pool.stored == 1
    batch.attn_cp_metadata = object()
    backend.token_to_kv_pool = pool
    with pytest.raises(NotImplementedError, match="context parallelism"):
        qsa.qsa_forward_extend(sglang_extend, backend, q, k, v, layer, batch, topk_indices="idx")
