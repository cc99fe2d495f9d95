"""Draft-model attention for EAGLE/NEXTN on the `torch_native` backend (the CPU platform's attention).

SGLang 0.5.23's DraftBackendFactory knows no `torch_native` entry: EAGLE/NEXTN refuses to start with it. Draft
extend needs nothing special (a DRAFT_EXTEND_V2 batch carries prefix and extend lengths like a prefill), so it
gets a plain TorchNativeAttnBackend. Draft decode runs `speculative_num_steps - 1` steps over
bs x topk rows (row b * topk + k is branch k of request b). assign_draft_cache_locs_contiguous gave each request
the topk * num_steps slots req_to_token[req, seq_len:], branch k owning the num_steps slots from
seq_len + k * num_steps; step s writes row (b, k)'s token to the branch's slot s and attends to the committed
prefix plus the branch's s + 1 slots written so far (`draft_step_slots`: the same lists SGLang's
`generate_draft_decode_kv_indices` builds for its Triton and FlashInfer draft backends, page size 1). With
topk 1 that is req_to_token[req, :seq_len + s + 1].

Over a compressed pool (`--kv-cache-dtype int8|octave_*`, the draft pool has the target's format) the same
roles go to `CompressedTorchNativeAttnBackend`, which reads the format's planes; a draft step is its decode
over the same slot lists. On a hybrid linear-attention model (Qwen3.5's MTP layer as the draft) the draft pool is
SGLang's `HybridLinearKVPool` with the compressed planes as its full-attention sub-pool (`_compressed_planes`).

On a GPU over a compressed pool (`compressed_triton_draft`): SGLang's Triton draft backends would read the pool as
dense K/V (the pool refuses). Draft decode keeps SGLang's TritonMultiStepDraftBackend, whose per-step kv lists
(generate_draft_decode_kv_indices) reach each step's backend through spec_info, with CompressedTritonAttnBackend as
the step backends; draft extend gets a CompressedTritonAttnBackend. Any other draft backend is refused by name.
Wiring only tested on CPU (SGLang does not run on the lent GPU).
"""

import torch

from sglang_ext import compat
from sglang_ext.spec.verify_attention import target_verify_attention

_step_cls = None
_compressed_step_cls = None


def draft_step_slots(req_to_token: torch.Tensor, req_pool_indices: list[int], seq_lens: list[int], topk: int,
                     num_steps: int, step: int) -> tuple[torch.Tensor, list[int]]:
    """Keys of draft step `step` (0-based) per row, rows ordered request-major (b * topk + k): the committed
    prefix req_to_token[req, :seq_len] then branch k's slots req_to_token[req, seq_len + k * num_steps:][:step + 1].
    Returns (table [bs * topk, longest] int64, zero-padded; lengths per row), a req_to_token-shaped table whose
    row r holds row r's keys (the step's own slot last)."""
    lists = []
    for req, seq_len in zip(req_pool_indices, seq_lens, strict=True):
        prefix = req_to_token[req, :seq_len]
        for k in range(topk):
            start = seq_len + k * num_steps
            lists.append(torch.cat((prefix, req_to_token[req, start:start + step + 1])).long())
    lengths = [len(x) for x in lists]
    table = torch.zeros((len(lists), max(lengths, default=0)), dtype=torch.int64, device=req_to_token.device)
    for row, slots in enumerate(lists):
        table[row, :len(slots)] = slots
    return table, lengths


def check_step_slots(out_cache_loc: torch.Tensor, table: torch.Tensor, lengths: list[int]) -> None:
    """The slots the worker writes this step (out_cache_loc, per_step_draft_out_cache_loc's layout) must be the
    last key of each row's list, or the step would attend to a slot it did not write."""
    last = table[torch.arange(len(lengths)), torch.tensor(lengths) - 1]
    if not torch.equal(out_cache_loc.long().cpu(), last.cpu()):
        raise RuntimeError("draft decode: the step's out_cache_loc does not match the branch slot layout "
                           "(seq_len + branch * num_steps + step); SGLang's draft slot assignment changed")


class DraftStepSlots:
    """The step-slot table of one draft step backend (mixed into both step backends below): planned per decode
    batch in init_forward_metadata, checked against the worker's out_cache_loc on the step's first layer."""

    def init_step_slots(self, topk: int, num_steps: int, step: int) -> None:
        self.topk, self.num_steps, self.step = topk, num_steps, step
        self.table = self.lengths = None
        self.slots_checked = True

    def plan_step_slots(self, forward_batch) -> bool:
        """Build the table for a decode batch; False (nothing planned) for any other mode."""
        if not forward_batch.forward_mode.is_decode():
            return False
        self.table, self.lengths = draft_step_slots(
            self.req_to_token_pool.req_to_token, forward_batch.req_pool_indices.tolist(),
            forward_batch.seq_lens.tolist(), self.topk, self.num_steps, self.step)
        self.slots_checked = False
        return True

    def check_step_slots_once(self, forward_batch) -> None:
        if not self.slots_checked:  # once per step: the first layer's call
            check_step_slots(forward_batch.out_cache_loc, self.table, self.lengths)
            self.slots_checked = True


def _draft_step_backend_cls():
    """TorchNativeAttnBackend whose decode attends to seq_len + step + 1 keys (built lazily: SGLang's class is
    importable only once the platform is chosen)."""
    global _step_cls
    if _step_cls is not None:
        return _step_cls

    class TorchNativeDraftStepBackend(DraftStepSlots, compat.TorchNativeAttnBackend):
        def __init__(self, model_runner, topk: int, num_steps: int, step: int):
            super().__init__(model_runner)
            self.init_step_slots(topk, num_steps, step)

        def init_forward_metadata(self, forward_batch):
            super().init_forward_metadata(forward_batch)
            self.plan_step_slots(forward_batch)

        def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
            self.check_step_slots_once(forward_batch)
            if save_kv_cache and k is not None and v is not None:
                self.token_to_kv_pool.set_kv_buffer(
                    layer, compat.KVWriteLoc(forward_batch.out_cache_loc, self.swa_out_cache_loc), k, v)
            # Each row: its table row minus the last slot as the "prefix", then the step's own token (that last
            # slot, which out_cache_loc wrote above) as a single draft.
            rows = self.table.shape[0]
            return target_verify_attention(
                q.reshape(rows, -1), self.token_to_kv_pool.get_key_buffer(layer.layer_id),
                self.token_to_kv_pool.get_value_buffer(layer.layer_id), self.table,
                torch.arange(rows), torch.tensor(self.lengths) - 1,
                self.table[torch.arange(rows), torch.tensor(self.lengths) - 1], None, 1, layer.tp_q_head_num,
                layer.scaling)

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

    class CompressedTorchNativeDraftStepBackend(DraftStepSlots, CompressedTorchNativeAttnBackend):
        def __init__(self, model_runner, topk: int, num_steps: int, step: int):
            super().__init__(model_runner)
            self.init_step_slots(topk, num_steps, step)

        def init_forward_metadata(self, forward_batch):
            super().init_forward_metadata(forward_batch)
            if self.plan_step_slots(forward_batch):
                self.plan = plan_decode(self.table, list(range(len(self.lengths))), self.lengths)
                self.padded = pad_batch(self.plan, new_tokens=False)

        def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
            self.check_step_slots_once(forward_batch)
            return super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)

    _compressed_step_cls = CompressedTorchNativeDraftStepBackend
    return _compressed_step_cls


def _compressed_planes(model_runner):
    """The `CompressedMHATokenToKVPool` behind the draft runner's pool: the pool itself, or on a hybrid
    linear-attention model (Qwen3.5's MTP draft) the full-attention sub-pool of SGLang's `HybridLinearKVPool`;
    None over dense KV."""
    from sglang_ext.kvcache.pool import CompressedMHATokenToKVPool

    pool = getattr(model_runner, "token_to_kv_pool", None)
    if isinstance(pool, compat.HybridLinearKVPool):
        pool = getattr(pool, "full_kv_pool", None)
    return pool if isinstance(pool, CompressedMHATokenToKVPool) else None


def _is_compressed(model_runner) -> bool:
    return _compressed_planes(model_runner) is not None


class TorchNativeMultiStepDraftBackend:
    """The per-step container DraftBackendFactory.create_decode_backend returns (`attn_backends[step]`)."""

    def __init__(self, model_runner, topk: int, speculative_num_steps: int):
        if topk < 1:
            raise ValueError(f"--speculative-eagle-topk must be at least 1 (got {topk})")
        cls = _compressed_draft_step_backend_cls() if _is_compressed(model_runner) else _draft_step_backend_cls()
        self.topk = topk
        self.speculative_num_steps = speculative_num_steps
        self.attn_backends = [cls(model_runner, topk, speculative_num_steps, step)
                              for step in range(speculative_num_steps - 1)]

    def init_forward_metadata(self, forward_batch) -> None:
        for backend in self.attn_backends:
            backend.init_forward_metadata(forward_batch)


def add_torch_native(original, factory, backend_name, backend_map, error_template, stamps_children=False):
    """AROUND DraftBackendFactory._create_backend: offer `torch_native` next to SGLang's own entries; over a
    compressed draft pool the `triton` entries build our compressed backends (the CPU platform runs them under
    TRITON_INTERPRET=1) and every other SGLang entry refuses, as on GPU platforms."""
    runner = factory.draft_model_runner
    if _is_compressed(runner):
        backend_map = _compressed_triton_map(factory, backend_name, backend_map)
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


def _refuse(runner, backend_type: str):
    def create():
        raise ValueError(
            f"--kv-cache-dtype {_compressed_planes(runner).kv_format.name}: draft attention backend {backend_type!r} "
            "cannot read this format; use --speculative-draft-attention-backend triton (GPU) or torch_native (CPU)")
    return create


def compressed_triton_draft(original, factory, backend_name, backend_map, error_template, stamps_children=False):
    """AROUND DraftBackendFactory._create_backend on GPU platforms: over a compressed draft pool, the `triton`
    entries build our compressed backends and every other entry refuses."""
    runner = factory.draft_model_runner
    if not _is_compressed(runner):
        return original(factory, backend_name, backend_map, error_template, stamps_children)
    return original(factory, backend_name, _compressed_triton_map(factory, backend_name, backend_map),
                    error_template, stamps_children)


def _compressed_triton_map(factory, backend_name, backend_map):
    """backend_map with its `triton` entry building our compressed backends and every other entry refusing."""
    from sglang_ext.kvcache.triton_backend import CompressedTritonAttnBackend, value_buffer_shape_only

    runner = factory.draft_model_runner
    if backend_name == "decode_attention_backend":
        def create():
            # SGLang's container builds a TritonAttnBackend per step, whose constructor reads the pool's value
            # buffer shape; those step backends are replaced by ours at once.
            with value_buffer_shape_only(_compressed_planes(runner)):  # a hybrid pool asks its sub-pool
                multi = compat.TritonMultiStepDraftBackend(runner, factory.topk, factory.speculative_num_steps)
            multi.attn_backends = [
                CompressedTritonAttnBackend(runner, skip_prefill=True, kv_indptr_buf=multi.kv_indptr[i])
                for i in range(factory.speculative_num_steps - 1)
            ]
            return "triton", multi
    else:
        def create():
            return "triton", CompressedTritonAttnBackend(runner, skip_prefill=False)
    return {name: (create if name == "triton" else _refuse(runner, name)) for name in backend_map}
