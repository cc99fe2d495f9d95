"""`--hicache-storage-backend file` with private files: SGLang's HiCacheFile, writing pages 0600.

Upstream writes pages through numpy `tofile` (mode 0666 minus umask, so usually world readable) into a
directory made with the default mode. KV pages are derived from users' prompts, so this subclass creates
the directory 0700 when it makes it, writes each page to a 0600 temporary file and renames it into place,
and can drop a page that failed verification (`discard`) so that the recomputed page is written again.
Keys reach it already hashed (`page_envelope.storage_key`), so no file name comes from user text.
"""

from __future__ import annotations

import logging
import os
import uuid

import torch

from sglang_ext import compat

logger = logging.getLogger(__name__)

FILE_MODE = 0o600
DIR_MODE = 0o700


class PrivateHiCacheFile(compat.HiCacheFile):
    def __init__(self, storage_config, file_path: str = "/tmp/hicache"):
        target = compat.hicache_file_storage_dir(storage_config, file_path)
        if not os.path.exists(target):
            os.makedirs(target, mode=DIR_MODE, exist_ok=True)
        super().__init__(storage_config, file_path)

    def _path(self, key: str) -> tuple[str, str]:
        suffixed = self._get_suffixed_key(key)
        return suffixed, os.path.join(self.file_path, f"{suffixed}.bin")

    def set(self, key, value=None, target_location=None, target_sizes=None) -> bool:
        suffixed, tensor_path = self._path(key)
        if self.exists(key):
            self._evictor.touch(suffixed, tensor_path)
            return True
        data = value.contiguous().view(dtype=torch.uint8).numpy()
        if not self._evictor.reserve(suffixed, data.nbytes, key=key):
            return False
        tmp_path = os.path.join(self.file_path, f".{uuid.uuid4().hex}.tmp")
        try:
            fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
            with os.fdopen(fd, "wb") as f:
                f.write(memoryview(data))
            os.replace(tmp_path, tensor_path)
        except OSError as exc:
            logger.error("sglang-ext HiCache file storage: writing page %s failed: %s", key, exc)
            self._evictor.abort(suffixed)
            if os.path.exists(tmp_path):
                os.remove(tmp_path)
            return False
        self._evictor.commit(suffixed)
        if self.metadata_cache is not None:
            self.metadata_cache.add(suffixed)
        return True

    def discard(self, key: str) -> None:
        """Remove the page stored under `key` (absent is fine)."""
        suffixed, tensor_path = self._path(key)
        try:
            os.remove(tensor_path)
        except FileNotFoundError:
            pass
        self._evictor.abort(suffixed)
        if self.metadata_cache is not None:
            self.metadata_cache.remove(suffixed)
