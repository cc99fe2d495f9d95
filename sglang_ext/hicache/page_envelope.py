"""What a stored HiCache page looks like on disk (or in any storage backend), and its key. Pure: no SGLang.

A page is stored as a 64-byte header followed by the page's bytes:
  magic b"SGXP" | version u8 | 3 zero bytes | payload length u64 (little endian)
  | namespace digest (16) | key digest (16) | checksum (16)
The checksum is BLAKE2b-128 over namespace digest, key digest and payload, so a flipped byte anywhere, a
truncated file, a page of another KV format (other namespace) or a file copied under another key all fail
`open_envelope`, which the storage layer turns into a cache miss.

Keys: `storage_key(namespace, key)` is a hex digest of both, so the name a backend sees (a file name for the
file backend) never contains user text and two namespaces (KV formats, or dense dtype + host layout) never
share a key.
"""

from __future__ import annotations

import hashlib
import struct

import torch

MAGIC = b"SGXP"
VERSION = 1
_HEADER = struct.Struct("<4sB3sQ16s16s16s")
HEADER_BYTES = _HEADER.size  # 64


class PageIntegrityError(ValueError):
    """A stored page failed verification; the message says which check."""


def _digest(*parts: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(part)
    return h.digest()


def namespace_digest(namespace: str) -> bytes:
    return _digest(b"sglang-ext-hicache-namespace\0", namespace.encode())


def storage_key(namespace: str, key: str) -> str:
    """The key a backend stores a page under: 40 hex characters, from the namespace and SGLang's page key."""
    return hashlib.blake2b(namespace_digest(namespace) + key.encode(), digest_size=20).hexdigest()


def envelope_nbytes(payload_nbytes: int) -> int:
    return HEADER_BYTES + payload_nbytes


def seal(namespace: str, key: str, payload: torch.Tensor) -> torch.Tensor:
    """Header + payload as a new flat uint8 CPU tensor. payload: any contiguous-able tensor (its raw bytes)."""
    body = payload.detach().to("cpu").contiguous().view(torch.uint8).flatten()
    ns, kd = namespace_digest(namespace), _digest(key.encode())
    raw = body.numpy().tobytes()
    header = _HEADER.pack(MAGIC, VERSION, bytes(3), len(raw), ns, kd, _digest(ns, kd, raw))
    out = torch.empty(HEADER_BYTES + len(raw), dtype=torch.uint8)
    out[:HEADER_BYTES] = torch.frombuffer(bytearray(header), dtype=torch.uint8)
    out[HEADER_BYTES:] = body
    return out


def open_envelope(namespace: str, key: str, envelope: torch.Tensor, payload_nbytes: int) -> torch.Tensor:
    """The payload bytes (a uint8 view into `envelope`) after every check passes; PageIntegrityError otherwise."""
    data = envelope.view(torch.uint8).flatten()
    if data.numel() < HEADER_BYTES:
        raise PageIntegrityError(f"{data.numel()} bytes, shorter than the {HEADER_BYTES}-byte header")
    magic, version, reserved, length, ns, kd, checksum = _HEADER.unpack(data[:HEADER_BYTES].numpy().tobytes())
    if magic != MAGIC or version != VERSION or reserved != bytes(3):
        raise PageIntegrityError(f"not an sglang-ext page (magic {magic!r}, version {version}, reserved {reserved!r})")
    if length != payload_nbytes or data.numel() != HEADER_BYTES + payload_nbytes:
        raise PageIntegrityError(
            f"payload is {data.numel() - HEADER_BYTES} bytes (header says {length}), expected {payload_nbytes}"
        )
    if ns != namespace_digest(namespace):
        raise PageIntegrityError(f"page belongs to another KV format or layout, not {namespace!r}")
    if kd != _digest(key.encode()):
        raise PageIntegrityError("page was stored under another key")
    payload = data[HEADER_BYTES:]
    if _digest(ns, kd, payload.numpy().tobytes()) != checksum:
        raise PageIntegrityError("checksum mismatch")
    return payload
