"""Start-up checks that turn deep stack traces into one clear line.

Installed as a BEFORE hook on SGLang's server-argument resolution, so they run in the launcher before any
weights, tokenizer or hub lookup is touched.
"""

import json
import sys
from pathlib import Path

from sglang_ext import compat, hook_chain


class StartupError(SystemExit):
    """Printed as one line on stderr; the launcher exits with status 2 and no traceback."""

    def __init__(self, message: str):
        self.message = message
        print(f"sglang-ext: error: {message}", file=sys.stderr, flush=True)
        super().__init__(2)


def looks_like_local_path(model_path: str) -> bool:
    return model_path.startswith(("/", "./", "../", "~")) or Path(model_path).exists()


def check_model_path(model_path: str | None) -> None:
    if not model_path or not looks_like_local_path(model_path):
        return  # a hub id: SGLang/transformers resolve it (offline: from the local HF cache)
    folder = Path(model_path).expanduser()
    if not folder.exists():
        raise StartupError(f"--model-path {model_path}: no such folder")
    if folder.is_dir() and not (folder / "config.json").is_file():
        raise StartupError(f"--model-path {model_path}: folder has no config.json (not a Hugging Face model folder)")


def check_environment() -> None:
    """sglang-ext's own environment variables with a fixed set of values: a typo stops the launcher here, not the
    scheduler at its first prefill."""
    from sglang_ext.kvcache.new_token_reads import extend_reads_pool

    try:
        extend_reads_pool()
    except ValueError as e:
        raise StartupError(str(e)) from None


def has_linear_attention(model_path: str | None) -> bool:
    """True for a local checkpoint whose config (or text config) declares linear-attention (Gated DeltaNet) layers."""
    if not model_path or not looks_like_local_path(model_path):
        return False
    config_file = Path(model_path).expanduser() / "config.json"
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError):
        return False  # SGLang reports an unreadable config itself
    for cfg in (config, config.get("text_config") or {}):
        if "linear_attention" in (cfg.get("layer_types") or ()):
            return True
    return False


def check_hybrid_dtype(server_args) -> None:
    """On the portable GPU platform a linear-attention hybrid runs SGLang's chunked Gated DeltaNet prefill kernel,
    which asserts bf16 / fp16 at the first prefill: refuse --dtype float32 before anything loads."""
    from sglang_ext.platform import gpu_platform_active

    if server_args.dtype in ("float32", "float") and gpu_platform_active() and has_linear_attention(
            server_args.model_path):
        raise StartupError(f"--dtype {server_args.dtype}: {server_args.model_path} has Gated DeltaNet layers, whose "
                           "GPU prefill kernel takes bfloat16 or float16 only (use --dtype bfloat16)")


def has_qsa_indexer(model_path: str | None) -> bool:
    """True for a local checkpoint whose config (or text config) declares a QSA indexer (qwen4_exp)."""
    if not model_path or not looks_like_local_path(model_path):
        return False
    try:
        config = json.loads((Path(model_path).expanduser() / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return any("indexer_compress_ratio" in cfg for cfg in (config, config.get("text_config") or {}))


def check_qsa_spec_host_tier(server_args) -> None:
    """On the portable CPU platform qwen4_exp with speculative decoding and the HiCache host tier together stopped
    scheduling after the first requests (each pair alone serves): refuse the three together."""
    from sglang_ext.platform import cpu_platform_active

    if (server_args.speculative_algorithm and server_args.enable_hierarchical_cache and cpu_platform_active()
            and has_qsa_indexer(server_args.model_path)):
        raise StartupError(f"--speculative-algorithm {server_args.speculative_algorithm} with "
                           "--enable-hierarchical-cache is not supported for QSA models (qwen4_exp) on the CPU "
                           "platform; drop one of them")


def _before_resolve(server_args, *args, **kwargs):
    check_model_path(server_args.model_path)
    check_environment()
    check_hybrid_dtype(server_args)
    check_qsa_spec_host_tier(server_args)
    return None


def register() -> list[str]:
    hook_chain.register(compat.HOOK_SERVER_ARGS_RESOLVE, _before_resolve, compat.HookType.BEFORE)
    return ["start-up checks"]
