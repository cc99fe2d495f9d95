"""Llama-family models with tied embeddings under pipeline parallelism (glue: imports sglang).

In SGLang 0.5.23 `LlamaForCausalLM.__init__` sets `lm_head = model.embed_tokens` when the config ties the
embeddings, but on every PP rank but the first `embed_tokens` is a `PPMissingLayer` (an Identity without
weights), so the last rank's logits processor has no weight to multiply by and the first decode step fails.
SmolLM2 (tied, LlamaForCausalLM) hits this at --pp-size >= 2. Qwen2/Qwen3 do it right: on the last rank
they build a separate `ParallelLMHead` and fill it from the checkpoint's embedding tensor. These two hooks
do the same for the Llama family, only when the config is tied, pp > 1 and the rank is the last one:
  * after `__init__`: replace `lm_head` with a `ParallelLMHead` (vocab x hidden, sharded over TP);
  * around `load_weights`: feed `model.embed_tokens.weight` to that head's weight loader (the last rank has
    no embedding of its own to load it into).
"""

from __future__ import annotations

import importlib
import multiprocessing
from typing import Any, Callable, Iterable

from sglang_ext import compat, hook_chain

LLAMA_MODULE = compat.LLAMA_MODULE
HOOK_INIT = compat.HOOK_LLAMA_INIT
HOOK_LOAD_WEIGHTS = compat.HOOK_LLAMA_LOAD_WEIGHTS
EMBED_WEIGHT_NAME = compat.LLAMA_EMBED_WEIGHT_NAME

_registered = False


def register(launcher_too: bool = False) -> list[str]:
    """Install both hooks; returns what was registered ([] on a repeated call). Applied by SGLang's
    load_plugins() or HookRegistry.apply_hooks(). Models are built only in the spawned scheduler processes,
    so the launcher (no parent process) skips it unless `launcher_too`: applying the hooks imports
    sglang.srt.models.llama, several seconds of start-up for nothing there."""
    global _registered
    if _registered or (multiprocessing.parent_process() is None and not launcher_too):
        return []
    hook_chain.register(HOOK_INIT, _after_init, compat.HookType.AFTER)
    hook_chain.register(HOOK_LOAD_WEIGHTS, _around_load_weights, compat.HookType.AROUND)
    _registered = True
    return ["tied lm_head under PP (Llama family)"]


def needs_own_lm_head(model: Any) -> bool:
    """Tied embeddings, more than one PP rank, and this is the last one."""
    pp_group = getattr(model, "pp_group", None)
    return (
        pp_group is not None
        and bool(getattr(model.config, "tie_word_embeddings", False))
        and pp_group.world_size > 1
        and pp_group.is_last_rank
    )


def _after_init(_result: Any, model: Any, *args: Any, **kwargs: Any) -> None:
    if not needs_own_lm_head(model):
        return
    llama = importlib.import_module(LLAMA_MODULE)
    prefix = kwargs.get("prefix", args[2] if len(args) > 2 else "")
    model.lm_head = llama.ParallelLMHead(
        model.config.vocab_size,
        model.config.hidden_size,
        quant_config=getattr(model, "quant_config", None),
        prefix=llama.add_prefix("lm_head", prefix),
        use_attn_tp_group=llama.get_parallel().enable_dp_lm_head,
    )


def route_embedding_to_lm_head(
    weights: Iterable[tuple[str, Any]], load_lm_head: Callable[[Any], None]
) -> Iterable[tuple[str, Any]]:
    """Yield `weights` minus the embedding matrix, which goes to `load_lm_head` instead."""
    for name, tensor in weights:
        if name == EMBED_WEIGHT_NAME:
            load_lm_head(tensor)
            continue
        yield name, tensor


def _around_load_weights(original: Callable, model: Any, weights: Iterable[tuple[str, Any]], *args: Any, **kwargs: Any):
    if not needs_own_lm_head(model):
        return original(model, weights, *args, **kwargs)
    head = model.lm_head.weight
    loader = getattr(head, "weight_loader", None) or importlib.import_module(LLAMA_MODULE).default_weight_loader
    seen = []

    def load_head(tensor: Any) -> None:
        loader(head, tensor)
        seen.append(True)

    loaded = original(model, route_embedding_to_lm_head(weights, load_head), *args, **kwargs)
    if seen:
        model._sglang_ext_lm_head_loaded = True
    elif not getattr(model, "_sglang_ext_lm_head_loaded", False):  # later partial updates may omit it
        raise RuntimeError(f"tied embeddings under PP: no {EMBED_WEIGHT_NAME} reached the last rank's lm_head")
    if isinstance(loaded, set):
        loaded.add("lm_head.weight")
    return loaded
