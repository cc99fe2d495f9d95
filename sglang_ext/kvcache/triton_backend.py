"""GPU attention over a compressed pool: SGLang's Triton backend with its kernels swapped for ours.

Everything per batch (kv_indptr / kv_indices / qo_indptr, CUDA-graph buffers, split-KV sizing) is
TritonAttnBackend's own metadata, plus one decode launch plan (kernels/decode_plan.py) made beside it in
init_forward_metadata or at CUDA-graph capture; the per-layer calls change: the pool's store kernel writes new
K/V, `sglang_ext.kernels.decode.run_decode` (the plan) / `extend_attention` read the format's planes at kv_indices.
Speculative decoding: target verify reads the draft tokens back from the pool at out_cache_loc (stored
first), as decode reads its current token, so that verify computes the logits sequential decode would (greedy
output with speculation = without). Chain drafts (EAGLE/NEXTN with topk 1, whose mask is causal) run through
the decode kernel with q_len tokens per request (split over the prefix like a decode step: the extend kernel
gives a request's few verify rows one program per KV head, which on an H200 made a 4-token verify over an 8k
prefix cost 8x a decode step; docs/benchmarks/speculative.md); so do tree drafts (topk > 1), with the drafts'
columns of SGLang's custom mask as the decode kernel's tree mask; NGRAM and verifies too large for one decode
program take the extend kernel with SGLang's custom mask; draft extend (DRAFT_EXTEND_V2) is an extend
whose kv lists cover the prefix only, which TritonAttnBackend's metadata already gives.
Only compile-checked on this project's CPU CI; the kernels themselves are tested against the torch reference.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from sglang_ext import compat
from sglang_ext.kvcache.hybrid_pool import HybridCompressedPool, compressed_pool_of
from sglang_ext.kvcache.pool import CompressedMHATokenToKVPool
from sglang_ext.kvcache.torch_backend import check_layer_supported, logit_cap_of


class CompressedTritonAttnBackend(compat.TritonAttnBackend):
    """TritonAttnBackend for `CompressedMHATokenToKVPool`: decode, extend, mixed, target verify, draft extend."""

    def __init__(self, model_runner, *args, **kwargs):
        """TritonAttnBackend's constructor over the compressed pool `model_runner.token_to_kv_pool`.

        SGLang's constructor learns the value head size of a non-hybrid model from
        `token_to_kv_pool.get_value_buffer(start_layer).shape[-1]`, a dense [slots, H, Dv] buffer this pool does
        not have (it refuses dense reads so that nothing can attend to raw plane bytes). For the duration of that
        constructor only, the pool answers `get_value_buffer` with a shape-only tensor on the meta device (no
        storage: reading its values raises); afterwards it refuses again, and the size SGLang took is checked
        against the pool's. This is narrower than a hook on TritonAttnBackend.__init__ (which would also reach
        dense pools) and leaves SGLang's constructor, and so the GPU path, running as written.
        """
        pool = compressed_pool_of(model_runner.token_to_kv_pool)
        if pool is None:
            raise TypeError(f"{type(self).__name__} needs a compressed KV pool, got "
                            f"{type(model_runner.token_to_kv_pool).__name__}")
        # A hybrid pool answers SGLang's v_head_dim question from its full-attention sub-pool.
        with value_buffer_shape_only(pool.full if isinstance(pool, HybridCompressedPool) else pool):
            super().__init__(model_runner, *args, **kwargs)
        if self.v_head_dim != pool.v_head_dim:
            raise RuntimeError(f"TritonAttnBackend took v_head_dim {self.v_head_dim}, the {pool.kv_format.name} "
                               f"pool holds {pool.v_head_dim}")
        if self.dcp_size > 1 or self.use_mla or self.enable_deterministic:
            raise ValueError(
                f"--kv-cache-dtype {pool.kv_format.name} on triton supports MHA/GQA without decode context "
                "parallelism or deterministic inference"
            )
        self.kv_pool = pool
        self.kv_format = pool.kv_format
        self._checked_layers: set[int] = set()
        self._tree: tuple[object, torch.Tensor] | None = None  # (forward batch, its verify tree mask)
        self._q_dtype = model_runner.dtype  # the model's activations: the dtype of q the kernels get
        self._decode_plan = None  # this batch's DecodePlan (plan_batch), or None: extend kernel only
        self._extend_plan = None  # this batch's ExtendPlan (plan_extend_batch), or None: no extend kernel
        # (forward mode, bucket batch size) -> (decode plan, extend plan) made at capture
        self._graph_plans: dict[tuple, tuple] = {}

    def _check(self, layer, sinks, score_mod, aux_tensors) -> None:
        if sinks is not None or score_mod is not None or aux_tensors is not None:
            raise NotImplementedError(
                f"--kv-cache-dtype {self.kv_format.name}: attention sinks / score_mod are not supported"
            )
        if layer.layer_id not in self._checked_layers:
            check_layer_supported(layer, self.kv_format.name, "triton")
            self._checked_layers.add(layer.layer_id)

    def _store(self, layer, forward_batch, k, v) -> None:
        self.kv_pool.set_kv_buffer(layer, compat.KVWriteLoc.for_batch(forward_batch), k, v)

    def forward_extend(
        self, q, k, v, layer, forward_batch, save_kv_cache=True, sinks=None, score_mod=None, aux_tensors=None
    ):
        from sglang_ext.kernels import extend_attention
        from sglang_ext.kvcache.new_token_reads import extend_reads_pool

        self._check(layer, sinks, score_mod, aux_tensors)
        if k is None or v is None:
            raise NotImplementedError(f"--kv-cache-dtype {self.kv_format.name}: extend without fresh K/V")
        k3 = k.view(-1, layer.tp_k_head_num, layer.qk_head_dim).contiguous()
        v3 = v.view(-1, layer.tp_v_head_num, layer.v_head_dim).contiguous()
        verify = forward_batch.forward_mode.is_target_verify()
        # Verify, and every extend with SGLANG_EXT_KV_EXTEND_NEW_TOKENS=pool (kvcache/new_token_reads.py), reads its
        # new tokens back through the format at out_cache_loc, like the cached prefix: the same bytes for every reader.
        from_pool = verify or extend_reads_pool()
        if save_kv_cache:
            self._store(layer, forward_batch, k3, v3)
        elif from_pool:
            raise NotImplementedError(f"--kv-cache-dtype {self.kv_format.name}: this extend reads its new tokens "
                                      "back from the pool, so it must store them (save_kv_cache)")
        o = torch.empty((q.shape[0], layer.tp_q_head_num * layer.v_head_dim), dtype=q.dtype, device=q.device)
        md = self.forward_metadata
        plan = self._decode_plan if verify else None
        if plan is not None:  # a chain or tree verify through the decode kernel (plan_batch)
            return self._decode(q, o, layer, new_slots=forward_batch.out_cache_loc,
                                tree_mask=self._tree_mask(forward_batch, plan.q_len) if plan.tree else None)
        verify_mask = md.custom_mask if verify else None
        extend_attention(
            self.kv_format,
            q.view(-1, layer.tp_q_head_num, layer.qk_head_dim),
            k3,
            v3,
            o.view(-1, layer.tp_q_head_num, layer.v_head_dim),
            self.kv_pool.layer_planes(layer.layer_id),
            md.qo_indptr,
            md.kv_indptr,
            md.kv_indices,
            md.max_extend_len,
            layer.scaling,
            is_causal=True,
            page_size=self.page_size,
            logit_cap=logit_cap_of(layer),
            custom_mask=verify_mask,
            mask_indptr=md.mask_indptr if verify_mask is not None else None,
            new_slots=forward_batch.out_cache_loc if from_pool else None,
            plan=self._extend_plan,
        )
        return o

    def forward_decode(
        self, q, k, v, layer, forward_batch, save_kv_cache=True, sinks=None, score_mod=None, aux_tensors=None
    ):
        self._check(layer, sinks, score_mod, aux_tensors)
        q = q.reshape(-1, layer.tp_q_head_num * layer.qk_head_dim)
        if save_kv_cache:
            self._store(
                layer,
                forward_batch,
                k.view(-1, layer.tp_k_head_num, layer.qk_head_dim),
                v.view(-1, layer.tp_v_head_num, layer.v_head_dim),
            )
        o = torch.empty((q.shape[0], layer.tp_q_head_num * layer.v_head_dim), dtype=q.dtype, device=q.device)
        return self._decode(q, o, layer, num_kv_splits=self.forward_metadata.num_kv_splits)

    # Plan once per batch ------------------------------------------------------------------------------------------
    # Decode and decode-kernel verify steps get a decode_plan.DecodePlan here, extends (prefill, mixed, draft extend,
    # extend-kernel verify) an extend_plan.ExtendPlan, both from the batch's sequence lengths as SGLang's metadata
    # carries them on the host (never from a buffer's shape); every layer's call runs them. Under CUDA graphs the
    # plans are made at capture from the bucket's batch size alone (lengths unknown: decode_plan's and extend_plan's
    # docstrings say which choices that fixes) and reinstalled at every replay of that bucket.

    def init_forward_metadata(self, forward_batch):
        super().init_forward_metadata(forward_batch)
        self._decode_plan = self.plan_batch(forward_batch, host_seq_lens_sum(forward_batch))
        self._extend_plan = self.plan_extend_batch(forward_batch, host_prefix_rows(forward_batch))

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
        super().init_forward_metadata_out_graph(forward_batch, in_capture)
        key = (forward_batch.forward_mode, forward_batch.batch_size)
        if in_capture:
            self._graph_plans[key] = (self.plan_batch(forward_batch, None), self.plan_extend_batch(forward_batch, None))
        self._decode_plan, self._extend_plan = self._graph_plans[key]

    def plan_extend_batch(self, forward_batch, prefix_rows: int | None):
        """The ExtendPlan of this batch's extend-kernel calls, or None for a decode batch. prefix_rows: the batch's
        total prefix length (its kv lists' length, kv_indptr[B]) on the host, None when unknown (a CUDA-graph
        capture, metadata without host lengths): the direct kernel, no prefix scratch."""
        from sglang_ext.kernels.extend_plan import plan_extend

        md = self.forward_metadata
        if forward_batch.forward_mode.is_decode_or_idle() or md.max_extend_len is None:
            return None
        return plan_extend(self.kv_format, self.kv_pool.head_num, num_q_heads=self.num_head,
                           prefix_rows=prefix_rows, max_len_extend=md.max_extend_len,
                           verify=forward_batch.forward_mode.is_target_verify() and md.custom_mask is not None,
                           info=self.device)

    def plan_batch(self, forward_batch, seq_lens_sum: int | None):
        """The DecodePlan of this batch's decode-kernel steps (decode; chain or tree verify), or None when the batch
        runs only the extend kernel. seq_lens_sum: the batch's total KV length on the host, None under a CUDA-graph
        capture."""
        from sglang_ext.kernels.decode_plan import plan_decode

        mode = forward_batch.forward_mode
        spec = forward_batch.spec_info
        if mode.is_decode_or_idle():
            q_len, tree = 1, False
            # multi-step drafts hand in their own kv lists, topk rows per request (SGLang slices its kv_indptr to
            # them), each over its request's tokens: the rows are the plan's batch, and their KV total is topk x the
            # requests' (the mean length per row stays the requests')
            rows = spec.kv_indptr.shape[0] - 1 if spec is not None and spec.kv_indptr is not None else None
            batch = rows if rows is not None else forward_batch.batch_size
            if rows is not None and seq_lens_sum is not None and forward_batch.batch_size:
                seq_lens_sum = seq_lens_sum * rows // forward_batch.batch_size
        elif mode.is_target_verify():
            q_len, tree = verify_shape(forward_batch, self.num_head // self.num_kv_head)
            if q_len == 1:
                return None
            batch = forward_batch.batch_size
        else:
            return None
        if batch == 0:
            return None
        return plan_decode(self.kv_format, self.kv_pool.first_layer_planes(), batch=batch,
                           num_q_heads=self.num_head, q_dtype=self._q_dtype, seq_lens_sum=seq_lens_sum,
                           max_kv_splits=self.max_kv_splits, q_len=q_len, tree=tree,
                           kv_splits_given=mode.is_decode_or_idle())

    def _tree_mask(self, forward_batch, q_len: int) -> torch.Tensor:
        """The decode kernel's tree mask of this verify batch (SGLang's custom mask's draft columns, as
        tree_mask_bits), made once per batch for all layers."""
        from sglang_ext.kernels.decode import tree_mask_bits, verify_tree_mask

        if self._tree is None or self._tree[0] is not forward_batch:
            md = self.forward_metadata
            tree = verify_tree_mask(md.custom_mask, md.mask_indptr, md.kv_indptr, forward_batch.batch_size, q_len)
            self._tree = (forward_batch, tree_mask_bits(tree))
        return self._tree[1]

    def _decode(self, q, o, layer, **kwargs):
        """This batch's decode plan run over this layer's planes and kv lists into o; kwargs: num_kv_splits (SGLang's,
        decode), or new_slots / tree_mask for a verify. Returns o."""
        from sglang_ext.kernels.decode import run_decode

        md = self.forward_metadata
        run_decode(
            self._decode_plan,
            self.kv_format,
            q.view(-1, layer.tp_q_head_num, layer.qk_head_dim),
            self.kv_pool.layer_planes(layer.layer_id),
            o.view(-1, layer.tp_q_head_num, layer.v_head_dim),
            md.kv_indptr,
            md.kv_indices,
            layer.scaling,
            page_size=self.page_size,
            logit_cap=logit_cap_of(layer),
            **kwargs,
        )
        return o


@contextmanager
def value_buffer_shape_only(pool: CompressedMHATokenToKVPool):
    """Within the block, `pool.get_value_buffer(layer_id)` returns a meta tensor of the dense buffer's shape
    [size + page_size, head_num, v_head_dim]; the pool's own refusal is back on exit (also on an exception)."""

    def shape_only(layer_id: int) -> torch.Tensor:
        return torch.empty((pool.size + pool.page_size, pool.head_num, pool.v_head_dim), dtype=pool.dtype,
                           device="meta")

    pool.get_value_buffer = shape_only
    try:
        yield
    finally:
        del pool.get_value_buffer


def host_seq_lens_sum(forward_batch) -> int | None:
    """The batch's total sequence length as SGLang's metadata holds it on the host (seq_lens_sum, else the sum of
    seq_lens_cpu), or None when it holds neither; never a device read."""
    if getattr(forward_batch, "seq_lens_sum", None) is not None:
        return int(forward_batch.seq_lens_sum)
    if getattr(forward_batch, "seq_lens_cpu", None) is not None:
        return int(forward_batch.seq_lens_cpu.sum())
    return None


def host_prefix_rows(forward_batch) -> int | None:
    """The total length of an extend batch's kv lists (its cached prefixes; a target verify's whole sequences) as
    SGLang's metadata holds it on the host, or None when it holds none: the sum of extend_prefix_lens_cpu, else
    seq_lens_sum (or the sum of seq_lens_cpu) less the sum of extend_seq_lens_cpu. Never a device read, never a
    buffer's size (SGLang allocates kv_indices to batch x context length when it lacks the host lengths)."""
    if forward_batch.forward_mode.is_target_verify():
        return host_seq_lens_sum(forward_batch)
    prefix_lens = getattr(forward_batch, "extend_prefix_lens_cpu", None)
    if prefix_lens is not None:
        return int(sum(prefix_lens))
    total, extend_lens = host_seq_lens_sum(forward_batch), getattr(forward_batch, "extend_seq_lens_cpu", None)
    if total is None or extend_lens is None:
        return None
    return total - int(sum(extend_lens))


def verify_shape(forward_batch, group: int) -> tuple[int, bool]:
    """(draft tokens per request, tree?) of an EAGLE/NEXTN verify batch the decode kernel can take: a chain (topk
    1: each draft's mask is causal over the drafts before it) or a tree (topk > 1: the custom mask's draft
    columns); (1, False) otherwise (the extend kernel with the custom mask: NGRAM, or too many rows)."""
    from sglang_ext.kernels.decode import MAX_TREE_TOKENS, MAX_VERIFY_ROWS

    spec = forward_batch.spec_info
    topk = getattr(spec, "topk", None)
    if not isinstance(topk, int) or topk < 1:
        return 1, False
    q_len = int(getattr(spec, "num_tokens_per_req", -1) or -1)
    if q_len <= 0:  # SGLang fills it from draft_token_num when left at -1
        q_len = int(getattr(spec, "draft_token_num", 0) or 0)
    tree = topk > 1
    if 1 < q_len and q_len * group <= MAX_VERIFY_ROWS and (not tree or q_len <= MAX_TREE_TOKENS):
        return q_len, tree
    return 1, False
