"""Draft-model attention for EAGLE/NEXTN on the `torch_native` backend (the CPU platform's attention).

SGLang 0.5.23's DraftBackendFactory knows no `torch_native` entry: EAGLE/NEXTN refuses to start with it. Draft
extend needs nothing special (a DRAFT_EXTEND_V2 batch carries prefix and extend lengths like a prefill), so it
gets a plain TorchNativeAttnBackend. Draft decode runs `speculative_num_steps - 1` steps; step s writes its
token's KV to req_to_token[req, seq_len + s] (assign_draft_cache_locs_contiguous, topk 1), and attends to the
committed prefix plus the s + 1 draft tokens written so far. Only topk 1 (a chain): a topk > 1 draft tree
would need per-branch slot tables.

Over a compressed pool (`--kv-cache-dtype int8|octave_*`, the draft pool has the target's format) the same
roles go to `CompressedTorchNativeAttnBackend`, which reads the format's planes; a draft step is its decode
over the seq_len + s + 1 slots req_to_token[req, :seq_len + s + 1] (the step's own slot is
req_to_token[req, seq_len + s], where assign_draft_cache_locs_contiguous took it from).
"""

from sglang_ext import compat
from sglang_ext.spec.verify_attention import target_verify_attention

_step_cls = None
_compressed_step_cls = None


def _draft_step_backend_cls():
    """TorchNativeAttnBackend whose decode attends to seq_len + step + 1 keys (built lazily: SGLang's class is
    importable only once the platform is chosen)."""
    global _step_cls
    if _step_cls is not None:
        return _step_cls

    class TorchNativeDraftStepBackend(compat.TorchNativeAttnBackend):
        def __init__(self, model_runner, step: int):
            super().__init__(model_runner)
            self.step = step

        def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
            if save_kv_cache and k is not None and v is not None:
                self.token_to_kv_pool.set_kv_buffer(
                    layer, compat.KVWriteLoc(forward_batch.out_cache_loc, self.swa_out_cache_loc), k, v)
            # keys: prefix + the `step` earlier drafts from req_to_token, then this step's token from out_cache_loc
            return target_verify_attention(
                q.reshape(q.shape[0], -1), self.token_to_kv_pool.get_key_buffer(layer.layer_id),
                self.token_to_kv_pool.get_value_buffer(layer.layer_id), self.req_to_token_pool.req_to_token,
                forward_batch.req_pool_indices, forward_batch.seq_lens + self.step, forward_batch.out_cache_loc,
                None, 1, layer.tp_q_head_num, layer.scaling)

    _step_cls = TorchNativeDraftStepBackend
    return _step_cls


def _compressed_draft_step_backend_cls():
    """CompressedTorchNativeAttnBackend whose decode attends to seq_len + step + 1 slots (built lazily, as above)."""
    global _compressed_step_cls
    if _compressed_step_cls is not None:
        return _compressed_step_cls
    from sglang_ext.kvcache.batch_plan import plan_decode
    from sglang_ext.kvcache.batched_attention import pad_batch
    from sglang_ext.kvcache.torch_backend import CompressedTorchNativeAttnBackend

    class CompressedTorchNativeDraftStepBackend(CompressedTorchNativeAttnBackend):
        def __init__(self, model_runner, step: int):
            super().__init__(model_runner)
            self.step = step

        def init_forward_metadata(self, forward_batch):
            super().init_forward_metadata(forward_batch)
            if forward_batch.forward_mode.is_decode():
                seq_lens = (forward_batch.seq_lens + self.step + 1).tolist()
                self.plan = plan_decode(self.req_to_token_pool.req_to_token,
                                        forward_batch.req_pool_indices.tolist(), seq_lens)
                self.padded = pad_batch(self.plan, new_tokens=False)

    _compressed_step_cls = CompressedTorchNativeDraftStepBackend
    return _compressed_step_cls


def _is_compressed(model_runner) -> bool:
    from sglang_ext.kvcache.pool import CompressedMHATokenToKVPool

    return isinstance(getattr(model_runner, "token_to_kv_pool", None), CompressedMHATokenToKVPool)


class TorchNativeMultiStepDraftBackend:
    """The per-step container DraftBackendFactory.create_decode_backend returns (`attn_backends[step]`)."""

    def __init__(self, model_runner, topk: int, speculative_num_steps: int):
        if topk != 1:
            raise NotImplementedError(
                f"torch_native draft decode supports --speculative-eagle-topk 1 only (got {topk})")
        cls = _compressed_draft_step_backend_cls() if _is_compressed(model_runner) else _draft_step_backend_cls()
        self.topk = topk
        self.speculative_num_steps = speculative_num_steps
        self.attn_backends = [cls(model_runner, step) for step in range(speculative_num_steps - 1)]

    def init_forward_metadata(self, forward_batch) -> None:
        for backend in self.attn_backends:
            backend.init_forward_metadata(forward_batch)


def add_torch_native(original, factory, backend_name, backend_map, error_template, stamps_children=False):
    """AROUND DraftBackendFactory._create_backend: offer `torch_native` next to SGLang's own entries."""
    runner = factory.draft_model_runner
    if backend_name == "decode_attention_backend":
        def create():
            return "torch_native", TorchNativeMultiStepDraftBackend(runner, factory.topk, factory.speculative_num_steps)
    elif _is_compressed(runner):
        def create():
            from sglang_ext.kvcache.torch_backend import CompressedTorchNativeAttnBackend

            return "torch_native", CompressedTorchNativeAttnBackend(runner)
    else:
        def create():
            return "torch_native", compat.TorchNativeAttnBackend(runner)
    return original(factory, backend_name, {**backend_map, "torch_native": create}, error_template, stamps_children)
