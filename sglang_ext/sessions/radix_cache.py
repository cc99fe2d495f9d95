"""The session-retention radix cache (glue: imports sglang, through `sglang_ext.compat`).

Registered in SGLang's radix-cache backend registry as `sglang_ext_session_retention`; the launcher selects it
when `--session-retention-seconds N` is > 0 (see `server_args.py`). The factory builds SGLang's own
UnifiedRadixCache (HiCache attached as usual) on the pure-Python TreeCore, as a subclass that
  * swaps the tree's eviction strategy for `RetentionEvictionStrategy` (retained nodes leave the device and
    the host tier last; the configured `--radix-eviction-policy` orders nodes inside each class),
  * dates node accesses in wall time (`AccessClock` marks before every match and insert) and flags reused
    prefixes after every match,
  * counts what each device eviction did (retained demoted / retained dropped / other) and logs the counters:
    `[sglang-ext] session retention: retained_tokens=... retained_demoted_tokens=... ...`,
  * on hybrid (Mamba / GDN) models, whose tree also holds one recurrent state per node (SGLang's MAMBA component,
    evicted from its own LRU list apart from the KV tokens), moves retained nodes to the recently used end of
    that list (device and host) before each eviction walk, so a session's states also leave last.
"""

from __future__ import annotations

import logging
import os
import time

from sglang_ext import compat, env
from sglang_ext.sessions.policy import (
    RetentionConfigError,
    RetentionEvictionStrategy,
    SessionRetentionPolicy,
    mark_reused,
    move_retained_to_mru,
    parse_retention_seconds,
)

BACKEND_NAME = "sglang_ext_session_retention"
LOG_PREFIX = "[sglang-ext] session retention:"
LOG_INTERVAL_S = 1.0  # at most one counters line per second unless a retained node left the device

logger = logging.getLogger(__name__)
_cache_class = None


def retention_seconds_from_env() -> float:
    return parse_retention_seconds(os.environ.get(env.SESSION_RETENTION_SECONDS, "0"))


def session_retention_cache_class():
    """The UnifiedRadixCache subclass, built on first use (SGLang's cache modules must not be imported while
    SGLang is still choosing its platform, which is when plugins load)."""
    global _cache_class
    if _cache_class is not None:
        return _cache_class

    class SessionRetentionRadixCache(compat.UnifiedRadixCache):
        retention: SessionRetentionPolicy | None = None

        def start_retention(self, seconds: float) -> None:
            self.retention = SessionRetentionPolicy(seconds)
            self.tree_core.eviction_strategy = RetentionEvictionStrategy(
                self.tree_core.eviction_strategy, self.retention, lambda: self.tree_core.root_node
            )
            self._last_log = 0.0
            self._logged = self.retention.stats.as_dict()

        def _mark_access(self) -> None:
            if self.retention is not None:
                self.retention.clock.mark(compat.get_and_increase_time_counter())

        def match_prefix(self, params):
            self._mark_access()
            result = super().match_prefix(params)
            if self.retention is not None:
                node = self.tree_core.node_by_id(result.best_match_node)
                mark_reused(node, self.tree_core.root_node)
            return result

        def insert(self, params):
            self._mark_access()
            return super().insert(params)

        def _evict_device_leaf(self, node_id, tracker):
            if self.retention is None:
                return super()._evict_device_leaf(node_id, tracker)
            node = self.tree_core.node_by_id(node_id)
            retained = self.retention.retained(node, self.tree_core.root_node)
            backed_up, num_tokens = node.backuped, len(node.key)
            backup_kv = super()._evict_device_leaf(node_id, tracker)
            stats = self.retention.stats
            if not retained:
                stats.other_evicted_tokens += num_tokens
            elif backed_up or backup_kv is not None:  # write_back: the walk backs it up, then demotes
                stats.retained_demoted_tokens += num_tokens
            else:
                stats.retained_dropped_tokens += num_tokens
            return backup_kv

        def _retain_side_states(self, host: bool) -> None:
            """Hybrid trees: retained nodes' recurrent states go to the recently used end of the MAMBA
            component's LRU list (device or host), which that component's eviction walk starts from the other
            end of."""
            if self.retention is None or compat.ComponentType.MAMBA not in self.tree_core.lru_lists:
                return
            lists = self.tree_core.host_lru_lists if host else self.tree_core.lru_lists
            root = self.tree_core.root_node
            move_retained_to_mru(lists[compat.ComponentType.MAMBA], lambda node: self.retention.retained(node, root))

        def evict_host(self, num_tokens, *args, **kwargs):
            self._mark_access()
            self._retain_side_states(host=True)
            return super().evict_host(num_tokens, *args, **kwargs)

        def _evict(self, params, *args, **kwargs):
            self._mark_access()
            self._retain_side_states(host=False)
            result = super()._evict(params, *args, **kwargs)
            if self.retention is not None:
                self.retention.stats.eviction_walks += 1
                self._maybe_log()
            return result

        def _maybe_log(self) -> None:
            counters = self.retention.stats.as_dict()
            retained_moved = any(
                counters[k] != self._logged[k] for k in ("retained_demoted_tokens", "retained_dropped_tokens")
            )
            now = time.monotonic()
            if not retained_moved and now - self._last_log < LOG_INTERVAL_S:
                return
            self._last_log, self._logged = now, counters
            retained = self.retention.retained_tokens(self.tree_core.root_node)
            logger.info("%s retained_tokens=%d %s", LOG_PREFIX, retained,
                        " ".join(f"{k}={v}" for k, v in counters.items()))

    for name in (compat.URC_EVICT_WALK, compat.URC_EVICT_DEVICE_LEAF, compat.URC_EVICT_HOST):
        if not callable(getattr(compat.UnifiedRadixCache, name, None)):
            raise RuntimeError(f"sglang internals changed: UnifiedRadixCache.{name} is gone")
    _cache_class = SessionRetentionRadixCache
    return _cache_class


def session_retention_cache_factory(ctx):
    """`RadixCacheFactory` for SGLang's registry: a TreeCacheBuildContext -> the retention cache."""
    seconds = retention_seconds_from_env()
    if seconds == 0:
        raise RetentionConfigError(
            f"--radix-cache-backend {BACKEND_NAME} is selected by --session-retention-seconds N (N > 0); "
            "pass that flag instead"
        )
    if ctx.disable_radix_cache:
        raise RetentionConfigError("--session-retention-seconds needs the radix cache (drop --disable-radix-cache)")
    if ctx.is_hybrid_swa or ctx.is_dsa:
        raise NotImplementedError(
            "--session-retention-seconds supports full-attention models and Mamba / linear-attention hybrids "
            "(this model has sliding-window or DSA layers)"
        )
    ctx.params.tree_core_backend = compat.TREE_CORE_BACKEND_PYTHON
    cache = compat.create_unified_radix_cache(ctx, cache_class=session_retention_cache_class())
    cache.start_retention(seconds)
    logger.info(
        "%s on: prefixes of sessions active in the last %g s are evicted last (host tier: %s)",
        LOG_PREFIX, seconds, "on" if cache.cache_controller is not None else "off",
    )
    return cache


def register_backend() -> None:
    if BACKEND_NAME not in compat.registered_radix_cache_backends():
        compat.register_radix_cache_backend(BACKEND_NAME, session_retention_cache_factory)
