"""Which radix-tree nodes session retention protects, and the eviction order it imposes (core: no sglang import).

A radix node is *retained* while both hold:
  * it was accessed (matched or inserted) in the last `retention_seconds` of wall-clock time, and
  * it belongs to a session: it was reused (a later request matched through it: the shared system prompt,
    turn k of a conversation once turn k+1 arrived), or it lies on the newest branch below a reused node
    (each node on the way up is its parent's most recently accessed child): the newest turn of a
    conversation, which no request has extended yet, prompt and generated tail alike.
One-off prompts are therefore not retained, and a conversation that stays idle longer than the window falls
back to the inner policy (LRU by default).

Eviction order: every non-retained node goes before any retained node; inside each class the inner policy
(SGLang's `--radix-eviction-policy`) decides. SGLang evicts device leaves in that order (demoting them to
the host tier when they are backed up there) and host leaves in the same order, so a retained prefix is
evicted from host only after everything not retained.

Nodes are duck-typed (SGLang's `UnifiedTreeNode`): `last_access_time` (SGLang's access counter, not seconds),
`parent`, `children` (dict), `key` (sized). The policy keeps its own per-node flag `_sglang_ext_reused`.
"""

from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

REUSED_ATTR = "_sglang_ext_reused"


class RetentionConfigError(ValueError):
    """A bad `--session-retention-seconds` value."""


def parse_retention_seconds(text: str | float) -> float:
    """`--session-retention-seconds` value: a finite number >= 0 (0 turns retention off)."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise RetentionConfigError(
            f"--session-retention-seconds must be a number of seconds >= 0 (0 = off), got {text!r}"
        ) from None
    if not math.isfinite(value) or value < 0:
        raise RetentionConfigError(
            f"--session-retention-seconds must be a finite number of seconds >= 0 (0 = off), got {text!r}"
        )
    return value


class AccessClock:
    """Maps SGLang's access counter (`last_access_time`, a float that grows by 1 per touch) to wall time.

    `mark(counter)` is called before each match/insert with a fresh counter value; a node whose
    `last_access_time` is c was touched no earlier than the wall time of the last mark with counter <= c.
    Marks older than the window are dropped except the newest of them, so memory stays bounded by the
    request rate times the window.
    """

    def __init__(self, window_seconds: float, now: Callable[[], float] = time.monotonic):
        self.window_seconds = window_seconds
        self.now = now
        self._counters: list[float] = []  # ascending
        self._times: list[float] = []  # wall time of each mark, ascending

    def mark(self, counter: float) -> None:
        if self._counters and counter < self._counters[-1]:
            raise ValueError(f"access counter went backwards: {counter} < {self._counters[-1]}")
        t = self.now()
        self._counters.append(counter)
        self._times.append(t)
        # Keep one mark older than the window: it dates every counter between it and the next mark.
        cut = bisect.bisect_left(self._times, t - self.window_seconds) - 1
        if cut > 0:
            del self._counters[:cut]
            del self._times[:cut]

    def wall_time(self, counter: float) -> float | None:
        """Wall time of the newest mark at or before `counter`; None if it predates every kept mark."""
        i = bisect.bisect_right(self._counters, counter) - 1
        return self._times[i] if i >= 0 else None

    def is_recent(self, counter: float, now: float | None = None) -> bool:
        t = self.wall_time(counter)
        if t is None:
            return False
        return t >= (self.now() if now is None else now) - self.window_seconds

    def __len__(self) -> int:
        return len(self._counters)


def mark_reused(node: Any, root: Any) -> int:
    """Flag `node` and its ancestors (up to, excluding, `root`) as reused; returns how many were newly flagged."""
    flagged = 0
    while node is not None and node is not root:
        if getattr(node, REUSED_ATTR, False):
            break  # ancestors of a reused node are reused already
        setattr(node, REUSED_ATTR, True)
        flagged += 1
        node = node.parent
    return flagged


def is_reused(node: Any) -> bool:
    return bool(getattr(node, REUSED_ATTR, False))


@dataclass
class RetentionStats:
    """Token counters of one radix cache, by what eviction did to retained and other nodes."""

    retained_demoted_tokens: int = 0  # retained, evicted from device with a host copy (HiCache)
    retained_dropped_tokens: int = 0  # retained, evicted from device with no copy anywhere
    other_evicted_tokens: int = 0  # not retained, evicted from device (demoted or dropped)
    eviction_walks: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class SessionRetentionPolicy:
    """Decides retention per node; owned by one radix cache (one scheduler process)."""

    retention_seconds: float
    clock: AccessClock = field(init=False)
    stats: RetentionStats = field(default_factory=RetentionStats)

    def __post_init__(self):
        self.retention_seconds = parse_retention_seconds(self.retention_seconds)
        if self.retention_seconds == 0:
            raise RetentionConfigError("session retention needs --session-retention-seconds > 0")
        self.clock = AccessClock(self.retention_seconds)

    def retained(self, node: Any, root: Any, now: float | None = None) -> bool:
        if node is None or node is root or not self.clock.is_recent(node.last_access_time, now):
            return False
        # Reused, or on the newest branch below a reused node: walk up while each node is its parent's
        # most recently accessed child (a turn can be several nodes: prompt, then the generated tail).
        while not is_reused(node):
            parent = node.parent
            if parent is None or parent is root:
                return False
            if max(parent.children.values(), key=lambda child: child.last_access_time) is not node:
                return False
            node = parent
        return True

    def retained_tokens(self, root: Any) -> int:
        """Tokens in retained nodes of the tree under `root` (walks the whole tree)."""
        now = self.clock.now()
        total, stack = 0, list(root.children.values())
        while stack:
            node = stack.pop()
            if self.retained(node, root, now):
                total += len(node.key)
            stack.extend(node.children.values())
        return total


class RetentionEvictionStrategy:
    """An eviction strategy (SGLang's `EvictionStrategy` protocol: `get_priority(node)`, smaller goes first)
    that puts retained nodes after all others and keeps the inner strategy's order inside each class."""

    def __init__(self, inner: Any, policy: SessionRetentionPolicy, root_of: Callable[[], Any]):
        self.inner = inner
        self.policy = policy
        self._root_of = root_of  # the tree's root can be replaced on reset

    def get_priority(self, node: Any) -> tuple:
        return (1 if self.policy.retained(node, self._root_of()) else 0, self.inner.get_priority(node))


def move_retained_to_mru(lru: Any, is_retained: Callable[[Any], bool]) -> int:
    """Reorder an LRU list whose eviction walk starts at its least recently used end (SGLang's per-component
    `UnifiedLRUList`: `cache` {node id: node}, `reset_node_mru(node)`) so that its retained nodes come after
    all others, in their own access order. Hybrid trees evict recurrent states through such a list (one state
    per node, apart from the KV tokens), so retention reorders it before each walk. Returns how many moved."""
    retained = sorted((node for node in list(lru.cache.values()) if is_retained(node)),
                      key=lambda node: node.last_access_time)
    for node in retained:  # oldest first: the newest retained node ends up most recently used
        lru.reset_node_mru(node)
    return len(retained)
