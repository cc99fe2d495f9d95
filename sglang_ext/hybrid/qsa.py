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
rows each query selected. SGLang's CUDA paths (Triton / TRT-LLM sparse kernels) read dense K/V and are not
covered: support.py refuses the combination off the CPU platform. A GPU path would need format-aware versions of
the decode/verify gather (`qwen_sparse_kv_extraction_compact_triton`: selected slots -> packed K/V in the model
dtype) and of the prefix-extend pack (`pack_qsa_prefill_kv`), and the no-prefix extend to read the stored bytes
instead of the fresh K/V, so that every reader sees the format's values.
"""

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
