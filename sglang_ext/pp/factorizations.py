"""Which (TP, PP) shapes SGLang 0.5.23 can run a model with. Core: never imports sglang."""

from __future__ import annotations

from .model_shape import ModelShape


def tp_problems(shape: ModelShape, tp: int) -> list[str]:
    """Why SGLang 0.5.23 cannot shard this model over `tp` GPUs (empty: it can). Rules of its attention
    layers (models/llama.py, qwen3.py): heads % tp == 0; kv_heads % tp == 0 when kv_heads >= tp, otherwise
    tp % kv_heads == 0 (each KV head is then replicated on tp / kv_heads GPUs)."""
    problems = []
    if shape.num_heads % tp:
        problems.append(f"{shape.num_heads} attention heads not divisible by tp {tp}")
    kv = shape.num_kv_heads
    if not shape.mla_kv_dim and ((kv >= tp and kv % tp) or (kv < tp and tp % kv)):
        problems.append(f"{kv} KV heads: tp {tp} neither divides them nor is a multiple of them")
    for what, size in shape.divisibility:
        if size % tp:
            problems.append(f"{what} {size} not divisible by tp {tp}")
    return problems


def valid_tp_sizes(shape: ModelShape, limit: int = 16) -> list[int]:
    """The TP sizes up to `limit` that `tp_problems` accepts, ascending."""
    return [tp for tp in range(1, limit + 1) if not tp_problems(shape, tp)]


def tp_refusal(shape: ModelShape, tp: int) -> str | None:
    """One line saying why `--tp-size tp` cannot shard this model and which sizes can; None when it can."""
    problems = tp_problems(shape, tp)
    if not problems:
        return None
    sizes = ", ".join(map(str, valid_tp_sizes(shape)))
    return f"--tp-size {tp} cannot shard this model ({'; '.join(problems)}); tp sizes that can: {sizes}"


def pp_problems(shape: ModelShape, pp: int) -> list[str]:
    """Why no `pp`-stage partition exists (empty: one does): make_layers needs a layer per stage, and the
    layers reading raw input ids must all fit on stage 0 with a layer left for every later stage."""
    problems = []
    if pp > shape.num_layers:
        problems.append(f"pp {pp} exceeds the {shape.num_layers} layers")
    if pp > 1 and shape.raw_id_layers and max(shape.raw_id_layers) >= shape.num_layers - (pp - 1):
        problems.append(f"layers reading raw input ids ({shape.raw_id_reason}) leave no layer for stages 1..{pp - 1}")
    return problems


def factorizations(num_gpus: int) -> list[tuple[int, int]]:
    """Every (tp, pp) with tp * pp == num_gpus, by increasing tp."""
    return [(tp, num_gpus // tp) for tp in range(1, num_gpus + 1) if num_gpus % tp == 0]
