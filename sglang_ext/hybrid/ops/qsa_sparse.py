"""Torch ops of qwen4_exp's QSA (indexed sparse attention) path, batched over rows (core: no SGLang import).

SGLang's non-CUDA paths for these two steps loop over query rows in Python: one `torch.topk` per row for the
block selection, one gather + softmax per row for the attention. These take the same arguments and return the
same values, with the rows batched (the attention in row chunks of bounded memory).

    ragged_topk(logits, row_starts, row_ends, topk)            stands in for qsa.kernel.qsa_fast_topk
    sparse_gqa_attention(q, k_cache, v_cache, token_slots, softmax_scale)
                                                              stands in for qsa.kernel.qsa_sparse_attention

The attention reads the full-attention K/V the pool hands it (`get_key_buffer` / `get_value_buffer`): dense
tensors, or, for a compressed KV format, one `QuantizedKVPlanes` for both (hybrid/qsa.py), whose selected rows
are gathered and dequantized here, never the whole layer.

One step has no CPU path in SGLang at all (a Triton kernel on every device):

    gather_compressed_keys(compressed, token_slot_table, cu_blocks, total_blocks, max_blocks, compress_ratio)
                                                              stands in for qsa.kernel.gather_qsa_compressed_keys
"""

from __future__ import annotations

import torch

from sglang_ext.kvformats.base import KVFormat

# Bytes of gathered keys + values (compute dtype) per attention chunk.
_CHUNK_BYTES = 64 << 20


def ragged_topk(logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor, topk: int) -> torch.Tensor:
    """Top-`topk` columns of each row's section `logits[r, row_starts[r]:row_ends[r]]`.

    logits: [rows, width] float; row_starts, row_ends: [rows] integers with 0 <= start <= end <= width.
    Returns [rows, topk] int32: column indices relative to the row's start, highest score first; a row with fewer
    than `topk` columns is padded with -1 after its min(topk, length) entries. Columns outside a row's section
    are never selected, whatever their value (-inf inside the section included).
    """
    rows, width = logits.shape
    out = torch.full((rows, topk), -1, dtype=torch.int32, device=logits.device)
    if rows == 0 or width == 0 or topk == 0:
        return out
    starts = row_starts.to(device=logits.device, dtype=torch.long).reshape(rows, 1)
    ends = row_ends.to(device=logits.device, dtype=torch.long).reshape(rows, 1)
    columns = torch.arange(width, device=logits.device).reshape(1, width)
    inside = (columns >= starts) & (columns < ends)
    scores = logits.float() if logits.dtype != torch.float64 else logits
    # Inside the section every value outranks every column outside it, -inf included.
    scores = torch.where(inside, scores.clamp_min(torch.finfo(scores.dtype).min), float("-inf"))
    k = min(topk, width)
    picked = scores.topk(k, dim=1).indices  # [rows, k], descending
    taken = torch.arange(k, device=logits.device).reshape(1, k) < (ends - starts).clamp(0, k)
    out[:, :k] = torch.where(taken, picked - starts, -1).to(torch.int32)
    return out


class QuantizedKVPlanes:
    """One layer's K/V stored in a compressed KV format: the format and its planes {name: [slots, kv_heads, *tail]}.

    Stands where a dense [slots, kv_heads, head_dim] K or V buffer would: `gather(slots)` dequantizes only the
    rows a batch selected, K and V together.
    """

    def __init__(self, kv_format: KVFormat, planes: dict[str, torch.Tensor]):
        self.kv_format = kv_format
        self.planes = planes
        first = next(iter(planes.values()))
        self.shape = (first.shape[0], first.shape[1], kv_format.head_dim)  # what a dense buffer's shape would be
        self.ndim = 3
        self.device = first.device
        self.dtype = first.dtype  # the stored codes' (SGLang's GPU path compares it with fp8 to pick its scratch)

    def gather(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """slots [*S] (valid indices) -> (k, v) float32 [*S, kv_heads, head_dim], unrotated."""
        flat = slots.reshape(-1)
        k, v = self.kv_format.dequantize({name: plane[flat] for name, plane in self.planes.items()})
        return k.reshape(*slots.shape, *k.shape[1:]), v.reshape(*slots.shape, *v.shape[1:])


def sparse_gqa_attention(q: torch.Tensor, k_cache, v_cache, token_slots: torch.Tensor,
                         softmax_scale: float | None = None) -> torch.Tensor:
    """Softmax attention of each query row over the KV slots it selected.

    q: [rows, q_heads, head_dim]; k_cache, v_cache: [slots, kv_heads, head_dim] (query head h reads kv head
    h // (q_heads // kv_heads)), or a layer's `QuantizedKVPlanes` passed as both (the selected rows are dequantized);
    token_slots: [rows, selected] physical slot indices, -1 = none.
    Returns [rows, q_heads, head_dim] in q's dtype; a row that selected nothing gets zeros. Arithmetic in float32
    (float64 for float64 inputs); scale `softmax_scale or head_dim ** -0.5`.
    """
    quantized = isinstance(k_cache, QuantizedKVPlanes)
    if quantized != isinstance(v_cache, QuantizedKVPlanes) or (quantized and v_cache.planes is not k_cache.planes):
        raise ValueError("a compressed KV layer reads K and V from one layer's QuantizedKVPlanes, passed as both caches")
    if q.ndim != 3 or k_cache.ndim != 3 or v_cache.ndim != 3:
        raise ValueError("q, k_cache and v_cache must be rank-3 tensors")
    if token_slots.ndim != 2 or token_slots.shape[0] != q.shape[0]:
        raise ValueError(f"token slots must be [query rows, selected], got {tuple(token_slots.shape)}")
    rows, q_heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    if q_heads % kv_heads or k_cache.shape[-1] != head_dim or v_cache.shape[-1] != head_dim:
        raise ValueError(f"q {tuple(q.shape)} does not fit k/v caches {tuple(k_cache.shape)}")
    group = q_heads // kv_heads
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = softmax_scale or head_dim**-0.5
    out = torch.zeros_like(q)
    width = token_slots.shape[1]
    step = max(1, _CHUNK_BYTES // max(1, 2 * width * kv_heads * head_dim * torch.finfo(compute).bits // 8))
    for start in range(0, rows, step):
        slots = token_slots[start:start + step].long()  # [r, width]
        valid = slots >= 0
        if quantized:
            keys, values = k_cache.gather(slots.clamp_min(0))
            keys, values = keys.to(compute), values.to(compute)
        else:
            keys = k_cache[slots.clamp_min(0)].to(compute)  # [r, width, kv_heads, head_dim]
            values = v_cache[slots.clamp_min(0)].to(compute)
        queries = q[start:start + step].to(compute).reshape(-1, kv_heads, group, head_dim)
        scores = torch.einsum("rhgd,rkhd->rhgk", queries, keys) * scale
        scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        probs = torch.where(valid.any(dim=1)[:, None, None, None], probs, 0.0)  # no slots: softmax gave NaN
        rows_out = torch.einsum("rhgk,rkhd->rhgd", probs, values)
        out[start:start + step] = rows_out.reshape(-1, q_heads, head_dim).to(q.dtype)
    return out


def gather_compressed_keys(compressed: torch.Tensor, token_slot_table: torch.Tensor, cu_blocks: torch.Tensor,
                           total_blocks: int, max_blocks: int, compress_ratio: int) -> torch.Tensor:
    """Every sequence's complete compressed index keys, packed in sequence order (a byte copy, any dtype).

    compressed: [compressed slots, kv_heads, dim], the pool's compressed-key buffer; a block's compressed slot is
    its first token's KV slot // compress_ratio. token_slot_table: [sequences, >= blocks * ratio] KV slots per
    sequence position. cu_blocks: [sequences + 1] prefix sums of complete blocks per sequence. Returns
    [total_blocks, kv_heads, dim]: row cu_blocks[s] + b is sequence s's block b. `max_blocks` (the largest
    count) only sized the Triton launch; it is checked here.
    """
    heads, dim = compressed.shape[1:]
    output = compressed.new_empty((total_blocks, heads, dim))
    if total_blocks == 0:
        return output
    cu = cu_blocks.to(device=compressed.device, dtype=torch.long)
    counts = cu[1:] - cu[:-1]
    if int(counts.max()) > max_blocks:
        raise ValueError(f"a sequence has {int(counts.max())} complete blocks, more than max_blocks {max_blocks}")
    sequence = torch.repeat_interleave(torch.arange(counts.numel(), device=cu.device), counts)
    rows = torch.arange(sequence.numel(), device=cu.device)
    block = rows - cu[:-1][sequence]
    keep = rows < total_blocks  # the kernel never writes past the host size
    first_slot = token_slot_table[sequence[keep], block[keep] * compress_ratio].long()
    output[rows[keep]] = compressed[first_slot // compress_ratio]
    return output
