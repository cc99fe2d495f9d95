"""CPU attention over a compressed pool: SGLang's torch_native backend with its pool reads replaced.

Per forward step `init_forward_metadata` lists the slots each sequence reads (a `BatchPlan`, padded into a
`PaddedBatch` for decode, target verify and draft extend); per layer the planes are gathered at those slots
only, dequantized and attended: for the whole batch in one call (`batched_attention`), or per request for
prefill chunks (the format's torch reference). Target verify takes SGLang's custom mask (tree drafts).
New extend tokens attend to their own K/V as computed (not the stored codes), the cached prefix is read back
from the pool, exactly as the Triton kernels do on GPU, so CPU runs measure what GPU serving computes; with
`SGLANG_EXT_KV_EXTEND_NEW_TOKENS=pool` (kvcache/new_token_reads.py) every extend stores its new tokens first
and reads them back through the format, so every reader of a token's K/V reads the same bytes.
Target verify always does the latter: its draft tokens are read back through the format, as decode reads its
current token, so that verify computes the logits sequential decode steps would (greedy output with
speculation = without).
"""

from __future__ import annotations

import torch

from sglang_ext import compat
from sglang_ext.kvcache.batch_plan import BatchPlan, plan_decode, plan_extend
from sglang_ext.kvcache.batched_attention import (
    PaddedBatch,
    batched_attention,
    one_query_batches,
    pad_batch,
    read_new_tokens_from_pool,
)
from sglang_ext.kvcache.hybrid_pool import compressed_pool_of
from sglang_ext.kvcache.new_token_reads import extend_reads_pool
from sglang_ext.kvformats import reference
from sglang_ext.platform import batch_invariant


def check_layer_supported(layer, fmt_name: str, backend: str) -> None:
    """Raise for attention features the compressed-KV kernels do not implement."""
    problems = []
    if layer.is_cross_attention or layer.attn_type != compat.AttentionType.DECODER:
        problems.append(f"attention type {layer.attn_type}")
    if layer.sliding_window_size is not None and layer.sliding_window_size > -1:
        problems.append(f"sliding window {layer.sliding_window_size}")
    if layer.logit_cap and layer.logit_cap > 0 and layer.logit_capping_method != "tanh":
        problems.append(f"logit capping method {layer.logit_capping_method!r}")
    if layer.qk_head_dim != layer.v_head_dim:
        problems.append(f"qk_head_dim {layer.qk_head_dim} != v_head_dim {layer.v_head_dim}")
    if problems:
        raise NotImplementedError(
            f"--kv-cache-dtype {fmt_name} with the {backend} backend supports causal decoder self-attention "
            f"only; layer {layer.layer_id} uses " + ", ".join(problems)
        )


def logit_cap_of(layer) -> float:
    """tanh soft-cap of the attention scores (0 = none), as the kernels and the reference take it."""
    return float(layer.logit_cap) if layer.logit_cap and layer.logit_cap > 0 else 0.0


def _host_list(host: list | torch.Tensor | None, device_tensor: torch.Tensor) -> list[int]:
    """A per-request length list, from SGLang's host copy when it made one."""
    if host is None:
        return device_tensor.tolist()
    return host.tolist() if isinstance(host, torch.Tensor) else list(host)


class CompressedTorchNativeAttnBackend(compat.TorchNativeAttnBackend):
    """torch_native for `CompressedMHATokenToKVPool` on any device: decode, extend (incl. mixed chunks), target verify
    (chain and tree drafts), draft extend. On a hybrid linear-attention model it is the full-attention backend
    SGLang's HybridLinearAttnBackend wraps, over the compressed sub-pool of its hybrid pool (kvcache/hybrid_pool.py)."""

    def __init__(self, model_runner):
        super().__init__(model_runner)
        pool = compressed_pool_of(self.token_to_kv_pool)
        if pool is None:
            raise TypeError(f"{type(self).__name__} needs a compressed KV pool, got {type(self.token_to_kv_pool).__name__}")
        self.kv_pool = pool
        self.kv_format = pool.kv_format
        self.plan: BatchPlan | None = None
        self.padded: PaddedBatch | None = None
        # batch-invariant mode: self.padded split into one batch per query, computed once per forward step
        self._one_query: list[tuple[int, PaddedBatch]] = []
        self._one_query_of: PaddedBatch | None = None
        self._extend_padded: PaddedBatch | None = None
        self._extend_padded_of: BatchPlan | None = None
        self._checked_layers: set[int] = set()

    def init_forward_metadata(self, forward_batch):
        super().init_forward_metadata(forward_batch)
        mode = forward_batch.forward_mode
        req_to_token = self.req_to_token_pool.req_to_token
        self.plan = self.padded = None
        if mode.is_idle():
            return
        req_pool_indices = forward_batch.req_pool_indices.tolist()
        if mode.is_decode():
            seq_lens = _host_list(forward_batch.seq_lens_cpu, forward_batch.seq_lens)
            self.plan = plan_decode(req_to_token, req_pool_indices, seq_lens)
            self.padded = pad_batch(self.plan, new_tokens=False)
        elif mode.is_target_verify():
            # seq_lens counts the cached tokens only; each request's draft tokens come in with the call.
            spec_info = forward_batch.spec_info
            prefix_lens = _host_list(forward_batch.seq_lens_cpu, forward_batch.seq_lens)
            num_draft = int(spec_info.num_tokens_per_req)
            self.plan = plan_extend(req_to_token, req_pool_indices, prefix_lens, [num_draft] * len(prefix_lens))
            custom_mask = getattr(spec_info, "custom_mask", None)
            mask_indptr = None
            if custom_mask is not None:
                block = num_draft * (torch.tensor(prefix_lens, dtype=torch.int64) + num_draft)
                mask_indptr = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(block, 0)])
            padded = pad_batch(self.plan, new_tokens=True, custom_mask=custom_mask, mask_indptr=mask_indptr)
            self.padded = read_new_tokens_from_pool(padded, forward_batch.out_cache_loc)
        elif mode.is_extend(include_draft_extend_v2=True):
            self.plan = plan_extend(
                req_to_token,
                req_pool_indices,
                _host_list(forward_batch.extend_prefix_lens_cpu, forward_batch.extend_prefix_lens),
                _host_list(forward_batch.extend_seq_lens_cpu, forward_batch.extend_seq_lens),
            )
            if mode.is_draft_extend_v2():
                # Every request extends by the same few draft tokens: pad and run the batch at once.
                self.padded = pad_batch(self.plan, new_tokens=True)
                if extend_reads_pool():
                    self.padded = read_new_tokens_from_pool(self.padded, forward_batch.out_cache_loc)
        else:
            raise NotImplementedError(
                f"--kv-cache-dtype {self.kv_format.name} on torch_native: forward mode {mode.name} is not supported"
            )

    def _check(self, layer) -> None:
        if layer.layer_id not in self._checked_layers:
            check_layer_supported(layer, self.kv_format.name, "torch_native")
            self._checked_layers.add(layer.layer_id)

    def _store(self, layer, forward_batch, k, v) -> None:
        self.kv_pool.set_kv_buffer(layer, compat.KVWriteLoc(forward_batch.out_cache_loc), k, v)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        self._check(layer)
        if k is None or v is None:
            raise NotImplementedError(f"--kv-cache-dtype {self.kv_format.name}: extend without fresh K/V")
        k3 = k.view(-1, layer.tp_k_head_num, layer.qk_head_dim)
        v3 = v.view(-1, layer.tp_v_head_num, layer.v_head_dim)
        from_pool = extend_reads_pool() or forward_batch.forward_mode.is_target_verify()
        if save_kv_cache:
            self._store(layer, forward_batch, k3, v3)
        elif from_pool:
            raise NotImplementedError(f"--kv-cache-dtype {self.kv_format.name}: this extend reads its new tokens "
                                      "back from the pool, so it must store them (save_kv_cache)")
        q3 = q.view(-1, layer.tp_q_head_num, layer.qk_head_dim)
        planes = self.kv_pool.layer_planes(layer.layer_id)
        if self.padded is not None and batch_invariant.rows_alone() and not self.padded.new_tokens:
            # target verify (and draft extend in pool mode): every key is in the pool
            o = self._one_query_at_a_time(q3, planes, layer)
            return o.to(q.dtype).reshape(-1, layer.tp_q_head_num * layer.v_head_dim)
        if self.padded is not None:
            o = batched_attention(
                self.kv_format, q3, planes, self.padded, layer.scaling, logit_cap_of(layer), k_new=k3, v_new=v3
            )
            return o.to(q.dtype).reshape(-1, layer.tp_q_head_num * layer.v_head_dim)
        if from_pool and batch_invariant.rows_alone():
            # Batch-invariant mode, prefill and extend: each new token attends alone over exactly the slots it sees
            # (its own stored first) through the decode routine, so its output, and the K/V the next layer stores,
            # are bitwise what a decode step of that token computes, whatever its chunk, its batch or the cache.
            o = self._one_query_at_a_time(q3, planes, layer, self._extend_in_pool(forward_batch))
            return o.to(q.dtype).reshape(-1, layer.tp_q_head_num * layer.v_head_dim)
        # Prefill chunks differ widely in length: per request, so padding never multiplies the work.
        plan = self.plan
        o = reference.extend_attention(
            self.kv_format,
            q3,
            k3,
            v3,
            planes,
            plan.qo_indptr,
            plan.kv_indptr,
            plan.kv_indices,
            layer.scaling,
            logit_cap=logit_cap_of(layer),
            new_slots=forward_batch.out_cache_loc if from_pool else None,
        )
        return o.to(q.dtype).reshape(-1, layer.tp_q_head_num * layer.v_head_dim)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        self._check(layer)
        if save_kv_cache and k is not None and v is not None:
            self._store(
                layer,
                forward_batch,
                k.view(-1, layer.tp_k_head_num, layer.qk_head_dim),
                v.view(-1, layer.tp_v_head_num, layer.v_head_dim),
            )
        q3 = q.reshape(-1, layer.tp_q_head_num, layer.qk_head_dim)
        planes = self.kv_pool.layer_planes(layer.layer_id)
        if batch_invariant.rows_alone():
            o = self._one_query_at_a_time(q3, planes, layer)
        else:
            o = batched_attention(self.kv_format, q3, planes, self.padded, layer.scaling, logit_cap_of(layer))
        return o.to(q.dtype).reshape(-1, layer.tp_q_head_num * layer.v_head_dim)

    def _extend_in_pool(self, forward_batch) -> PaddedBatch:
        """This step's prefill plan laid out with its new tokens read from the pool (built once per step)."""
        if self._extend_padded_of is not self.plan:
            padded = pad_batch(self.plan, new_tokens=True)
            self._extend_padded = read_new_tokens_from_pool(padded, forward_batch.out_cache_loc)
            self._extend_padded_of = self.plan
        return self._extend_padded

    def _one_query_at_a_time(self, q3, planes, layer, padded: PaddedBatch | None = None) -> torch.Tensor:
        """Batch-invariant mode: each query of `padded` (default self.padded; every key in the pool) attends
        alone, as a batch-1 decode step would."""
        padded = self.padded if padded is None else padded
        if self._one_query_of is not padded:
            self._one_query, self._one_query_of = one_query_batches(padded), padded
        o = torch.zeros(q3.shape, dtype=torch.float32, device=q3.device)
        for row, one in self._one_query:
            o[row] = batched_attention(self.kv_format, q3[row:row + 1], planes, one, layer.scaling,
                                       logit_cap_of(layer))[0]
        return o
