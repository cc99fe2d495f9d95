"""`--pp-layer-partition auto | a,b,c` for stock `python -m sglang.launch_server` (glue: imports sglang).

`register()` (called by the sglang_ext general plugin in every SGLang process, before the launcher parses its
arguments) hooks two ServerArgs methods:
  * after `add_cli_args(parser)`: adds the flag, so SGLang's own parser accepts it and rejects bad syntax;
  * after `from_cli_args(args)`: checks an explicit list against --pp-size and the model's config (one-line
    PartitionError), or plans `auto`, and exports the result as SGLANG_PP_LAYER_PARTITION. The scheduler
    processes are spawned after this and inherit the variable, which `get_pp_indices` reads.
Without the flag, a hand-set SGLANG_PP_LAYER_PARTITION keeps working; it is checked the same way when the
model's config.json can be read.
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from .devices import visible_gpu_memory_gib
from .factorizations import tp_refusal
from .loading import load_shape
from .model_shape import ModelShape
from .partition import PartitionError, check_partition, default_partition, format_partition, parse_partition
from .planner import PlanOptions, evaluate_default, plan_partition

from sglang_ext import compat, hook_chain

HOOK_ADD_CLI_ARGS = compat.HOOK_SERVER_ARGS_ADD_CLI_ARGS
HOOK_FROM_CLI_ARGS = compat.HOOK_SERVER_ARGS_FROM_CLI_ARGS
PARTITION_ENV = compat.ENV_PP_LAYER_PARTITION

FLAG = "--pp-layer-partition"
DEST = "pp_layer_partition"
AUTO = "auto"

logger = logging.getLogger(__name__)
_registered = False


def register() -> list[str]:
    """Install the two hooks; returns what was registered ([] on a repeated call). Inside SGLang's
    load_plugins() they are applied right after; elsewhere call `HookRegistry.apply_hooks()`."""
    global _registered
    if _registered:
        return []
    hook_chain.register(HOOK_ADD_CLI_ARGS, _add_flag, compat.HookType.AFTER)
    hook_chain.register(HOOK_FROM_CLI_ARGS, _apply_flag, compat.HookType.AFTER)
    _registered = True
    return [FLAG]


def _flag_value(text: str) -> str | tuple[int, ...]:
    if text.strip() == AUTO:
        return AUTO
    try:
        return parse_partition(text)
    except PartitionError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _add_flag(_result: Any, parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        FLAG,
        dest=DEST,
        type=_flag_value,
        default=None,
        help="Layers per pipeline stage: 'auto' plans the split that maximises the KV cache capacity "
        "(sglang_ext planner), or a comma-separated list such as 8,11,11 (checked against --pp-size and the "
        "model). Sets SGLANG_PP_LAYER_PARTITION.",
    )


def _ple_offloaded(args: argparse.Namespace) -> bool:
    """qwen4_exp's n-gram PLE tables stay in host memory or on SSD (the ssd backend implies the offload)."""
    from sglang_ext.ple.sglang_glue import BACKEND

    return bool(getattr(args, "ple_offload_embedding", False)) or getattr(args, "ple_offload_backend", None) == BACKEND


def _model_shape(args: argparse.Namespace) -> ModelShape:
    """Shape of --model-path: a local folder, else config.json from the Hugging Face cache / hub."""
    path = str(args.model_path)
    if os.path.exists(path):
        return load_shape(path, ple_offloaded=_ple_offloaded(args))
    from huggingface_hub import hf_hub_download

    config_file = hf_hub_download(path, "config.json", revision=getattr(args, "revision", None))
    return load_shape(config_file, ple_offloaded=_ple_offloaded(args))


def _stage_gpu_memory(args: argparse.Namespace, num_gpus: int) -> tuple[float, ...] | None:
    """GiB of the GPUs this launch uses (base_gpu_id, base_gpu_id + gpu_id_step, ...), None if unknown."""
    sizes = visible_gpu_memory_gib()
    if sizes is None:
        return None
    base, step = int(getattr(args, "base_gpu_id", 0) or 0), int(getattr(args, "gpu_id_step", 1) or 1)
    ids = [base + i * step for i in range(num_gpus)]
    if ids[-1] >= len(sizes):
        return None
    return tuple(sizes[i] for i in ids)


def resolve_partition(value: str | tuple[int, ...], args: argparse.Namespace) -> str:
    """The SGLANG_PP_LAYER_PARTITION text for a flag value; raises PartitionError (one line) if it cannot run."""
    pp, tp = int(args.pp_size), int(args.tp_size)
    if value != AUTO:
        if len(value) != pp:  # needs no config: say so before reading one
            check_partition(value, pp, sum(value))
        shape = _model_shape(args)
        check_partition(value, pp, shape.num_layers, shape.raw_id_layers, shape.raw_id_reason)
        return format_partition(value)
    shape = _model_shape(args)
    if pp == 1:
        return format_partition((shape.num_layers,))
    mem = _stage_gpu_memory(args, tp * pp)
    opts = PlanOptions(
        gpu_mem_gib=mem,
        kv_cache_dtype=str(getattr(args, "kv_cache_dtype", "auto") or "auto"),
        mem_fraction_static=getattr(args, "mem_fraction_static", None),
        max_mamba_cache_size=getattr(args, "max_mamba_cache_size", None),
        paged_experts_num_resident=(
            getattr(args, "paged_experts_num_resident", None) if getattr(args, "enable_paged_experts", False) else None
        ),
    )
    plan = plan_partition(shape, tp, pp, opts)
    default = evaluate_default(shape, tp, pp, opts)
    if mem is None:
        logger.info(
            "%s auto -> %s (GPU memory unknown: fewest KV layers on the fullest stage, then modelled time; "
            "SGLang's default would be %s)",
            FLAG, format_partition(plan.partition), format_partition(default_partition(shape.num_layers, pp)),
        )
    else:
        logger.info(
            "%s auto -> %s: KV capacity %s tokens (SGLang's default split %s: %s tokens)",
            FLAG,
            format_partition(plan.partition),
            plan.capacity,
            format_partition(default.partition),
            default.capacity,
        )
    return format_partition(plan.partition)


def _apply_flag(_result: Any, _cls: type, args: argparse.Namespace) -> None:
    _check_tp(args)
    value = getattr(args, DEST, None)
    env = os.environ.get(PARTITION_ENV)
    if value is None:
        if env is not None and int(getattr(args, "pp_size", 1)) > 1:
            _check_env(env, args)
        return
    text = resolve_partition(value, args)
    if env is not None and env != text:
        logger.warning("%s=%s replaced by %s %s", PARTITION_ENV, env, FLAG, text)
    os.environ[PARTITION_ENV] = text
    logger.info("%s=%s (from %s)", PARTITION_ENV, text, FLAG)


def _check_tp(args: argparse.Namespace) -> None:
    """Refuse a --tp-size the model's heads cannot be split over, in one line, when config.json is local.
    SGLang itself fails later and deep (SmolLM2's 3 KV heads at tp 2: a weight-loader `narrow` error)."""
    tp = int(getattr(args, "tp_size", 1) or 1)
    if tp == 1 or not os.path.exists(str(args.model_path)):
        return
    refusal = tp_refusal(load_shape(str(args.model_path)), tp)
    if refusal:
        from sglang_ext.startup_checks import StartupError

        raise StartupError(refusal)


def _check_env(env: str, args: argparse.Namespace) -> None:
    """Check a hand-set SGLANG_PP_LAYER_PARTITION when the model's config.json is local."""
    if not os.path.exists(str(args.model_path)):
        return
    shape = load_shape(str(args.model_path))
    check_partition(parse_partition(env), int(args.pp_size), shape.num_layers, shape.raw_id_layers, shape.raw_id_reason)
