"""HiCache with sglang-ext KV formats: a host tier that keeps the format's planes, and a storage tier whose
pages are keyed by format and verified by checksum on load. See docs/kv-formats.md (HiCache section).

  host_pool.py        CompressedMHAHostPool (SGLang HostKVCache subclass; moves in kernels/host_pages.py)
  buffer_info.py      how a compressed device pool describes itself to SGLang's host-pool assembly
  page_envelope.py    stored page = header + payload + checksum; hashed keys (pure, no SGLang)
  verified_storage.py wraps any generic-path storage backend with page_envelope
  file_storage.py     the file backend with 0600 files
  support.py          start-up refusals for HiCache options a compressed pool cannot serve
  hooks.py            the two SGLang entry points
"""


def register() -> list[str]:
    """Install the hooks in this process (called by `sglang_ext.plugin` in every SGLang process)."""
    from sglang_ext.hicache import hooks

    return hooks.register()
