"""The `sglang.srt.plugins` entry point, loaded by SGLang in every process (launcher, scheduler, detokenizer).

Each feature exposes `register()`, returning what it registered; this module calls them once per process.
Every feature hooks SGLang through `hook_chain` (one HookRegistry hook per target). Right after SGLang applied
the hooks, `hook_check.verify` checks that each of them and each import-time patch is in place; if one is not,
the process stops with one line (exit status 2) instead of serving with a feature silently off. Each process
then prints one line: the launcher names the sglang-ext version and what was registered, every process says
how many hooks it verified.
"""

import logging
import multiprocessing
import os
import sys
import traceback

import sglang_ext

logger = logging.getLogger("sglang_ext")

_registered: list[str] = []


def load() -> None:
    if _registered:
        return
    from sglang_ext import compat
    from sglang_ext.startup_checks import StartupError

    _registered.append(f"sglang-ext {sglang_ext.__version__}")
    try:
        _register_features()
    except Exception as exc:  # SGLang's load_plugins would log it and serve without the features
        traceback.print_exc(file=sys.stderr)
        raise StartupError(f"sglang-ext {sglang_ext.__version__} failed to load on SGLang "
                           f"{compat.installed_sglang_version()}: {type(exc).__name__}: {exc}") from exc
    compat.run_after_apply_hooks(_after_hooks_applied)


def _register_features() -> None:
    from sglang_ext import hicache, hybrid, kvcache, sessions, spec, startup_checks
    from sglang_ext.moe import sglang_glue as moe_glue
    from sglang_ext.platform import hooks as platform_hooks
    from sglang_ext.ple import sglang_glue as ple_glue
    from sglang_ext.pp import server_args as pp_server_args
    from sglang_ext.pp import tied_lm_head

    features = (startup_checks, platform_hooks, kvcache, hicache, pp_server_args, tied_lm_head, ple_glue, sessions,
                spec, hybrid, moe_glue)
    for feature in features:
        _registered.extend(feature.register())


def _after_hooks_applied() -> None:
    """Run by SGLang's HookRegistry.apply_hooks (wrapped) once it applied every plugin's hooks."""
    from sglang_ext import hook_check
    from sglang_ext.startup_checks import StartupError

    try:
        check = hook_check.verify()
    except hook_check.HookCheckError as exc:
        raise StartupError(str(exc)) from exc
    verified = f"hooks verified: {check.hook_targets} targets, {check.import_patches} import-time patches"
    # SGLang configures logging after plugins load, so these lines get their own handler.
    if multiprocessing.parent_process() is None:
        print(f"[sglang-ext] {sglang_ext.__version__} registered: {', '.join(_registered[1:]) or 'nothing'}; "
              f"{verified}", file=sys.stderr, flush=True)
    else:
        print(f"[sglang-ext] process {os.getpid()}: {verified}", file=sys.stderr, flush=True)


def registered() -> list[str]:
    return list(_registered)
