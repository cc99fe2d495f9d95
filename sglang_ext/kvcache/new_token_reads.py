"""How an extend over a compressed KV pool attends to its own new tokens: `SGLANG_EXT_KV_EXTEND_NEW_TOKENS`.

"pool" (default): every extend stores its new tokens first and reads them back through the format, like the
cached prefix and like decode reads its current token, so every reader of a token's K/V reads the same bytes: a
radix, host or storage hit recomputes its last prompt token over the same values the uncached prefill used, and
the same prompt gives the same output whatever the cache held.
"full": a prefill chunk's new tokens attend to each other at full precision (as computed) and to the cached
prefix through the format, as SGLang's extend kernels do for its KV dtypes. Lower perplexity when most of a
prompt fits in one chunk, but a cache hit then reads values the uncached run never read, and its output can
differ (docs/kv-formats.md, "Extend: new tokens through the pool or at full precision").
Speculative target verify always reads its drafts from the pool (greedy output with speculation = without).

Read once per process (the scheduler inherits the launcher's environment); pure: no SGLang import.
"""

from __future__ import annotations

import os
from functools import lru_cache

from sglang_ext.env import KV_EXTEND_NEW_TOKENS

MODES = ("full", "pool")


@lru_cache(maxsize=1)
def extend_reads_pool() -> bool:
    """True when extends read their new tokens back from the pool; raises ValueError on an unknown value."""
    mode = os.environ.get(KV_EXTEND_NEW_TOKENS, "pool").strip().lower() or "pool"
    if mode not in MODES:
        raise ValueError(f"{KV_EXTEND_NEW_TOKENS}={mode!r}: expected one of {MODES}")
    return mode == "pool"
