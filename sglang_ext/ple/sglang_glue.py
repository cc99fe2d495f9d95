"""SGLang glue: `--ple-offload-backend ssd` serves PLE tables from the checkpoint's files through `PleTableStore`.

- qwen4_exp (`--ple-offload-embedding --ple-offload-backend ssd`): each PLE layer's n-gram embedding becomes an
  `SsdNgramEmbedding` whose gather reads the rows from the checkpoint's `...ngram_embedding.shard_<i>.weight`
  tensors. The shards are dropped from the weight stream before SGLang's loader touches them (safetensors
  tensors are lazy mmaps, so nothing is read at boot) and the table is never allocated.
- Gemma 3n (`--ple-offload-backend ssd`): `embed_tokens_per_layer` becomes an `SsdScaledEmbedding`; the
  checkpoint tensor is then not a model parameter, so SGLang's loader skips it unread.

How it hooks in: `register()` runs in every SGLang process (the sglang-ext general plugin calls it). It adds
`ssd` to the flag's choices, and patches each model module right after it is first imported (an import hook:
processes that never build the model never import it, and the model module is heavy). Every SGLang private
name used is declared in `sglang_ext/compat.py`; store tuning comes from the environment variables
declared in `sglang_ext/env.py` (`PLE_*`).
"""

from __future__ import annotations

import functools
import logging
import os
import typing

import torch
from torch import nn

from sglang_ext import compat, env, hook_chain
from sglang_ext.import_patch import after_import
from sglang_ext.ple.layout import PleTableError, TableLayout, TensorEntry, index_safetensors_dir
from sglang_ext.ple import qwen4_served_dtype
from sglang_ext.ple.qwen4_table import qwen4_table_layout
from sglang_ext.ple.store import PleStoreConfig, PleTableStore

BACKEND = "ssd"

logger = logging.getLogger(__name__)
_registered = False


def register() -> list[str]:
    """Idempotent; safe in every SGLang process. Returns what it registered (empty on a repeat call)."""
    global _registered
    if _registered:
        return []
    _registered = True
    _add_backend_choice()
    after_import(compat.QWEN4_MODULE, _patch_qwen4)
    after_import(compat.GEMMA3N_MODULE, _patch_gemma3n)
    hook_chain.register(compat.HOOK_UPDATE_INTERMEDIATE_SIZE, _pad_list_intermediate_size,
                        compat.HookType.AROUND)
    for method in ("forward_extend", "forward_decode"):
        hook_chain.register(f"{compat.TORCH_NATIVE_ATTN_BACKEND}.{method}", _flat_q,
                            compat.HookType.AROUND)
    return [f"--ple-offload-backend {BACKEND} (qwen4_exp, gemma3n)", "gemma3n on the cpu platform"]


def store_config(device: torch.device | str) -> PleStoreConfig:
    return PleStoreConfig(
        reader=os.environ.get(env.PLE_READER, "pread"),
        threads=int(os.environ.get(env.PLE_THREADS, "8")),
        cache_bytes=int(float(os.environ.get(env.PLE_CACHE_MB, "0")) * (1 << 20)),
        staging_rows=int(os.environ.get(env.PLE_STAGING_ROWS, "131072")),
        device=str(torch.device(device).type),
    )


# --- the flag -------------------------------------------------------------------------------------------------


def _add_backend_choice() -> None:
    for module_name, class_name in compat.PLE_FLAG_RECORDS:
        record = getattr(__import__(module_name, fromlist=[class_name]), class_name)
        hint = typing.get_type_hints(record, include_extras=True)[compat.PLE_BACKEND_FIELD]
        (arg,) = [m for m in hint.__metadata__ if getattr(m, "choices", None)]
        if BACKEND not in arg.choices:
            arg.choices.append(BACKEND)  # Arg is a frozen struct, its list is not


def selected_backend() -> str | None:
    ctx = __import__(compat.RUNTIME_CONTEXT_MODULE, fromlist=["get_exec"])
    return ctx.get_exec().offload.ple_offload_backend


def checkpoint_entries() -> dict[str, TensorEntry]:
    """Every tensor of the served checkpoint (headers only), under the names SGLang's loaders match."""
    ctx = __import__(compat.RUNTIME_CONTEXT_MODULE, fromlist=["get_model"])
    path = ctx.get_model().model_path
    if not os.path.isdir(path):
        from huggingface_hub import snapshot_download

        path = snapshot_download(path, local_files_only=True)
    return {_rename(n): e for n, e in index_safetensors_dir(path).items()}


def _rename(name: str) -> str:
    for old, new in compat.CKPT_NAME_RENAMES:
        name = name.replace(old, new)
    return name


def _pad_list_intermediate_size(original, model_config, attr_name, padding):
    """Gemma 3n's intermediate_size is a list: pad each entry the way SGLang pads an int one."""
    hf = getattr(model_config, "hf_config", None)
    holder = getattr(hf, "text_config", hf)
    value = getattr(holder, attr_name, None)
    if not isinstance(value, (list, tuple)):
        return original(model_config, attr_name, padding)
    padded = [-(-int(v) // padding) * padding for v in value]
    if padded != list(value):
        setattr(holder, attr_name, padded)
    return model_config


def _flat_q(original, backend, q, *args, **kwargs):
    if q.dim() == 3:
        q = q.reshape(q.shape[0], -1)
    return original(backend, q, *args, **kwargs)


# --- Gemma 3n -------------------------------------------------------------------------------------------------


class SsdScaledEmbedding(nn.Module):
    """Drop-in for Gemma's scaled embedding: `table[ids] * embed_scale`, rows read from the checkpoint."""

    def __init__(self, store: PleTableStore, embed_scale: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.store, self.embed_scale, self.dtype = store, embed_scale, dtype
        self.num_embeddings, self.embedding_dim = store.num_rows, store.dim

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # Same values as F.embedding on the table loaded in `dtype`: the cast is the loader's, then a copy.
        return self.store.gather(input_ids).to(device=input_ids.device, dtype=self.dtype) * self.embed_scale


def open_gemma3n_table(entries: dict[str, TensorEntry], prefix: str, num_rows: int, dim: int,
                       device: torch.device | str) -> PleTableStore:
    name = f"{prefix}.{compat.GEMMA3N_PLE_ATTR}.weight" if prefix else f"{compat.GEMMA3N_PLE_ATTR}.weight"
    if name not in entries:
        raise PleTableError(f"--ple-offload-backend {BACKEND}: tensor {name} not in the checkpoint")
    layout = TableLayout.from_entries([entries[name]], expected_rows=num_rows, expected_dim=dim)
    return PleTableStore(layout, store_config(device))


def _patch_gemma3n(module) -> None:
    cls = getattr(module, compat.GEMMA3N_TEXT_MODEL)
    original_init = cls.__init__

    @functools.wraps(original_init)  # SGLang's signature stays visible to inspect (compat's signature check)
    def __init__(self, config, quant_config=None, prefix: str = "") -> None:
        original_init(self, config, quant_config=quant_config, prefix=prefix)
        if selected_backend() != BACKEND:
            return
        old = getattr(self, compat.GEMMA3N_PLE_ATTR)
        store = open_gemma3n_table(checkpoint_entries(), "model", old.num_embeddings, old.embedding_dim,
                                   old.weight.device)
        # The old table was torch.empty and never written: dropping it frees nothing that was resident.
        setattr(self, compat.GEMMA3N_PLE_ATTR, SsdScaledEmbedding(store, old.embed_scale, old.weight.dtype))
        logger.info("PLE: Gemma 3n per-layer embeddings (%d x %d %s) served from %s", store.num_rows, store.dim,
                    store.dtype, store.layout.segments[0].path)

    cls.__init__ = __init__


# --- qwen4_exp ------------------------------------------------------------------------------------------------


def _patch_qwen4(module) -> None:
    qwen4_served_dtype.patch(module, ssd_backend=BACKEND)
    host_cls = getattr(module, compat.QWEN4_HOST_EMBEDDING)
    ssd_cls = type("SsdNgramEmbedding", (host_cls,), {"__init__": _ssd_ngram_init, "gather": _ssd_ngram_gather,
                                                      "__module__": __name__})
    setattr(module, compat.QWEN4_HOST_EMBEDDING, ssd_cls)
    top = getattr(module, compat.QWEN4_TOP_MODEL)
    original_load = top.load_weights

    @functools.wraps(original_load)
    def load_weights(self, weights):
        ssd = {name: m for name, m in self.named_modules() if isinstance(getattr(m, "ngram_embedding", None), ssd_cls)
               and getattr(m.ngram_embedding, "_ssd_pending", False)}
        if not ssd:
            return original_load(self, weights)
        _open_qwen4_tables(self, ssd)

        def skip_ssd_shards(stream):
            for name, tensor in stream:  # tensors are lazy mmaps: skipping one reads nothing
                renamed = _rename(name)
                if compat.QWEN4_SHARD_MARK in renamed and renamed[: renamed.index(compat.QWEN4_SHARD_MARK)] in ssd:
                    continue
                yield name, tensor

        loaded = original_load(self, skip_ssd_shards(weights))
        return set(loaded) | {f"{p}.ngram_embedding.weight" for p in ssd}

    top.load_weights = load_weights


def _ssd_ngram_init(self, embedding, *, backend: str = "pinned", table_dir=None) -> None:
    base = type(self).__mro__[1]
    if backend != BACKEND:
        base.__init__(self, embedding, backend=backend, table_dir=table_dir)
        return
    nn.Module.__init__(self)
    for name in getattr(base, compat.QWEN4_COPIED_ATTRS):
        setattr(self, name, getattr(embedding, name))
    if embedding.weight.dtype not in (torch.bfloat16, torch.float8_e4m3fn):
        raise TypeError(f"PLE table must be bfloat16 or float8_e4m3fn, got {embedding.weight.dtype}")
    self.quant_method = None
    # Metadata only: the table stays in the checkpoint's files.
    self.register_parameter("weight", nn.Parameter(torch.empty(embedding.weight.shape, dtype=embedding.weight.dtype,
                                                               device="meta"), requires_grad=False))
    self.register_buffer("weight_scale", embedding.weight_scale, persistent=True)
    self._ssd_pending = True
    self._ssd_store = None


def _ssd_ngram_gather(self, input_ids: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    if getattr(self, "_ssd_pending", False):
        raise RuntimeError("PLE table gathered before load_weights opened its SSD store")
    if getattr(self, "_ssd_store", None) is None:  # a pinned/file instance of the swapped-in class
        return type(self).__mro__[1].gather(self, input_ids, out)
    if self.tp_size == 1:
        rows = self._ssd_store.gather(input_ids)
        if out is None:
            return rows.to(device=input_ids.device, dtype=torch.bfloat16)
        out.copy_(rows)  # fp8 -> bf16 is exact, as in SGLang's gather kernel
        return out
    # Tensor parallel: as SGLang's gather kernel, this rank returns the rows of its vocabulary shard and zeros for
    # the others; the layer's reduce() sums the ranks' outputs (x + 0 is exact). Each rank reads only its rows.
    if out is None:
        out = torch.empty((*input_ids.shape, self.embedding_dim), dtype=torch.bfloat16, device=input_ids.device)
    flat = input_ids.reshape(-1)
    mine = (flat >= self.shard_indices.org_vocab_start_index) & (flat < self.shard_indices.org_vocab_end_index)
    rows = out.view(-1, self.embedding_dim)
    rows.zero_()
    if bool(mine.any()):
        rows[mine] = self._ssd_store.gather(flat[mine]).to(device=rows.device, dtype=torch.bfloat16)
    return out


def _open_qwen4_tables(model, ssd_modules: dict) -> None:
    """Open one store per PLE layer, checking shape and dtype against the model before any weight loads."""
    entries = checkpoint_entries()
    text_config = getattr(model.config, "text_config", model.config)
    split_parts = int(getattr(text_config, "split_ngram_parts", compat.QWEN4_DEFAULT_SPLIT_PARTS))
    for prefix, ngram in ssd_modules.items():
        emb = ngram.ngram_embedding
        layout = qwen4_table_layout(entries, prefix, padded_rows=emb.org_vocab_size, split_parts=split_parts,
                                    min_rows=int(ngram.ngram_heads_vocab_sizes.sum()), dim=emb.embedding_dim,
                                    dtype=emb.weight.dtype)
        emb._ssd_store = PleTableStore(layout, store_config(emb.weight_scale.device))
        emb._ssd_pending = False
        logger.info("PLE: %s served from %d shard tensor(s), %.2f GiB", prefix, len(layout.segments),
                    layout.nbytes / 2**30)
