"""The `sglang.srt.plugins` entry point, loaded by SGLang in every process (launcher, scheduler, detokenizer).

Each feature exposes `register()`, returning what it registered; this module calls them once per process
and logs one line in the launcher process naming the sglang-ext version and what was registered.
"""

import logging
import multiprocessing
import sys

import sglang_ext

logger = logging.getLogger("sglang_ext")

_registered: list[str] = []


def load() -> None:
    if _registered:
        return
    from sglang_ext import hicache, kvcache, sessions, spec, startup_checks
    from sglang_ext.platform import hooks as platform_hooks
    from sglang_ext.ple import sglang_glue as ple_glue
    from sglang_ext.pp import server_args as pp_server_args
    from sglang_ext.pp import tied_lm_head

    _registered.append(f"sglang-ext {sglang_ext.__version__}")
    features = (startup_checks, platform_hooks, kvcache, hicache, pp_server_args, tied_lm_head, ple_glue, sessions, spec)
    for feature in features:
        _registered.extend(feature.register())
    if multiprocessing.parent_process() is None:
        # SGLang configures logging after plugins load, so this line gets its own handler.
        print(f"[sglang-ext] {sglang_ext.__version__} registered: {', '.join(_registered[1:]) or 'nothing'}",
              file=sys.stderr, flush=True)


def registered() -> list[str]:
    return list(_registered)
