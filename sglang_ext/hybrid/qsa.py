"""qwen4_exp's QSA indexer on the portable CPU platform.

SGLang's `QSAIndexer` is a fused op with `forward_cuda` and `forward_xpu` only. On an out-of-tree platform the
fused-op dispatch calls `forward_native`, which the class leaves unimplemented (NotImplementedError at the first
full-attention layer). Both of its forwards are `_forward_impl`, SGLang's platform-independent orchestration:
project q / k, keep the pending key group in the pool's ring, compress each completed group (mean, RMSNorm,
RoPE), score the compressed keys (relu(q . k) summed over index heads) and select the top blocks plus the
query's incomplete tail group. On tensors that are not CUDA each of those steps takes SGLang's torch path
(`torch_qsa_mqa_prefill` / `torch_qsa_mqa_decode`, a per-row `torch.topk`, `torch_expand_qsa_block_indices`),
so `forward_native` here is that orchestration. Prefill context parallelism (a CUDA-only feature) is refused.

Compressed KV (`--kv-cache-dtype int8|octave_k3v4|octave_k3v3`): SGLang's QSA pool (a `HybridLinearKVPool`)
holds the full-attention K/V in sglang-ext's compressed sub-pool; the indexer's own caches (pending key ring,
compressed index keys) stay SGLang's. The only readers of the full-attention K/V are the sparse attention's two
CPU paths, `qsa_sparse_attention(q, pool.get_key_buffer(l), pool.get_value_buffer(l), slots, scale)`; for a
compressed sub-pool both reads return the layer's planes (`QuantizedKVPlanes`) and the torch op dequantizes the
rows each query selected.

Off the CPU platform (all three formats) the same reads hand SGLang's GPU path the planes, and its three readers of
the full-attention K/V see the stored values as plain K/V (octave's un-rotated; SGLang's kernels take plain q):

- decode / verify: `qwen_sparse_kv_extraction_compact_triton` (selected slots -> packed K/V in the query dtype,
  compact or page-strided, inside CUDA graphs) becomes kernels/qsa_gather.py's `gather_selected_kv`;
- extend with a cached prefix: `pack_qsa_prefill_kv` (every context token -> packed K/V) becomes `pack_prefill_kv`;
- extend without one reads the fresh K/V: `QwenSparseAttnBackend.forward_extend` (AROUND) stores them first and
  passes the stored values, dequantized, in their place (with save_kv_cache=False: already stored).

Prefill context parallelism is refused there too.

HiCache host tier (`--enable-hierarchical-cache`) on the CPU platform: SGLang mirrors the indexer's compressed keys
in host RAM page by page (`QSAIndexerPoolHost`: one byte row per full-KV page and layer, moved with the full-KV
page of the same number) through sgl_kernel's kvcacheio ops, which exist on CUDA/HIP/XPU only. Its two moves are
replaced by torch row copies over the same rows (`qsa_indexer_host_backup` / `qsa_indexer_host_load`); the
full-attention K/V and the recurrent states go through the CPU platform's own host pools.
"""

import torch

from sglang_ext import compat
from sglang_ext.hybrid.ops.qsa_sparse import QuantizedKVPlanes


def qsa_indexer_forward_native(self, *args, **kwargs):
    """`QSAIndexer.forward_native` (SGLang declares it `(self, *args, **kwargs)`), called with `_forward_impl`'s
    arguments `(hidden_states, positions, forward_batch, indexer_metadata, cp_global_rope_positions=None)`.
    Returns the token indices each query row attends to, `[rows, budget + ratio - 1]` int32, -1 padded (SGLang's
    contract for its sparse-attention backend)."""
    if kwargs.get("cp_global_rope_positions") is not None or (len(args) > 4 and args[4] is not None):
        raise NotImplementedError("QSA indexer: prefill context parallelism needs CUDA; the CPU platform "
                                  "serves qwen4_exp without it")
    return getattr(self, compat.QSA_INDEXER_FORWARD_IMPL)(*args, **kwargs)


def qsa_pool_kv_read(original, self, layer_id, *args, **kwargs):
    """AROUND `QSATokenToKVPool.get_key_buffer` / `get_value_buffer`: a compressed full-attention sub-pool gives
    the layer's `QuantizedKVPlanes` (K and V read the same planes); a dense one SGLang's tensor."""
    from sglang_ext.kvcache.hybrid_pool import compressed_pool_of

    pool = compressed_pool_of(self)
    if pool is None:
        return original(self, layer_id, *args, **kwargs)
    return QuantizedKVPlanes(pool.kv_format, pool.layer_planes(layer_id))


def _planes_pair(k, v):
    if isinstance(k, QuantizedKVPlanes) or isinstance(v, QuantizedKVPlanes):
        if not (isinstance(k, QuantizedKVPlanes) and isinstance(v, QuantizedKVPlanes) and k.planes is v.planes):
            raise ValueError("a compressed KV layer reads K and V from one layer's QuantizedKVPlanes, passed as both")
        return k
    return None


def qsa_kv_extraction(original, k, v, req_to_token, req_indices, indices, seq_lens, cu_k, out_k, out_v, batch, topk,
                      zero_fill_cols=0):
    """AROUND `qwen_sparse_kv_extraction_compact_triton` (GPU): a compressed layer's planes are gathered and
    dequantized by `gather_selected_kv` (same contract); dense K/V go to SGLang's kernel."""
    layer = _planes_pair(k, v)
    if layer is None:
        return original(k, v, req_to_token, req_indices, indices, seq_lens, cu_k, out_k, out_v, batch, topk,
                        zero_fill_cols=zero_fill_cols)
    from sglang_ext.kernels.qsa_gather import gather_selected_kv

    return gather_selected_kv(layer.kv_format, layer.planes, req_to_token, req_indices, indices, seq_lens, cu_k,
                              out_k, out_v, batch, topk, zero_fill_cols=zero_fill_cols)


def qsa_pack_prefill_kv(original, *, k, v, req_to_token, req_indices, cu_k, total_k, max_k, output_dtype=None):
    """AROUND `pack_qsa_prefill_kv` (GPU): a compressed layer's contexts are dequantized by `pack_prefill_kv`
    into `output_dtype` (SGLang passes the query dtype); dense K/V go to SGLang's kernel."""
    layer = _planes_pair(k, v)
    if layer is None:
        return original(k=k, v=v, req_to_token=req_to_token, req_indices=req_indices, cu_k=cu_k, total_k=total_k,
                        max_k=max_k, output_dtype=output_dtype)
    if output_dtype is None:
        raise ValueError("pack_qsa_prefill_kv on a compressed KV layer needs output_dtype (the query dtype)")
    from sglang_ext.kernels.qsa_gather import pack_prefill_kv

    return pack_prefill_kv(layer.kv_format, layer.planes, req_to_token, req_indices, cu_k, total_k, output_dtype)


def stored_kv(pool, layer, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """The K / V just stored at `loc` (one row per entry; rows of k / v past loc's length, DP padding, are kept),
    dequantized (octave: un-rotated) into k's / v's shape and dtype."""
    from sglang_ext.kernels.qsa_gather import dequantize_plain

    fmt = pool.kv_format
    heads = layer.tp_k_head_num
    k3 = k.reshape(-1, heads, fmt.head_dim)
    v3 = v.reshape(-1, heads, fmt.head_dim)
    k_out = torch.empty(k3.shape, dtype=k.dtype, device=k.device)
    v_out = torch.empty(v3.shape, dtype=v.dtype, device=v.device)
    n = loc.numel()
    if k3.shape[0] < n or v3.shape[0] < n:
        raise ValueError(f"{n} cache locations for {k3.shape[0]} new K rows")
    if k3.shape[0] > n:
        k_out[n:], v_out[n:] = k3[n:], v3[n:]
    dequantize_plain(fmt, pool.layer_planes(layer.layer_id), loc, k_out[:n], v_out[:n])
    return k_out.view(k.shape), v_out.view(v.shape)


def qsa_forward_extend(original, self, q, k, v, layer, forward_batch, save_kv_cache=True, topk_indices=None,
                       **kwargs):
    """AROUND `QwenSparseAttnBackend.forward_extend` (GPU): with a compressed pool the new K/V are stored here and
    SGLang's extend gets their stored values (the no-prefix path attends over the K/V it is given, not the pool)."""
    from sglang_ext.kvcache.hybrid_pool import compressed_pool_of

    pool = compressed_pool_of(self.token_to_kv_pool)
    if pool is None or not save_kv_cache or k is None or v is None or not q.is_cuda:
        return original(self, q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache,
                        topk_indices=topk_indices, **kwargs)
    if getattr(forward_batch, "attn_cp_metadata", None) is not None:
        raise NotImplementedError(f"--kv-cache-dtype {pool.kv_format.name}: qwen4_exp's prefill context "
                                  "parallelism reads dense K/V; serve it without context parallelism")
    loc = forward_batch.out_cache_loc
    self.token_to_kv_pool.set_kv_buffer(layer, loc, k, v)
    k, v = stored_kv(pool, layer, loc, k, v)
    return original(self, q, k, v, layer, forward_batch, save_kv_cache=False, topk_indices=topk_indices, **kwargs)


_HOST_IO_BACKENDS = ("direct", "kernel")


def _host_layer(host_pool, layer_id: int) -> torch.Tensor:
    """One layer of the host mirror as [host pages, item bytes], whatever SGLang's layout."""
    if host_pool.layout == "layer_first":
        return host_pool.kv_buffer[layer_id]
    if host_pool.layout == "page_first":
        return host_pool.kv_buffer[:, layer_id, :]
    if host_pool.layout == "page_first_direct":
        return host_pool.kv_buffer[:, layer_id, 0, :]
    raise ValueError(f"--hicache-mem-layout {host_pool.layout!r}: the QSA indexer's host mirror on the CPU platform "
                     "supports layer_first, page_first, page_first_direct")


def _page_rows(host_pool, host_indices, device_indices, io_backend):
    """(host page rows, device page rows) of whole-page token slots, or None for an empty move (SGLang's checks)."""
    if io_backend not in _HOST_IO_BACKENDS:
        raise ValueError(f"--hicache-io-backend {io_backend!r}: the QSA indexer's host mirror on the CPU platform "
                         f"supports {', '.join(_HOST_IO_BACKENDS)} (both run torch row copies)")
    if not host_pool._has_transfer_indices(host_indices, device_indices):
        return None
    page = host_pool.slot_page_size
    if host_indices.numel() % page or device_indices.numel() % page:
        raise host_pool._unaligned_transfer_error(host_indices, device_indices)
    return (host_pool._to_page_indices(host_indices).to(torch.long),
            host_pool._to_page_indices(device_indices).to(torch.long))


def qsa_indexer_host_backup(self, device_pool, host_indices, device_indices, io_backend):
    """REPLACE `QSAIndexerPoolHost.backup_from_device_all_layer` on the CPU platform: every layer's device page
    rows are copied to the host rows (the kvcacheio ops' contract, as torch index copies)."""
    rows = _page_rows(self, host_indices, device_indices, io_backend)
    if rows is None:
        return
    host_rows, device_rows = rows
    for layer_id in range(self.layer_num):
        device = self.device_buffers[layer_id]
        _host_layer(self, layer_id)[host_rows] = device[device_rows.to(device.device)].to("cpu")


def qsa_indexer_host_load(self, device_pool, host_indices, device_indices, layer_id, io_backend, *, is_draft=False):
    """REPLACE `QSAIndexerPoolHost.load_to_device_per_layer` on the CPU platform: layer `layer_id`'s host page rows
    are copied to the device rows (SGLang's own method indexes its buffers by layer_id whatever is_draft says)."""
    rows = _page_rows(self, host_indices, device_indices, io_backend)
    if rows is None:
        return
    host_rows, device_rows = rows
    device = self.device_buffers[layer_id]
    device[device_rows.to(device.device)] = _host_layer(self, layer_id)[host_rows].to(device.device)
