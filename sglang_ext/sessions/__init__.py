"""Agent sessions: multi-turn chat prefixes that come back warm, and `--session-retention-seconds`.

`policy.py` is core (which nodes are retained, the eviction order; no sglang import); `radix_cache.py` and
`server_args.py` are the SGLang-facing glue. `register()` is called by `sglang_ext.plugin` in every process.
"""

_registered = False


def register() -> list[str]:
    """Add the flag hooks and the radix-cache backend; returns what was registered ([] on a repeated call)."""
    global _registered
    if _registered:
        return []
    from sglang_ext.sessions import radix_cache, server_args

    server_args.register_hooks()
    radix_cache.register_backend()
    _registered = True
    return [server_args.FLAG]
