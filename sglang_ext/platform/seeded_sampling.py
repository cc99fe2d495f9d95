"""Per-request `sampling_seed` on the portable CPU platform: SGLang's MurmurHash3 in torch.

SGLang samples a request that carries a seed by Gumbel-max over `murmur_hash32(seed, position, token id)`
(`sampler.multinomial_with_seed`; the speculative verifiers draw their coins the same way). On a CPU device its
`murmur_hash32` calls sgl_kernel's CPU build, which a CUDA build of sgl_kernel (the one PyPI installs) does not
have, so every seeded request failed. This is the same hash, bit for bit, as SGLang's Triton kernel
(`sglang/kernels/ops/sampling/murmur_hash.py`): 32-bit MurmurHash3 over four 4-byte blocks (seed low, seed
high, position, column), then the finaliser with length 16. 32-bit products are formed from 16-bit halves in
int64, so nothing overflows.
"""

import torch

_MASK = 0xFFFFFFFF


def _mul32(a: torch.Tensor, c: int) -> torch.Tensor:
    """(a * c) mod 2**32 for a in [0, 2**32) (int64) and a 32-bit constant c."""
    return (a * (c & 0xFFFF) + (((a * (c >> 16)) & 0xFFFF) << 16)) & _MASK


def _rotl32(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) | (x >> (32 - r))) & _MASK


def _mix(h: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    k = _rotl32(_mul32(k, 0xCC9E2D51), 15)
    h = h ^ _mul32(k, 0x1B873593)
    return (_mul32(_rotl32(h, 13), 5) + 0xE6546B64) & _MASK


def _fmix(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def murmur_hash32(seed: torch.Tensor, positions: torch.Tensor, col_indices: torch.Tensor) -> torch.Tensor:
    """uint32 [n, m]: hash of (seed[i], positions[i], col_indices[j]); seed and positions [n], col_indices [m]."""
    if seed.shape != positions.shape or seed.dim() != 1 or col_indices.dim() != 1:
        raise ValueError(f"murmur_hash32 needs seed and positions of one shape (n,) and 1-D columns, got "
                         f"{tuple(seed.shape)}, {tuple(positions.shape)}, {tuple(col_indices.shape)}")
    s = seed.to(torch.int64)  # uint64 seeds keep their bits through int64
    low, high = (s & _MASK).view(-1, 1), ((s >> 32) & _MASK).view(-1, 1)
    pos = (positions.to(torch.int64) & _MASK).view(-1, 1)
    col = (col_indices.to(torch.int64) & _MASK).view(1, -1)
    h = _mix(_mix(_mix(torch.zeros_like(low), low), high), pos)  # [n, 1]: shared by the row's columns
    h = _mix(h.expand(-1, col.shape[1]), col.expand(h.shape[0], -1))
    return _fmix(h ^ 16).to(torch.uint32)
