"""CPU attention over a compressed pool: SGLang's torch_native backend with its pool reads replaced.

Per forward step `init_forward_metadata` lists the slots each sequence reads (a `BatchPlan`); per layer the
format's torch reference attention gathers the planes at those slots only, dequantizes them and attends.
New extend tokens attend to their own K/V as computed (not the stored codes), the cached prefix is read back
from the pool, exactly as the Triton kernels do on GPU, so CPU runs measure what GPU serving computes.
"""

from __future__ import annotations

import torch

# compat (sglang 0.5.23): TorchNativeAttnBackend attributes read here -- token_to_kv_pool, req_to_token_pool;
#   ForwardBatch fields forward_mode, req_pool_indices, seq_lens_cpu, extend_prefix_lens_cpu, extend_seq_lens_cpu,
#   out_cache_loc.
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.layers.radix_attention import AttentionType
from sglang.srt.mem_cache.memory_pool import KVWriteLoc

from sglang_ext.kvcache.batch_plan import BatchPlan, plan_decode, plan_extend
from sglang_ext.kvcache.pool import CompressedMHATokenToKVPool
from sglang_ext.kvformats import reference


def check_layer_supported(layer, fmt_name: str, backend: str) -> None:
    """Raise for attention features the compressed-KV kernels do not implement."""
    problems = []
    if layer.is_cross_attention or layer.attn_type != AttentionType.DECODER:
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


class CompressedTorchNativeAttnBackend(TorchNativeAttnBackend):
    """torch_native for `CompressedMHATokenToKVPool`: decode and extend (incl. mixed chunks) on any device."""

    def __init__(self, model_runner):
        super().__init__(model_runner)
        pool = self.token_to_kv_pool
        if not isinstance(pool, CompressedMHATokenToKVPool):
            raise TypeError(f"{type(self).__name__} needs a CompressedMHATokenToKVPool, got {type(pool).__name__}")
        self.kv_pool = pool
        self.kv_format = pool.kv_format
        self.plan: BatchPlan | None = None
        self._checked_layers: set[int] = set()

    def init_forward_metadata(self, forward_batch):
        super().init_forward_metadata(forward_batch)
        mode = forward_batch.forward_mode
        req_to_token = self.req_to_token_pool.req_to_token
        if mode.is_idle():
            self.plan = None
        elif mode.is_decode():
            self.plan = plan_decode(
                req_to_token, forward_batch.req_pool_indices.tolist(), forward_batch.seq_lens_cpu.tolist()
            )
        elif mode.is_extend() and not mode.is_target_verify():
            self.plan = plan_extend(
                req_to_token,
                forward_batch.req_pool_indices.tolist(),
                list(forward_batch.extend_prefix_lens_cpu),
                list(forward_batch.extend_seq_lens_cpu),
            )
        else:
            raise NotImplementedError(
                f"--kv-cache-dtype {self.kv_format.name} on torch_native: forward mode {mode.name} is not "
                "supported (speculative decoding needs the triton backend)"
            )

    def _check(self, layer) -> None:
        if layer.layer_id not in self._checked_layers:
            check_layer_supported(layer, self.kv_format.name, "torch_native")
            self._checked_layers.add(layer.layer_id)

    def _store(self, layer, forward_batch, k, v) -> None:
        self.kv_pool.set_kv_buffer(layer, KVWriteLoc(forward_batch.out_cache_loc), k, v)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        self._check(layer)
        if k is None or v is None:
            raise NotImplementedError(f"--kv-cache-dtype {self.kv_format.name}: extend without fresh K/V")
        k3 = k.view(-1, layer.tp_k_head_num, layer.qk_head_dim)
        v3 = v.view(-1, layer.tp_v_head_num, layer.v_head_dim)
        if save_kv_cache:
            self._store(layer, forward_batch, k3, v3)
        plan = self.plan
        o = reference.extend_attention(
            self.kv_format,
            q.view(-1, layer.tp_q_head_num, layer.qk_head_dim),
            k3,
            v3,
            self.kv_pool.layer_planes(layer.layer_id),
            plan.qo_indptr,
            plan.kv_indptr,
            plan.kv_indices,
            layer.scaling,
            logit_cap=logit_cap_of(layer),
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
        plan = self.plan
        o = reference.decode_attention(
            self.kv_format,
            q.reshape(-1, layer.tp_q_head_num, layer.qk_head_dim),
            self.kv_pool.layer_planes(layer.layer_id),
            plan.kv_indptr,
            plan.kv_indices,
            layer.scaling,
            logit_cap=logit_cap_of(layer),
        )
        return o.to(q.dtype).reshape(-1, layer.tp_q_head_num * layer.v_head_dim)
