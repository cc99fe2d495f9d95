"""Start-up checks that turn deep stack traces into one clear line.

Installed as a BEFORE hook on SGLang's server-argument resolution, so they run in the launcher before any
weights, tokenizer or hub lookup is touched.
"""

import sys
from pathlib import Path

from sglang_ext import compat, hook_chain


class StartupError(SystemExit):
    """Printed as one line on stderr; the launcher exits with status 2 and no traceback."""

    def __init__(self, message: str):
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


def _before_resolve(server_args, *args, **kwargs):
    check_model_path(server_args.model_path)
    check_environment()
    return None


def register() -> list[str]:
    hook_chain.register(compat.HOOK_SERVER_ARGS_RESOLVE, _before_resolve, compat.HookType.BEFORE)
    return ["start-up checks"]
