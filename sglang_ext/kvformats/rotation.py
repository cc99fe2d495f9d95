"""The octave block rotation: R = H64 / 8 · diag(signs), applied to each 64-dim block of a head.

H64 is the Sylvester Walsh-Hadamard matrix (entries +-1; H64 / 8 is orthonormal). The signs are a fixed +-1
vector per (tensor, block index), tensor 0 = K, 1 = V, defined by an integer hash (no RNG involved):

    idx  = tensor * 65536 + block * 256 + i          (i = dim inside the block, 0..63)
    h    = fmix32(idx ^ SIGN_SEED)                    (MurmurHash3's 32-bit finalizer)
    sign = -1 if h >> 31 else +1          (the top bit: the best mixed one)

Evaluation order (part of the format: the Triton store kernel reproduces it bit for bit in float32):
u = x * sign (exact); six identical "perfect shuffle" butterfly stages, each
out[k] = u[2k] + u[2k+1], out[k + 32] = u[2k] - u[2k+1] for k < 32 (their product is exactly H64);
then multiply by 0.125 (exact, a power of two).
"""

from __future__ import annotations

import functools

import torch

BLOCK = 64
SIGN_SEED = 0x6F637461  # ASCII "octa"
K_TENSOR, V_TENSOR = 0, 1
_M32 = 0xFFFFFFFF


def fmix32(h: int) -> int:
    h &= _M32
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M32
    h ^= h >> 16
    return h


def sign_value(tensor: int, block: int, i: int) -> float:
    return -1.0 if fmix32((tensor * 65536 + block * 256 + i) ^ SIGN_SEED) >> 31 else 1.0


@functools.cache
def _signs_cpu(tensor: int, num_blocks: int) -> torch.Tensor:
    vals = [[sign_value(tensor, b, i) for i in range(BLOCK)] for b in range(num_blocks)]
    return torch.tensor(vals, dtype=torch.float32)


def signs(tensor: int, num_blocks: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """+-1 float32 [num_blocks, 64] for K (tensor 0) or V (tensor 1)."""
    return _signs_cpu(tensor, num_blocks).to(device)


def hadamard_matrix(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Unnormalized Sylvester H64 (+-1), symmetric; H @ H = 64 I."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < BLOCK:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h.to(device=device, dtype=dtype)


def fwht64(u: torch.Tensor) -> torch.Tensor:
    """Unnormalized H64 along the last dim (size 64) in the format's fixed evaluation order."""
    assert u.shape[-1] == BLOCK
    for _ in range(6):
        pairs = u.reshape(*u.shape[:-1], BLOCK // 2, 2)
        a, b = pairs[..., 0], pairs[..., 1]
        u = torch.cat([a + b, a - b], dim=-1)
    return u


def rotate(x: torch.Tensor, tensor: int) -> torch.Tensor:
    """y = R x per 64-dim block. x [..., D] (D a multiple of 64) -> float32 [..., D]."""
    d = x.shape[-1]
    nb = d // BLOCK
    u = x.to(torch.float32).reshape(*x.shape[:-1], nb, BLOCK) * signs(tensor, nb, x.device)
    return (fwht64(u) * 0.125).reshape(*x.shape[:-1], d)


def unrotate(y: torch.Tensor, tensor: int) -> torch.Tensor:
    """x = R^T y per 64-dim block (R^T = diag(signs) H64 / 8). y [..., D] -> float32 [..., D]."""
    d = y.shape[-1]
    nb = d // BLOCK
    u = fwht64(y.to(torch.float32).reshape(*y.shape[:-1], nb, BLOCK)) * 0.125
    return (u * signs(tensor, nb, y.device)).reshape(*y.shape[:-1], d)
