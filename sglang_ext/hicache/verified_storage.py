"""Any HiCache storage backend on SGLang's generic page path, with format-keyed, checksummed pages.

`VerifiedPageStorage` wraps the backend SGLang created and is what the cache controller talks to:
  keys   every page key becomes `storage_key(namespace, key)`; the namespace names the page bytes (the
         compressed format and its geometry, or a dense pool's dtype and host layout), so servers with other
         formats never see each other's pages (upstream #33268 leaves the dtype out of keys).
  set    stores header + payload (`page_envelope.seal`).
  get    reads header + payload and verifies it; a short, unreadable or mismatching page is a miss: one
         warning line per read call naming the (first) key, the pages dropped when the backend can
         (`discard`, so the recomputed pages are stored again), and the caller recomputes them. A page that fails verification is never copied into the host pool.
The zero-copy (`batch_get_v1`/`batch_set_v1`) and multi-pool (`*_v2`) paths bypass page bytes in Python and
are not wrapped; `hooks.py` only wraps backends on the generic path.
"""

from __future__ import annotations

import logging

import torch

from sglang_ext import compat
from sglang_ext.hicache.page_envelope import PageIntegrityError, envelope_nbytes, open_envelope, seal, storage_key

logger = logging.getLogger(__name__)


class VerifiedPageStorage(compat.HiCacheStorage):
    def __init__(self, inner, namespace: str):
        self.inner = inner
        self.namespace = namespace
        self.rejected_pages = 0

    # -- registration passes through ------------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host):
        self.mem_pool_host = mem_pool_host
        self.inner.register_mem_pool_host(mem_pool_host)

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        self.inner.register_mem_host_pool_v2(host_pool, host_pool_name)

    def on_host_pools_registered(self) -> None:
        self.inner.on_host_pools_registered()

    # -- keys -----------------------------------------------------------------------------------------------

    def key_for(self, key: str) -> str:
        return storage_key(self.namespace, key)

    def _extra(self, extra_info):
        if extra_info is None or extra_info.prefix_keys is None:
            return extra_info
        return compat.HiCacheStorageExtraInfo(
            prefix_keys=[self.key_for(k) for k in extra_info.prefix_keys], extra_info=extra_info.extra_info
        )

    def exists(self, key: str) -> bool:
        return self.inner.exists(self.key_for(key))

    def batch_exists(self, keys, extra_info=None) -> int:
        return self.inner.batch_exists([self.key_for(k) for k in keys], self._extra(extra_info))

    # -- pages ----------------------------------------------------------------------------------------------

    def get(self, key, target_location=None, target_sizes=None):
        """Read the page stored under `key` into target_location (a flat page tensor); None = miss."""
        got, why = self._read(key, target_location)
        if why is not None:
            self._reject([(key, why)])
        return got

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        results, rejected = [], []
        for key, target in zip(keys, target_locations, strict=True):
            got, why = self._read(key, target)
            results.append(got)
            if why is not None:
                rejected.append((key, why))
        if rejected:
            self._reject(rejected)
        return results

    def _read(self, key, target_location):
        """(target_location filled, None) for a verified page, (None, None) for an absent one, (None, why) else."""
        target = target_location.view(-1)
        payload_nbytes = target.numel() * target.element_size()
        envelope = torch.empty(envelope_nbytes(payload_nbytes), dtype=torch.uint8)
        try:
            got = self.inner.get(self.key_for(key), envelope)
        except OSError as exc:  # e.g. HiCacheFile's short read of a truncated file
            return None, f"unreadable ({exc})"
        if got is None:
            return None, None
        try:
            payload = open_envelope(self.namespace, key, got, payload_nbytes)
        except PageIntegrityError as exc:
            return None, str(exc)
        target.view(torch.uint8).copy_(payload)
        return target_location, None

    def _reject(self, rejected: list[tuple[str, str]]) -> None:
        """One warning line per call (naming the first key), and drop the bad pages where the backend can."""
        self.rejected_pages += len(rejected)
        key, why = rejected[0]
        more = f" (and {len(rejected) - 1} more pages of this batch)" if len(rejected) > 1 else ""
        logger.warning(
            "sglang-ext HiCache storage: page %s rejected: %s%s; treated as a miss and recomputed", key, why, more
        )
        discard = getattr(self.inner, "discard", None)
        if discard is not None:
            for bad_key, _ in rejected:
                discard(self.key_for(bad_key))

    def set(self, key, value=None, target_location=None, target_sizes=None) -> bool:
        return self.inner.set(self.key_for(key), seal(self.namespace, key, value))

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None) -> bool:
        return all(self.set(key, value) for key, value in zip(keys, values, strict=True))

    # -- the rest ---------------------------------------------------------------------------------------------

    def clear(self):
        return self.inner.clear()

    def get_stats(self):
        return self.inner.get_stats()

    def close(self):
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()
