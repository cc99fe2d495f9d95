"""`--session-retention-seconds N` for stock `python -m sglang.launch_server` (glue: imports sglang).

Two ServerArgs hooks, like `--pp-layer-partition`:
  * after `add_cli_args(parser)`: adds the flag (a bad value is an argparse error naming the flag);
  * after `from_cli_args(args)`: with N > 0, selects the `sglang_ext_session_retention` radix-cache backend
    and exports N as SGLANG_EXT_SESSION_RETENTION_SECONDS for the scheduler processes (spawned later, they
    inherit it and build the radix cache). N = 0 (the default) changes nothing.
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from sglang_ext import compat, env, hook_chain
from sglang_ext.sessions.policy import RetentionConfigError, parse_retention_seconds
from sglang_ext.sessions.radix_cache import BACKEND_NAME, LOG_PREFIX

FLAG = "--session-retention-seconds"
DEST = "session_retention_seconds"

logger = logging.getLogger(__name__)


def _flag_value(text: str) -> float:
    try:
        return parse_retention_seconds(text)
    except RetentionConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def add_flag(_result: Any, parser: argparse.ArgumentParser) -> None:
    if any(action.dest == DEST for action in parser._actions):  # stdlib's list of the parser's actions
        return
    parser.add_argument(
        FLAG,
        dest=DEST,
        type=_flag_value,
        default=0.0,
        help="Agent sessions: keep the prefixes of sessions active in the last N seconds (a reused prefix and "
        "the newest turn extending it) from being dropped: the device pool evicts everything else first, and "
        "with --enable-hierarchical-cache they are demoted to the host tier and leave it last. 0 (default) = "
        "off. Uses the radix-cache backend " + BACKEND_NAME + " (sglang_ext); see docs/agent-sessions.md.",
    )


def apply_flag(_result: Any, _cls: type, args: argparse.Namespace) -> None:
    """AFTER hook of ServerArgs.from_cli_args: `_result` is the ServerArgs built from `args`."""
    seconds = getattr(args, DEST, 0.0) or 0.0
    if seconds == 0:
        os.environ.pop(env.SESSION_RETENTION_SECONDS, None)  # no stale value reaches the schedulers
        return
    if _result.disable_radix_cache:
        raise RetentionConfigError(f"{FLAG} needs the radix cache; drop --disable-radix-cache")
    backend = _result.radix_cache_backend
    if backend not in (None, BACKEND_NAME):
        raise RetentionConfigError(
            f"{FLAG} selects --radix-cache-backend {BACKEND_NAME}; it cannot be combined with "
            f"--radix-cache-backend {backend}"
        )
    _result.radix_cache_backend = BACKEND_NAME
    os.environ[env.SESSION_RETENTION_SECONDS] = repr(seconds)
    logger.info("%s %s %g -> --radix-cache-backend %s", LOG_PREFIX, FLAG, seconds, BACKEND_NAME)


def register_hooks() -> None:
    hook_chain.register(compat.HOOK_SERVER_ARGS_ADD_CLI_ARGS, add_flag, compat.HookType.AFTER)
    hook_chain.register(compat.HOOK_SERVER_ARGS_FROM_CLI_ARGS, apply_flag, compat.HookType.AFTER)
